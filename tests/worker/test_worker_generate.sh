#!/usr/bin/env bash
# ri-worker with the real model and a real ri-kvstore (label "slow": three
# ~1.3K-token prefills).  One worker process, requests on a pipe:
#  1. a passkey prompt answered with full attention and with retroinfer
#     through the kvstore: both replies ok, both answers hold the key;
#  2. the daemon is killed with SIGKILL: the next request fails cleanly
#     ({"ok": false}) and the worker stays alive;
#  3. the daemon is restarted on the same address: the next request succeeds
#     and the remote answer holds the key again;
#  4. --dense-below: a retroinfer-remote request whose prompt + max_tokens is
#     under it runs with full attention in the worker (the same text as the
#     full run, no remote figures); a longer one stays remote.
# Skips (77) without the installed model.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kvs_up.sh"
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
[ -x "$RI_BUILD_DIR/bin/ri-worker" ] || { echo "skip: ri-worker not built"; exit 77; }
KVS_MEMORY=1GiB kvs_up
addr="$KVS_GRPC"

key=52817
python3 - "$key" >"$KVS_DIR/prompt.txt" <<'PY'
import sys
key = sys.argv[1]
f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
print("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it." + f * 27 +
      f" The pass key is {key}. Remember it. {key} is the pass key." + f * 27 +
      " What is the pass key? The pass key is", end="")
PY
req() { printf '{"id": %s, "prompt_file": "%s", "max_tokens": 6, "attn": "full", "compare_attn": "retroinfer-remote"}\n' \
  "$1" "$KVS_DIR/prompt.txt"; }

mkfifo "$KVS_DIR/in"
dense_below=1400  # over the ~1.3K-token prompt + 6, under it + 120
"$RI_BUILD_DIR/bin/ri-worker" --kvstore "$addr" --timeout-ms 3000 --dense-below "$dense_below" <"$KVS_DIR/in" >"$KVS_DIR/out" 2>"$KVS_DIR/err" &
wpid=$!
exec 3>"$KVS_DIR/in"
wait_reply() {  # wait until the output has $1 lines
  for _ in $(seq 1 3000); do
    [ "$(wc -l <"$KVS_DIR/out")" -ge "$1" ] && return 0
    kill -0 "$wpid" 2>/dev/null || { echo "ri-worker died"; cat "$KVS_DIR/err"; return 1; }
    sleep 0.1
  done
  echo "no reply within 300 s"; cat "$KVS_DIR/err"; return 1
}
check() {  # line N, python condition on r
  sed -n "${1}p" "$KVS_DIR/out" | cut -c1-200 >&2
  python3 -c "import json,sys; r=json.loads(open('$KVS_DIR/out').read().splitlines()[$1-1]); print(json.dumps(r)[:600]); sys.exit(0 if ($2) else 1)"
}

req 1 >&3; wait_reply 1
check 1 "r['ok'] and '$key' in r['runs'][0]['text'] and r['runs'][1]['attn'] == 'retroinfer-remote' and '$key' in r['runs'][1]['text'] and r['runs'][1]['direct_clusters'] + r['runs'][1]['cache_hits'] + r['runs'][1]['cache_misses'] > 0"

kill -KILL "$KVS_PID"; wait "$KVS_PID" 2>/dev/null || true; KVS_PID=
req 2 >&3; wait_reply 2
check 2 "not r['ok'] and 'retroinfer-remote' in r['error']"
kill -0 "$wpid"   # still alive

port_flag="$addr"
kvs_up "$port_flag"
[ "$KVS_GRPC" = "$addr" ]
sleep 2           # let the worker's gRPC channel leave its reconnect back-off
req 3 >&3; wait_reply 3
check 3 "r['ok'] and r['runs'][1]['decode_steps'] >= 1 and '$key' in r['runs'][1]['text']"

# 4. dense below the break-even: the same text as request 3's full run, and
# none of the remote backend's figures; a request that reaches past the
# threshold keeps the backend it asked for.
one() { printf '{"id": %s, "prompt_file": "%s", "max_tokens": %s, "attn": "retroinfer-remote"}\n' \
  "$1" "$KVS_DIR/prompt.txt" "$2"; }
run3="json.loads(open('$KVS_DIR/out').read().splitlines()[2])['runs'][0]"
one 4 6 >&3; wait_reply 4
check 4 "r['ok'] and r['prompt_tokens'] + 6 < $dense_below and r['runs'][0]['attn'] == 'full' and 'direct_clusters' not in r['runs'][0] and r['runs'][0]['text'] == $run3['text']"
one 5 120 >&3; wait_reply 5
check 5 "r['ok'] and r['prompt_tokens'] + 120 >= $dense_below and r['runs'][0]['attn'] == 'retroinfer-remote' and r['runs'][0]['direct_clusters'] + r['runs'][0]['cache_hits'] + r['runs'][0]['cache_misses'] > 0"

exec 3>&-
# request 2 failed (kvstore gone), so the worker's exit status says 1
wrc=0; wait "$wpid" || wrc=$?
[ "$wrc" = 1 ] || { echo "ri-worker exited $wrc after a failed request, wanted 1"; cat "$KVS_DIR/err"; exit 1; }
echo "ri-worker: served, survived kill -9 of the kvstore, served again"
