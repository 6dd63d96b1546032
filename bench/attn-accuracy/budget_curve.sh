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

for ctx in $contexts; do
  echo "budget_curve: dumping K/V at ~$ctx tokens"
  "$root/bench/attn-accuracy/prose_kv.sh" "$bin" "$ctx" "$work/kv-$ctx"
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
