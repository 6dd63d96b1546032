#!/usr/bin/env bash
# One real-prose K/V dump for the accuracy replays (budget_curve.sh,
# cluster_size.sh): this repository's own docs/ (English prose, nothing
# fetched), cut to about CTX tokens, with a question at the end; `ri generate
# --dump-kv` prefills it with exact attention (SmolLM2, chat template) and
# captures every layer's K/V and 32 greedy decode steps' queries.
#
#   bench/attn-accuracy/prose_kv.sh BIN_DIR CTX KV_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$1" ctx="$2" kv="$3"
text="$(mktemp "${TMPDIR:-/tmp}/ri-prose-XXXXXX")"
trap 'rm -f "$text" "$text.prompt"' EXIT
cat "$root"/docs/architecture.md "$root"/docs/kvstore.md "$root"/docs/worker.md "$root"/docs/model.md \
    "$root"/docs/kernels.md "$root"/docs/spill.md "$root"/docs/deploy.md >"$text"
# ~3.4 characters a token for the first 8K characters of this text, ~2.9
# further on (more code and tables): stay under the context asked for
if [ "$ctx" -le 4096 ]; then chars=$(( ctx * 34 / 10 )); else chars=$(( ctx * 29 / 10 )); fi
{ head -c "$chars" "$text"
  printf '\n\nIn two sentences: what does the kvstore keep, and what does the worker keep?'
} >"$text.prompt"
"$bin/ri-generate" --prompt-file "$text.prompt" --chat --max-tokens 32 --temperature 0 \
  --dump-kv "$kv" --no-stream >/dev/null
