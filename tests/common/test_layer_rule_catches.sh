#!/usr/bin/env bash
# Tests the layer checker itself: a tree with a kvstore -> gpuworker include
# must be rejected, a clean one accepted.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kvstore" "$tmp/gpuworker" "$tmp/common"
printf '#include "common/cm_log.h"\n' >"$tmp/kvstore/ok.c"
"$here/tools/check_layers.sh" "$tmp" >/dev/null || { echo "clean tree rejected"; exit 1; }
printf '#include "gpuworker/gw_cache.h"\n' >"$tmp/kvstore/bad.c"
if "$here/tools/check_layers.sh" "$tmp" >/dev/null; then
  echo "violation not caught"; exit 1
fi
echo "layer checker catches violations"
