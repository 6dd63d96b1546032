#!/usr/bin/env bash
# The JSON-lines mode rebuilds a sequence whose kvstore session was lost,
# as the HTTP service does: both go through the one scheduler (label
# "slow": a ~1.3K-token prompt, long enough to be indexed and uploaded).
# ri-worker reads requests on a pipe, every step reading two-sided
# (RI_WORKER_DIRECT=false) so that the decode notices a dead kvstore at
# once.  The first request (retroinfer-remote, 48 tokens) gives the
# reference text; while the same request decodes (the kvstore's
# ri_kvs_fetches_total moves), the kvstore is killed (-9) and restarted
# empty on the same port.  The reply must be ok with all 48 tokens, say
# "rebuilt", and hold the reference's greedy text.
# "test_worker_lines_rebuild.sh WORKER" runs another ri-worker binary
# (ri-worker-mutant-rebuild, whose rebuild forgets the prompt, must fail).
# Skips (77) without the installed model.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kvs_up.sh"
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
worker="${1:-$RI_BUILD_DIR/bin/ri-worker}"
[ -x "$worker" ] || { echo "skip: $worker not built"; exit 77; }
KVS_MEMORY=1GiB kvs_up
addr="$KVS_GRPC"

python3 - >"$KVS_DIR/prompt.txt" <<'PY'
f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
print("There is an important info hidden inside a lot of irrelevant text." + f * 27 +
      " The pass key is 52817. Remember it." + f * 27 + " Repeat the pass key many times:", end="")
PY
req() { printf '{"id": %s, "prompt_file": "%s", "max_tokens": 48, "attn": "retroinfer-remote"}\n' \
  "$1" "$KVS_DIR/prompt.txt"; }

mkfifo "$KVS_DIR/in"
RI_WORKER_DIRECT=false "$worker" --kvstore "$addr" --timeout-ms 2000 <"$KVS_DIR/in" >"$KVS_DIR/out" \
  2>"$KVS_DIR/err" &
wpid=$!
exec 3>"$KVS_DIR/in"
cleanup() { exec 3>&- 2>/dev/null || true; kill "$wpid" 2>/dev/null || true; wait "$wpid" 2>/dev/null || true
            kvs_down; }
trap cleanup EXIT
wait_reply() {  # wait until the output has $1 lines
  for _ in $(seq 1 3000); do
    [ "$(wc -l <"$KVS_DIR/out")" -ge "$1" ] && return 0
    kill -0 "$wpid" 2>/dev/null || { echo "ri-worker died"; cat "$KVS_DIR/err"; return 1; }
    sleep 0.1
  done
  echo "no reply within 300 s"; cat "$KVS_DIR/err"; return 1
}
metrics="$(sed -n 's/^metrics=//p' "$KVS_DIR/ports")"
fetches() {  # the kvstore's ri_kvs_fetches_total (all label sets); with an argument, wait until above it
  python3 - "$metrics" "$KVS_DIR/out" "${1:--1}" <<'PY'
import re, sys, time, urllib.request
url, out, above = "http://%s/metrics" % sys.argv[1], sys.argv[2], int(sys.argv[3])
def total():
    m = urllib.request.urlopen(url, timeout=5).read().decode()
    return int(sum(float(v) for v in re.findall(r"^ri_kvs_fetches_total(?:\{[^}]*\})? (\S+)$", m, re.M)))
for _ in range(30000):
    n = total()
    if n > above:
        print(n)
        sys.exit(0)
    if len(open(out).read().splitlines()) >= 2:
        print("FAIL: request 2 ended before the kill", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.002)
sys.exit(1)
PY
}

req 1 >&3; wait_reply 1
f0="$(fetches)"
[ "$f0" -gt 0 ] || { echo "FAIL: the reference request fetched nothing two-sided ($f0)"; exit 1; }
req 2 >&3
fetches "$f0" >/dev/null  # request 2 decodes (its first fetches): kill, and restart empty
kill -KILL "$KVS_PID"; wait "$KVS_PID" 2>/dev/null || true; KVS_PID=
kvs_up "$addr"
[ "$KVS_GRPC" = "$addr" ]
wait_reply 2
python3 - "$KVS_DIR/out" <<'PY'
import json, sys
ref, r = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()[:2]]
a, b = ref["runs"][0], r.get("runs", [{}])[0]
print("reference: %r" % a.get("text"))
print("killed:    ok %s, rebuilt %s, %s tokens, %r" % (r.get("ok"), r.get("rebuilt"), b.get("tokens"), b.get("text")))
ok = ref["ok"] and r.get("ok") and r.get("rebuilt", 0) >= 1 and b.get("tokens") == 48
if a["text"] != b.get("text"):
    print("FAIL: the rebuilt sequence's text differs from the one without the kill")
    ok = False
sys.exit(0 if ok else 1)
PY
grep -q "sequence rebuilt from its" "$KVS_DIR/err" || { echo "no rebuild in the worker's log"; exit 1; }
echo "ri-worker JSON-lines mode: a sequence whose kvstore session was lost was rebuilt from its tokens and finished"
