#!/usr/bin/env bash
# `./ri demo` until the worker exists: start ri-kvstore on free loopback ports,
# call Health (and Stats) over gRPC with `ri status`, stop the daemon with
# SIGTERM and check that it exits 0.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RI_BUILD_DIR:-$root/build}/bin"
work="$(mktemp -d "${TMPDIR:-/tmp}/ri-demo-XXXXXX")"
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "demo: starting ri-kvstore (gRPC, data plane and metrics on free loopback ports)"
"$bin/ri-kvstore" --listen=127.0.0.1:0 --dataplane-listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
  --memory=256MiB --port-file="$work/ports" >"$work/kvstore.log" 2>&1 &
pid=$!
for _ in $(seq 1 150); do
  [ -s "$work/ports" ] && break
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "demo: ri-kvstore exited during start:" >&2; cat "$work/kvstore.log" >&2; exit 1
  fi
  sleep 0.1
done
[ -s "$work/ports" ] || { echo "demo: ri-kvstore did not start within 15 s" >&2; cat "$work/kvstore.log" >&2; exit 1; }
addr="$(sed -n 's/^grpc=//p' "$work/ports")"
metrics="$(sed -n 's/^metrics=//p' "$work/ports")"
echo "demo: ri-kvstore pid $pid serves gRPC on $addr, metrics on http://$metrics/metrics"

echo "demo: \$ ri status --addr $addr"
"$bin/ri" status --addr "$addr"
echo "demo: \$ ri stats --addr $addr"
"$bin/ri" stats --addr "$addr"

echo "demo: sending SIGTERM to $pid"
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
pid=""
echo "demo: daemon log:"
sed 's/^/  | /' "$work/kvstore.log"
if [ "$rc" -ne 0 ]; then
  echo "demo: ri-kvstore exited with status $rc (expected 0)" >&2
  exit 1
fi
echo "demo: ri-kvstore stopped cleanly (exit 0)"
