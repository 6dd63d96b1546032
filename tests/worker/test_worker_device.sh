#!/usr/bin/env bash
# ri-worker --device cuda: which attention it decodes with.  Another backend
# (quest) is refused before any device is opened: exit 2 and a message that
# names what the device takes.  full and retroinfer are taken: without a GPU
# (or in a build without CUDA) the worker then refuses cleanly, exit 2 with a
# message naming the missing device and nothing about the attention; with a
# GPU it answers the request on the device (reply ok, device "cuda").
# retroinfer-remote is taken with --kvstore (a real ri-kvstore on loopback;
# refused the same clean way without a GPU) and refused without one (exit
# 2, "needs --kvstore").  A build without CUDA refuses every case the same
# clean way (exit 2, "built without CUDA").  Skips (77) without the
# installed model.
set -euo pipefail
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
w="$RI_BUILD_DIR/bin/ri-worker"
[ -x "$w" ] || { echo "skip: ri-worker not built"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
req='{"id": 1, "prompt": "The capital of France is", "max_tokens": 3}'

run() {  # attn [more flags] -> $rc, stdout in $tmp/out, stderr in $tmp/err
  rc=0
  echo "$req" | timeout 300 "$w" --model "$model" --device cuda --attn "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  echo "--attn $*: exit $rc" >&2
  cat "$tmp/err" >&2
}

# A build without CUDA refuses --device cuda before it looks at the
# attention: every case is then that clean refusal (exit 2, the message).
nocuda=0
run quest
[ "$rc" -eq 2 ]
if grep -q -- "--device cuda: this program was built without CUDA" "$tmp/err"; then
  nocuda=1
else
  grep -q "attn quest does not run on the device" "$tmp/err"
  grep -q "retroinfer" "$tmp/err"
fi

run retroinfer-remote
[ "$rc" -eq 2 ]
if [ "$nocuda" -eq 1 ]; then
  grep -q -- "built without CUDA" "$tmp/err"
else
  grep -q "attn retroinfer-remote needs --kvstore" "$tmp/err"
fi

. "$(dirname "$0")/kvs_up.sh"
trap 'kvs_down; rm -rf "$tmp"' EXIT
kvs_up

for attn in full retroinfer retroinfer-remote; do
  if [ "$attn" = retroinfer-remote ]; then run "$attn" --kvstore "$KVS_GRPC"; else run "$attn"; fi
  if [ "$rc" -eq 0 ]; then  # a GPU: the request decoded there
    python3 - "$tmp/out" "$attn" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[0])
print(json.dumps(r)[:400])
run = r["runs"][0]
assert r["ok"] and run["device"] == "cuda" and run["attn"] == sys.argv[2], r
PY
  else
    [ "$rc" -eq 2 ]
    grep -Eq -- "--device cuda: .*(no usable CUDA device|built without CUDA)" "$tmp/err"
    ! grep -q "does not run" "$tmp/err"
    [ ! -s "$tmp/out" ]
  fi
done
echo "ok"
