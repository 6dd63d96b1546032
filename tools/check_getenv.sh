#!/bin/sh
# Libraries never read the environment: programs load their settings through
# cm_config (the one reader, common/cm_config.c) and pass them down.  Fails
# when getenv or setenv appears in library code of common/, kernels/,
# gpuworker/model/ (program mains excepted), gpuworker/client/ or
# kvstore/data/ and kvstore/spill/ (ri-kvstore's main, kvstore/ctl/kvs_main.c,
# reads UCX's own variables and passes them in).  Usage: check_getenv.sh [ROOT]
# (default: the source tree this script is in).
cd "${1:-$(dirname "$0")/..}" || exit 2
hits=$({ grep -rn --include='*.c' --include='*.h' --include='*.cu' -E '\b(secure_)?getenv[[:space:]]*\(' \
             common kernels gpuworker/model gpuworker/client kvstore/data kvstore/spill 2>/dev/null
         grep -rn --include='*.c' --include='*.h' -E '\b(set|put|unset)env[[:space:]]*\(' \
             kvstore/data kvstore/spill 2>/dev/null; } |
       grep -v -E '^common/cm_config\.c:|^gpuworker/model/(ri_model|ri_generate)\.c:')
if [ -n "$hits" ]; then
    echo "getenv/setenv in library code (load the setting through cm_config in the program instead):"
    echo "$hits"
    exit 1
fi
echo "ok: no getenv in library code"
