#!/usr/bin/env bash
# The layer rule of docs/architecture.md, checked on #include lines:
#   common/    includes nothing of ours (but the public include/ status type)
#   kernels/   may include common/
#   kvstore/   may include common/, proto/
#   gpuworker/ may include common/, proto/, kernels/
# kvstore/ and gpuworker/ never include each other.
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
fail=0

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
      if [[ " $allowed " != *" $top "* ]]; then
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

if [ "$fail" = 0 ]; then
  echo "layer rule: ok"
fi
exit "$fail"
