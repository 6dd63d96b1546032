#!/usr/bin/env bash
# The layer rule of docs/architecture.md, checked on #include lines:
#   common/    includes nothing of ours (but the public include/ status type)
#   kernels/   may include common/
#   kvstore/   may include common/, proto/
#   gpuworker/ may include common/, proto/, kernels/, and inside it:
#     model/   common/, kernels/ and itself (never the client or the server)
#     client/  also proto/ and model/ (never the server)
#     server/  all of gpuworker/
# kvstore/ and gpuworker/ never include each other.
# Inside kvstore/data/ (kvs_handler.h): the transport (kvs_dp*) and the
# operations (kvs_ops, kvs_tier, kvs_direct, kvs_cache, kvs_lease) meet only
# in kvs_handler.h: the operations neither include kvs_dp.h / kvs_dp_lane.h
# nor call kvs_dp_*; the transport neither includes kvs_internal.h nor calls
# kvs_ops_* / kvs_tier_* / kvs_direct_* / kvs_session_* / kvs_lease_*.  An allowed entry is a
# folder prefix: "gpuworker/model" allows gpuworker/model/..., "gpuworker"
# all of gpuworker/.
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
fail=0

# allowed_inc INC PREFIX...: true when INC lies under one of the prefixes.
allowed_inc() {
  local inc="$1" a; shift
  for a in "$@"; do
    [[ "$inc" == "$a"/* ]] && return 0
  done
  return 1
}

check() {
  local dir="$1"; shift
  local allowed="$*" f inc top
  [ -d "$root/$dir" ] || return 0
  while IFS= read -r -d '' f; do
    while IFS= read -r inc; do
      top="${inc%%/*}"
      case " common proto kernels kvstore gpuworker cli bench tests " in
        *" $top "*) ;;
        *) continue ;;   # system or generated headers
      esac
      if ! allowed_inc "$inc" $allowed; then
        echo "layer violation: ${f#$root/} includes \"$inc\" ($dir/ may use: $allowed)"
        fail=1
      fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  done < <(find "$root/$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0)
}

check common    common
check kernels   common kernels
check kvstore   common proto kvstore
check gpuworker common proto kernels gpuworker
check gpuworker/model  common kernels gpuworker/model
check gpuworker/client common proto kernels gpuworker/model gpuworker/client
check gpuworker/server common proto kernels gpuworker

# seam FILE_GLOB INCLUDE_RE CALL_RE WHAT: no file of the glob in kvstore/data
# includes a header matching INCLUDE_RE or calls a function matching CALL_RE.
seam() {
  local glob="$1" inc_re="$2" call_re="$3" what="$4" f
  for f in "$root"/kvstore/data/$glob; do
    [ -f "$f" ] || continue
    if grep -Eq "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"kvstore/data/($inc_re)\"" "$f"; then
      echo "layer violation: ${f#$root/} includes a header of the $what (kvstore/data meets only in kvs_handler.h)"
      fail=1
    fi
    if grep -Eq "\\b($call_re)[a-z0-9_]*[[:space:]]*\\(" "$f"; then
      echo "layer violation: ${f#$root/} calls the $what directly (kvstore/data meets only in kvs_handler.h)"
      fail=1
    fi
  done
}
for f in kvs_ops kvs_tier kvs_direct kvs_cache kvs_lease; do
  seam "$f.[ch]" 'kvs_dp\.h|kvs_dp_lane\.h' 'kvs_dp_' transport
done
seam 'kvs_dp*.[ch]' 'kvs_internal\.h' 'kvs_ops_|kvs_tier_|kvs_direct_|kvs_session_|kvs_lease_' operations

if [ "$fail" = 0 ]; then
  echo "layer rule: ok"
fi
exit "$fail"
