#!/usr/bin/env bash
# Accuracy against budget on real prose: the curve that chose the retrieval
# floor (KN_WAVE_RETRIEVAL_MIN_TOKENS) and compares the fixed budget with the
# output-aware per-head cut at equal bytes.
#
#   bench/attn-accuracy/budget_curve.sh [OUTDIR] (default docs/img)
#
# 1. The prompt is this repository's own docs/ (English prose, nothing
#    fetched), cut to each context, with a question at the end; `ri generate
#    --dump-kv` prefills it with exact attention and captures every layer's
#    K/V and 32 decode steps' queries (SmolLM2, greedy).
# 2. `ri-bench-attn-accuracy` replays the queries with each budget: the floor
#    swept over FLOORS, then the per-head cut over TAUS at the default floor.
#    quest / streaming / oracle get retroinfer's exact tokens of each step.
# Writes OUTDIR/budget-<ctx>-min<T>.json and budget-<ctx>-tau<X>.json.
# Environment: RI_BUILD_DIR (build), CONTEXTS (2048 8000), FLOORS, TAUS.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${RI_BUILD_DIR:-$root/build}/bin"
out="${1:-$root/docs/img}"
contexts="${CONTEXTS:-2048 8000}"
floors="${FLOORS:-0 64 128 256 512 1024}"
taus="${TAUS:-0.02 0.05 0.1 0.2}"
work="$(mktemp -d "${TMPDIR:-/tmp}/ri-curve-XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
for p in ri-generate ri-bench-attn-accuracy; do
  [ -x "$bin/$p" ] || { echo "budget_curve: $bin/$p is not built (./ri build)" >&2; exit 1; }
done

cat "$root"/docs/architecture.md "$root"/docs/kvstore.md "$root"/docs/worker.md "$root"/docs/model.md \
    "$root"/docs/kernels.md "$root"/docs/spill.md "$root"/docs/deploy.md >"$work/docs.txt"
for ctx in $contexts; do
  # ~3.4 characters a token for the first 8K characters of this text, ~2.9
  # further on (more code and tables): stay under the context asked for
  if [ "$ctx" -le 4096 ]; then chars=$(( ctx * 34 / 10 )); else chars=$(( ctx * 29 / 10 )); fi
  { head -c "$chars" "$work/docs.txt"
    printf '\n\nIn two sentences: what does the kvstore keep, and what does the worker keep?'
  } >"$work/prompt-$ctx.txt"
  echo "budget_curve: dumping K/V at ~$ctx tokens"
  "$bin/ri-generate" --prompt-file "$work/prompt-$ctx.txt" --chat --max-tokens 32 --temperature 0 \
    --dump-kv "$work/kv-$ctx" --no-stream >/dev/null
  for t in $floors; do
    "$bin/ri-bench-attn-accuracy" --kv "$work/kv-$ctx" --retrieval-min "$t" \
      --json "$out/budget-$ctx-min$t.json" | tail -n 8
  done
  for x in $taus; do
    "$bin/ri-bench-attn-accuracy" --kv "$work/kv-$ctx" --adapt-tau "$x" \
      --json "$out/budget-$ctx-tau$x.json" | tail -n 8
  done
done

# One chart per context: error against exact tokens, a line per method, the
# per-head cut a line of its own (./ri plot).
for ctx in $contexts; do
  mkdir -p "$work/plot-$ctx"
  python3 "$root/tools/plot.py" --out "$work/plot-$ctx" "$out"/budget-"$ctx"-*.json >/dev/null &&
    mv "$work/plot-$ctx/attn-accuracy-budget.png" "$out/budget-curve-$ctx.png" &&
    echo "budget_curve: chart $out/budget-curve-$ctx.png"
done
