#!/usr/bin/env bash
# ri-worker killed with -9 in the middle of a streamed completion leaves its
# kvstore session behind; with --session-lease-ms=2000 the daemon drops it
# within about two lease periods (its UCX keepalive notices the dead
# process, then the lease runs out) and ri_kvs_sessions_expired_total counts
# it.  Against the daemon before leases the session was still listed 10 s
# after the kill (ri_kvs_sessions stayed 1; the daemon had no such setting,
# so that run started it without the flag).  Skips (77) without the model.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kvs_up.sh"
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
[ -x "$RI_BUILD_DIR/bin/ri-worker" ] || { echo "skip: ri-worker not built"; exit 77; }
KVS_EXTRA="${KVS_LEASE_FLAG---session-lease-ms=2000}" KVS_MEMORY=512MiB kvs_up
metrics_addr="$(sed -n 's/^metrics=//p' "$KVS_DIR/ports")"

"$RI_BUILD_DIR/bin/ri-worker" --listen 127.0.0.1:0 --port-file "$KVS_DIR/wports" --kvstore "$KVS_GRPC" \
  --timeout-ms 2000 >"$KVS_DIR/worker.log" 2>&1 &
wpid=$!
cleanup() { kill -KILL "$wpid" 2>/dev/null || true; wait "$wpid" 2>/dev/null || true; kvs_down; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  [ -s "$KVS_DIR/wports" ] && break
  kill -0 "$wpid" 2>/dev/null || { cat "$KVS_DIR/worker.log"; exit 1; }
  sleep 0.1
done
http="$(sed -n 's/^http=//p' "$KVS_DIR/wports")"
[ -n "$http" ] || { echo "no http address"; cat "$KVS_DIR/worker.log"; exit 1; }

metric() {
  python3 - "$metrics_addr" "$1" <<'PY'
import re, sys, urllib.request
m = urllib.request.urlopen("http://%s/metrics" % sys.argv[1], timeout=10).read().decode()
g = re.search(r"^%s (\S+)$" % re.escape(sys.argv[2]), m, re.M)
print(int(float(g.group(1))) if g else -1)
PY
}

# Stream a completion; after 4 tokens touch a file and keep reading (the
# worker dies under it).
python3 - "$http" "$KVS_DIR" <<'PY' >/dev/null 2>&1 &
import json, os, sys, urllib.request
http, d = sys.argv[1], sys.argv[2]
f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
prompt = "Some text to remember." + f * 12 + " Now count to one hundred:"
mid = json.load(urllib.request.urlopen("http://%s/v1/models" % http, timeout=30))["data"][0]["id"]
body = json.dumps({"model": mid, "prompt": prompt, "max_tokens": 2000, "temperature": 0,
                   "stream": True, "attn": "retroinfer-remote"}).encode()
req = urllib.request.Request("http://%s/v1/completions" % http, body, {"Content-Type": "application/json"})
n = 0
with urllib.request.urlopen(req, timeout=600) as r:
    for raw in r:
        if raw.decode().startswith("data: {"):
            n += 1
            if n == 4:
                open(d + "/streaming", "w").close()
PY
cpid=$!
for _ in $(seq 1 3000); do
  [ -e "$KVS_DIR/streaming" ] && break
  kill -0 "$cpid" 2>/dev/null || break
  sleep 0.1
done
[ -e "$KVS_DIR/streaming" ] || { echo "the stream never started"; tail -30 "$KVS_DIR/worker.log"; exit 1; }
before="$(metric ri_kvs_sessions)"
[ "$before" -ge 1 ] || { echo "no kvstore session while streaming ($before)"; exit 1; }
kill -KILL "$wpid"; wait "$wpid" 2>/dev/null || true
t0=$(date +%s%N)
left="$before"
while [ $(( $(date +%s%N) - t0 )) -lt 10000000000 ]; do   # up to 10 s = 5 lease periods
  left="$(metric ri_kvs_sessions)"
  [ "$left" -eq 0 ] && break
  sleep 0.1
done
took="$(python3 -c "print('%.1f' % (($(date +%s%N) - $t0) / 1e9))")"
expired="$(metric ri_kvs_sessions_expired_total)"
echo "ri-worker killed with $before session(s) open: $left left after ${took} s, expired_total $expired"
[ "$left" -eq 0 ] || { tail -20 "$KVS_DIR/kvstore.log"; exit 1; }
[ "$expired" -ge "$before" ] || exit 1
python3 -c "import sys; sys.exit(0 if $took <= 6.0 else 1)" || { echo "took longer than 3 lease periods"; exit 1; }
kill "$cpid" 2>/dev/null || true
wait "$cpid" 2>/dev/null || true
