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
rm "$tmp/kvstore/bad.c"
# Inside gpuworker/: the model may not include the client, nor the client the server.
mkdir -p "$tmp/gpuworker/model" "$tmp/gpuworker/client" "$tmp/gpuworker/server"
printf '#include "gpuworker/model/mdl_model.h"\n' >"$tmp/gpuworker/client/ok.c"
printf '#include "gpuworker/client/gw_remote.h"\n' >"$tmp/gpuworker/server/ok.c"
"$here/tools/check_layers.sh" "$tmp" >/dev/null || { echo "clean gpuworker tree rejected"; exit 1; }
for bad in "model:gpuworker/client/gw_remote.h" "model:gpuworker/server/gw_sched.h" "client:gpuworker/server/gw_http.h"; do
  printf '#include "%s"\n' "${bad#*:}" >"$tmp/gpuworker/${bad%%:*}/bad.c"
  if "$here/tools/check_layers.sh" "$tmp" >/dev/null; then
    echo "violation not caught: gpuworker/${bad%%:*} includes ${bad#*:}"; exit 1
  fi
  rm "$tmp/gpuworker/${bad%%:*}/bad.c"
done
# Inside kvstore/data: operations and transport meet only in kvs_handler.h.
mkdir -p "$tmp/kvstore/data"
printf '#include "kvstore/data/kvs_internal.h"\n#include "kvstore/data/kvs_handler.h"\n' >"$tmp/kvstore/data/kvs_ops.c"
printf '#include "kvstore/data/kvs_dp_lane.h"\nvoid f(void) { w->dp->h.serve(0, 0, 0, 0); }\n' >"$tmp/kvstore/data/kvs_dp.c"
"$here/tools/check_layers.sh" "$tmp" >/dev/null || { echo "clean kvstore/data tree rejected"; exit 1; }
for bad in 'kvs_ops.c:#include "kvstore/data/kvs_dp_lane.h"' 'kvs_tier.c:void f(void) { kvs_dp_reply_data(0); }' \
           'kvs_dp.c:#include "kvstore/data/kvs_internal.h"' 'kvs_dp_region.c:void f(void) { kvs_direct_handover(0); }'; do
  file="$tmp/kvstore/data/${bad%%:*}"
  cp "$file" "$file.orig" 2>/dev/null || : >"$file.orig"
  printf '%s\n' "${bad#*:}" >>"$file"
  if "$here/tools/check_layers.sh" "$tmp" >/dev/null; then
    echo "violation not caught: kvstore/data/${bad%%:*}: ${bad#*:}"; exit 1
  fi
  mv "$file.orig" "$file"
done
echo "layer checker catches violations"
