#!/usr/bin/env bash
# The main job of `./ri demo` (see README.md).  Until the worker lands it
# starts ri-kvstore on a free port, calls Health over gRPC and stops it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RI_BUILD_DIR:-$root/build}/bin"
if [ -x "$root/tools/demo_e2e.sh" ]; then
  exec "$root/tools/demo_e2e.sh" "$@"
fi
[ -x "$bin/ri-kvstore" ] || { echo "demo: ri-kvstore is not built yet" >&2; exit 1; }
exec "$root/tools/demo_kvstore.sh" "$@"
