#!/usr/bin/env bash
# Tests tools/check_no_external_refs.sh itself: a tree with text citing a
# tracker's numbers (each form on its own) must be rejected, a clean one,
# with a public project's issue and the verb "issued", accepted.  The cited
# forms are assembled at run time, so this file does not trip the check.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
check() { "$here/tools/check_no_external_refs.sh" "$tmp" >/dev/null 2>&1; }
printf '/* the loads are issued early; see grpc/grpc#20418; row 2 offsets */\n' >"$tmp/ok.c"
check || { echo "clean tree rejected"; exit 1; }
i=issue t=task k=ticket h="#"
for bad in "($i 7)" "${i^} 11, row 2" "$i rows ${h}6, ${h}7" "$t ${h}3" "${k^} 12" "the $i's targets" "limits (${h}5):"; do
  printf '/* %s */\n' "$bad" >"$tmp/bad.c"
  if check; then
    echo "not caught: '$bad'"; exit 1
  fi
done
echo "the external-reference check catches tracker numbers"
