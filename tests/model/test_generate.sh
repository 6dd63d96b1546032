#!/bin/sh
# ri-generate end to end: greedy output for a fixed chat prompt is coherent
# English, identical across runs and thread counts, for full and retroinfer
# attention; on a long (indexed) prompt retroinfer gives full attention's
# answer exactly; --dump-kv writes a capture that ri-bench-attn-accuracy reads.
# Skipped (77) without the model.
# "test_generate.sh mutant-no-index" turns on a mutation for the long-prompt
# check (an update size so large that nothing is ever indexed: retroinfer
# silently decodes densely): the script must then fail, and CTest runs it that
# way to prove the check can fail.
set -u
mutant_env=""
if [ "${1:-}" = "mutant-no-index" ]; then
  echo "mutation on: retroinfer never indexes (this run must fail)"
  mutant_env="RI_GEN_UPDATE_TOKENS=1000000"
fi
bin="$RI_BUILD_DIR/bin"
gen="$bin/ri-generate"
model="${RI_TEST_MODEL:-${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prompt="What is the capital of France? Answer in one sentence."
[ -n "$mutant_env" ] || {
run() { "$gen" --model "$model" --chat --prompt "$prompt" --max-tokens 24 --stats=false "$@"; }
RI_THREADS=1 run --attn full > "$tmp/a" || exit 1
RI_THREADS=2 run --attn full > "$tmp/b" || exit 1
run --attn full > "$tmp/c" || exit 1
run --attn retroinfer > "$tmp/d" || exit 1
echo "full, 1 thread:  $(cat "$tmp/a")"
echo "full, 2 threads: $(cat "$tmp/b")"
echo "retroinfer:      $(cat "$tmp/d")"
cmp -s "$tmp/a" "$tmp/b" || { echo "FAIL: output differs between 1 and 2 threads"; exit 1; }
cmp -s "$tmp/b" "$tmp/c" || { echo "FAIL: output differs between two runs"; exit 1; }
cmp -s "$tmp/a" "$tmp/d" || { echo "FAIL: retroinfer differs from full on a short prompt (decodes densely)"; exit 1; }
grep -q "Paris" "$tmp/a" || { echo "FAIL: the answer does not mention Paris"; exit 1; }
}
# retroinfer on a prompt long enough to be indexed (the short prompt above
# stays under the indexing threshold of ~1,092 tokens and decodes densely):
# distinct numbered sentences with one fact, then the question.
n_sent="${RI_TEST_LONG_SENTENCES:-110}"
{
  i=1
  while [ "$i" -le "$n_sent" ]; do
    echo "Note $i: the archive room on floor $((i % 7 + 1)) keeps box $((i * 37 % 1000)) next to the window."
    [ "$i" -eq $((n_sent / 2)) ] && echo "Remember this: the secret colour is turquoise."
    i=$((i + 1))
  done
  echo "Question: what is the secret colour? Answer with one word."
} > "$tmp/long.txt"
env $mutant_env "$gen" --model "$model" --chat --prompt-file "$tmp/long.txt" --max-tokens 12 --attn retroinfer \
  > "$tmp/long.out" 2> "$tmp/long.err" || { cat "$tmp/long.err"; exit 1; }
echo "retroinfer, long: $(cat "$tmp/long.out")"
ptok=$(sed -n 's/.*prefill: \([0-9]*\) tokens.*/\1/p' "$tmp/long.err")
[ -n "$ptok" ] && [ "$ptok" -ge 1100 ] || { echo "FAIL: long prompt has ${ptok:-?} tokens, too few to index"; exit 1; }
grep -q "index build:" "$tmp/long.err" || { echo "FAIL: retroinfer built no index on a $ptok-token prompt"; cat "$tmp/long.err"; exit 1; }
# ... and decode used it: a small share of the context attended exactly
# (sinks + window + ~1.8% retrieved; dense would be 100%).
share=$(sed -n 's/.*exact attention: .* tokens per step, \([0-9]*\)\..*% of the context.*/\1/p' "$tmp/long.err")
echo "retroinfer, long: ${share:-?}% of the context attended exactly per step"
[ -n "$share" ] && [ "$share" -lt 25 ] || { echo "FAIL: retroinfer attended ${share:-?}% exactly: not sparse"; exit 1; }
[ -z "$mutant_env" ] || { echo "FAIL: the mutation was not caught"; exit 1; }
# ... and answered what full attention answers, word for word (the fact sits
# mid-prompt, outside the sinks and the window: only retrieval finds it).
"$gen" --model "$model" --chat --prompt-file "$tmp/long.txt" --max-tokens 12 --attn full --stats=false \
  > "$tmp/long.full" || exit 1
echo "full, long:       $(cat "$tmp/long.full")"
grep -q "turquoise" "$tmp/long.full" || { echo "FAIL: full attention does not find the secret colour"; exit 1; }
cmp -s "$tmp/long.full" "$tmp/long.out" || { echo "FAIL: retroinfer's long answer differs from full attention's"; exit 1; }
# English words, not token soup: mostly letters and spaces
letters=$(tr -cd 'A-Za-z ' < "$tmp/a" | wc -c)
total=$(wc -c < "$tmp/a")
[ $((letters * 10)) -ge $((total * 8)) ] || { echo "FAIL: output is not mostly words"; exit 1; }
# a bad flag and a bad model are clear errors, not crashes
"$gen" --model /nonexistent.gguf --prompt x > "$tmp/e" 2>&1 && { echo "FAIL: missing model accepted"; exit 1; }
grep -q "cannot" "$tmp/e" || { echo "FAIL: no message for a missing model"; cat "$tmp/e"; exit 1; }
head -c 4096 /dev/urandom > "$tmp/bad.gguf"
"$gen" --model "$tmp/bad.gguf" --prompt x > "$tmp/f" 2>&1 && { echo "FAIL: garbage model accepted"; exit 1; }
grep -q "gguf" "$tmp/f" || { echo "FAIL: no message for a garbage model"; cat "$tmp/f"; exit 1; }
"$gen" --attn nope --prompt x > "$tmp/g" 2>&1 && { echo "FAIL: unknown --attn accepted"; exit 1; }
# KV capture and the accuracy harness on it
run --attn full --max-tokens 8 --dump-kv "$tmp/kv" > /dev/null || exit 1
[ -f "$tmp/kv/meta.json" ] && [ -f "$tmp/kv/layer-000.rikv" ] || { echo "FAIL: no KV capture"; exit 1; }
if [ -x "$bin/ri-bench-attn-accuracy" ]; then
  "$bin/ri-bench-attn-accuracy" --kv "$tmp/kv" --json "$tmp/acc.json" > "$tmp/acc.txt" || { cat "$tmp/acc.txt"; exit 1; }
  grep -q '"method"' "$tmp/acc.json" || { echo "FAIL: accuracy JSON has no rows"; exit 1; }
fi
echo "ok"
