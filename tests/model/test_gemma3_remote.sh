#!/usr/bin/env bash
# Gemma 3 270M through a real ri-kvstore (label "slow": one ~2K-token
# prefill).  One ri-worker request answers a passkey prompt with full
# attention and with retroinfer-remote from the same prefill:
#  - both replies hold the key (the kvstore path works for 1 KV head, d = 256);
#  - the remote run fetched clusters from the kvstore;
#  - it uploaded the K/V of the 3 global layers only, not of the 15
#    sliding-window layers (those keep their exact 512-token window in the
#    worker): uploaded bytes <= 1.1 x 3 layers x tokens x 1 KiB of K+V.
#    Clusters travel in pages sized to them (gw_remote_page_tokens: 1 token
#    at the auto size), so nothing but the K/V travels; all 18 layers would
#    be 6x.
# Then the same prompt through ri-generate with in-process retroinfer: the
# key again, and the global layers attend under 25% of the context exactly
# (an index was built and used).  "test_gemma3_remote.sh mutant-no-index"
# sets an update size so large that nothing is indexed: that check must fail.
# Skips (77) without the Gemma model file or the programs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mutant_env=""
if [ "${1:-}" = "mutant-no-index" ]; then
  echo "mutation on: retroinfer never indexes (this run must fail)"
  mutant_env="RI_GEN_UPDATE_TOKENS=1000000"
fi
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/gemma-3-270m-q4_k_m.gguf"
[ -f "$model" ] || { echo "skip: no Gemma 3 model at $model (deps/setup.d/11-model-gemma3.sh)"; exit 77; }
[ -x "$RI_BUILD_DIR/bin/ri-worker" ] || { echo "skip: ri-worker not built"; exit 77; }
. "$here/../worker/kvs_up.sh"
KVS_MEMORY=1GiB kvs_up

key=52817
python3 - "$key" >"$KVS_DIR/prompt.txt" <<'PY'
import sys
key = sys.argv[1]
f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
print("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it." + f * 40 +
      f" The pass key is {key}. Remember it. {key} is the pass key." + f * 40 +
      " What is the pass key? The pass key is", end="")
PY
printf '{"id": 1, "prompt_file": "%s", "max_tokens": 6, "attn": "full", "compare_attn": "retroinfer-remote"}\n' \
  "$KVS_DIR/prompt.txt" |
  timeout 600 "$RI_BUILD_DIR/bin/ri-worker" --model "$model" --kvstore "$KVS_GRPC" --timeout-ms 3000 \
    >"$KVS_DIR/out" 2>"$KVS_DIR/err" || { echo "FAIL: ri-worker"; cat "$KVS_DIR/err"; exit 1; }
cut -c1-600 "$KVS_DIR/out"
python3 - "$KVS_DIR/out" "$key" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[0])
key = sys.argv[2]
assert r["ok"], r
full, remote = r["runs"]
n = r["prompt_tokens"]
assert n > 1500, n   # past RetroInfer's indexing threshold (1,092 tokens)
assert remote["attn"] == "retroinfer-remote"
assert key in full["text"], "full attention missed the key: %r" % full["text"]
assert key in remote["text"], "retroinfer-remote missed the key: %r" % remote["text"]
# retrieved clusters came from the kvstore: read in place from its region
# (same host) or fetched two-sided
assert remote["direct_clusters"] + remote["cache_hits"] + remote["cache_misses"] > 0, \
    "no cluster read from the kvstore"
limit = 1.1 * 3 * n * 1024
assert 0 < remote["uploaded_bytes"] <= limit, \
    "uploaded %d bytes for %d tokens: more than the 3 global layers (limit %d)" % (remote["uploaded_bytes"], n, limit)
print("ok: key found by both; %d bytes uploaded for %d tokens (3 global layers: %d)" %
      (remote["uploaded_bytes"], n, 3 * n * 1024))
PY

env $mutant_env "$RI_BUILD_DIR/bin/ri-generate" --model "$model" --attn retroinfer --max-tokens 8 \
  --prompt-file "$KVS_DIR/prompt.txt" >"$KVS_DIR/gen" 2>"$KVS_DIR/gen.err" || { cat "$KVS_DIR/gen.err"; exit 1; }
echo "retroinfer in-process: $(cat "$KVS_DIR/gen")"
grep "exact attention" "$KVS_DIR/gen.err"
grep -q "$key" "$KVS_DIR/gen" || { echo "FAIL: in-process retroinfer missed the key"; exit 1; }
share=$(sed -n 's/.*tokens per step, \([0-9.]*\)% of the context.*/\1/p' "$KVS_DIR/gen.err")
python3 -c "import sys; sys.exit(0 if float('$share') < 25 else 1)" ||
  { echo "FAIL: not sparse: global layers attended $share% of the context exactly"; exit 1; }

