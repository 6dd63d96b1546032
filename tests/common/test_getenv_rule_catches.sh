#!/usr/bin/env bash
# Tests tools/check_getenv.sh itself: a tree whose library code reads the
# environment must be rejected in each checked folder; the allowed readers
# (common/cm_config.c, the program mains of gpuworker/model, ri-kvstore's
# main) and code outside the checked folders are accepted; kvstore/data may
# not set the environment either.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
check() { "$here/tools/check_getenv.sh" "$tmp" >/dev/null 2>&1; }
mkdir -p "$tmp/common" "$tmp/kernels" "$tmp/gpuworker/model" "$tmp/gpuworker/client" "$tmp/gpuworker/server" \
  "$tmp/kvstore/ctl" "$tmp/kvstore/data"
call='const char *v = getenv("RI_X");'
printf '%s\n' "$call" >"$tmp/common/cm_config.c"
printf '%s\n' "$call" >"$tmp/gpuworker/model/ri_generate.c"
printf '%s\n' "$call" >"$tmp/gpuworker/server/ri_worker.c"
printf '%s\n' "$call" 'setenv("UCX_X", "1", 0);' >"$tmp/kvstore/ctl/kvs_main.c"
printf '/* setenv is not safe against a concurrent getenv */\n' >"$tmp/common/cm_ucx.h"
check || { echo "clean tree rejected"; exit 1; }
for bad in common/cm_log.c kernels/kn_ops.c gpuworker/model/mdl_path.c gpuworker/model/cuda/x.cu gpuworker/client/ri_api.c \
           kvstore/data/kvs_dp_setup.c kvstore/spill/kvs_spill.c; do
  mkdir -p "$(dirname "$tmp/$bad")"
  printf '%s\n' "$call" >"$tmp/$bad"
  if check; then
    echo "not caught: getenv in $bad"; exit 1
  fi
  rm "$tmp/$bad"
done
printf 'setenv("UCX_TLS", "tcp", 1);\n' >"$tmp/kvstore/data/kvs_dp_setup.c"
if check; then
  echo "not caught: setenv in kvstore/data"; exit 1
fi
rm "$tmp/kvstore/data/kvs_dp_setup.c"
echo "the getenv check catches library code reading the environment"
