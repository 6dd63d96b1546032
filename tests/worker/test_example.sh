#!/usr/bin/env bash
# docs/example/example.c against a real ri-kvstore: the copy CMake built, and
# one compiled here through the generated retroinfer.pc (the way a user would).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kvs_up.sh"
kvs_up
"$RI_BUILD_DIR/tests/ri-example-api" "$KVS_GRPC"
if command -v pkg-config >/dev/null && command -v cc >/dev/null; then
  out="$KVS_DIR/example-pc"
  san=""
  # a sanitizer build of the library needs its runtime first in the program too
  # (grep without -q: with pipefail, an early exit of grep -q would SIGPIPE ldd
  # and turn a match into a failure)
  if ldd "$RI_BUILD_DIR/lib/libretroinfer.so" | grep libasan >/dev/null; then san="-fsanitize=address,undefined"; fi
  PKG_CONFIG_PATH="$RI_BUILD_DIR" cc -std=c11 -Wall -Wextra -Werror $san "$RI_SOURCE_DIR/docs/example/example.c" \
    $(PKG_CONFIG_PATH="$RI_BUILD_DIR" pkg-config --cflags --libs retroinfer) -lm -o "$out" 2>"$KVS_DIR/cc.log" || {
    cat "$KVS_DIR/cc.log"; exit 1; }
  "$out" "$KVS_GRPC"
  # only the public API is exported
  if nm -D --defined-only "$RI_BUILD_DIR/lib/libretroinfer.so" | awk '{print $3}' | grep -v '^ri_' | grep . >/dev/null; then
    echo "libretroinfer exports non-ri_ symbols:"; nm -D --defined-only "$RI_BUILD_DIR/lib/libretroinfer.so" | grep -v ' ri_'
    exit 1
  fi
fi
# a kvstore that is not there: a clear error naming the address
if "$RI_BUILD_DIR/tests/ri-example-api" 127.0.0.1:1 2>"$KVS_DIR/err"; then
  echo "example succeeded without a kvstore"; exit 1
fi
grep -q "127.0.0.1:1" "$KVS_DIR/err" || { echo "error does not name the address:"; cat "$KVS_DIR/err"; exit 1; }
cat "$KVS_DIR/err"

# A data plane on a wildcard address: the library connects to the host it
# reached gRPC at (and says so); with dataplane-advertise it uses exactly
# the advertised address, so a wrong one fails naming it.
kvs_stop
KVS_DP_LISTEN=0.0.0.0:0 kvs_up
"$RI_BUILD_DIR/tests/ri-example-api" "$KVS_GRPC" 2>"$KVS_DIR/err" || { cat "$KVS_DIR/err"; exit 1; }
grep -q "wildcard address: using 127.0.0.1:" "$KVS_DIR/err" || {
  echo "wildcard data plane not replaced by the gRPC host:"; cat "$KVS_DIR/err"; exit 1; }
kvs_stop
KVS_DP_LISTEN=0.0.0.0:0 KVS_EXTRA="--dataplane-advertise=127.0.0.1" kvs_up
dp_port="$(sed -n 's/^dataplane=.*://p' "$KVS_DIR/ports")"
grep -qx "dataplane_advertised=127.0.0.1:$dp_port" "$KVS_DIR/ports" || {
  echo "advertised address is not 127.0.0.1:$dp_port:"; cat "$KVS_DIR/ports"; exit 1; }
"$RI_BUILD_DIR/tests/ri-example-api" "$KVS_GRPC"
kvs_stop
KVS_EXTRA="--dataplane-advertise=127.0.0.1:1" kvs_up
if "$RI_BUILD_DIR/tests/ri-example-api" "$KVS_GRPC" 2>"$KVS_DIR/err"; then
  echo "example succeeded through an advertised address where nothing listens"; exit 1
fi
grep -q "127.0.0.1:1" "$KVS_DIR/err" || { echo "error does not name the advertised address:"; cat "$KVS_DIR/err"; exit 1; }
echo "example: ok"
