#!/usr/bin/env bash
# Cluster sizes 4, 8 and 16 at equal retrieval floors, on the same real-prose
# K/V as budget_curve.sh (SmolLM2; this repository's docs/ as the prompt, cut
# to each context, a question at the end): the measurement behind the auto
# cluster size (kn_wave_cluster_tokens).  One K/V dump per context, replayed
# with each --cluster-tokens at each floor, so the sizes compare on the same
# keys and queries.
#
#   bench/attn-accuracy/cluster_size.sh [OUTDIR] (default docs/img/cluster-size)
#
# Writes OUTDIR/cs-<ctx>-min<T>-c<N>.json.  Environment: RI_BUILD_DIR (build),
# CONTEXTS (2048 8000), FLOORS (128 256 512), SIZES (4 8 16).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${RI_BUILD_DIR:-$root/build}/bin"
out="${1:-$root/docs/img/cluster-size}"
contexts="${CONTEXTS:-2048 8000}"
floors="${FLOORS:-128 256 512}"
sizes="${SIZES:-4 8 16}"
work="$(mktemp -d "${TMPDIR:-/tmp}/ri-cs-XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
for p in ri-generate ri-bench-attn-accuracy; do
  [ -x "$bin/$p" ] || { echo "cluster_size: $bin/$p is not built (./ri build)" >&2; exit 1; }
done
for ctx in $contexts; do
  echo "cluster_size: dumping K/V at ~$ctx tokens"
  "$root/bench/attn-accuracy/prose_kv.sh" "$bin" "$ctx" "$work/kv-$ctx"
  for t in $floors; do
    for c in $sizes; do
      echo "cluster_size: ctx $ctx floor $t, $c tokens per cluster"
      "$bin/ri-bench-attn-accuracy" --kv "$work/kv-$ctx" --retrieval-min "$t" --cluster-tokens "$c" \
        --json "$out/cs-$ctx-min$t-c$c.json" | grep -E '^all +retroinfer'
    done
  done
done
