#!/usr/bin/env bash
# The main job of `./ri demo` (see README.md): the end-to-end demo
# (tools/demo_e2e.sh: ri-kvstore + ri-worker on a passkey prompt, full vs
# retroinfer through the kvstore); `./ri demo --kvstore-only` runs the
# daemon-only check (start, Health over gRPC, clean stop).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RI_BUILD_DIR:-$root/build}/bin"
if [ "${1:-}" = "--kvstore-only" ]; then
  shift
  exec "$root/tools/demo_kvstore.sh" "$@"
fi
if [ -x "$root/tools/demo_e2e.sh" ]; then
  exec "$root/tools/demo_e2e.sh" "$@"
fi
[ -x "$bin/ri-kvstore" ] || { echo "demo: ri-kvstore is not built yet" >&2; exit 1; }
exec "$root/tools/demo_kvstore.sh" "$@"
