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
# a bad RI_LOG_LEVEL: ri_config_from_env refuses it and names the variable
if RI_LOG_LEVEL=loud "$RI_BUILD_DIR/tests/ri-example-api" 127.0.0.1:1 2>"$KVS_DIR/err"; then
  echo "example accepted RI_LOG_LEVEL=loud"; exit 1
fi
grep -q "RI_LOG_LEVEL" "$KVS_DIR/err" || { echo "error does not name RI_LOG_LEVEL:"; cat "$KVS_DIR/err"; exit 1; }
# a kvstore that is not there: a clear error naming the address
if "$RI_BUILD_DIR/tests/ri-example-api" 127.0.0.1:1 2>"$KVS_DIR/err"; then
  echo "example succeeded without a kvstore"; exit 1
fi
grep -q "127.0.0.1:1" "$KVS_DIR/err" || { echo "error does not name the address:"; cat "$KVS_DIR/err"; exit 1; }
cat "$KVS_DIR/err"

# The data plane on every interface (a wildcard): the UCX address the
# kvstore hands out carries each interface's own address, so the library
# connects with nothing to fix up.  With a port, UCX's TCP transport listens
# on exactly that port (what a firewall rule names).  Beyond loopback a
# daemon without a tokens file must be told it serves unauthenticated.
kvs_stop
KVS_DP_LISTEN=0.0.0.0:0 KVS_EXTRA=--insecure kvs_up
grep -q '^dataplane=ucx:[0-9a-f]*$' "$KVS_DIR/ports" || { echo "port file has no UCX address:"; cat "$KVS_DIR/ports"; exit 1; }
"$RI_BUILD_DIR/tests/ri-example-api" "$KVS_GRPC"
kvs_stop
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
KVS_DP_LISTEN="127.0.0.1:$port" kvs_up
grep -qx "dataplane_interface=127.0.0.1:$port" "$KVS_DIR/ports" || { echo "interface not in the port file:"; cat "$KVS_DIR/ports"; exit 1; }
python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2).close()" "$port" || {
  echo "nothing of the kvstore listens on the data-plane port $port"; exit 1; }
"$RI_BUILD_DIR/tests/ri-example-api" "$KVS_GRPC"
echo "example: ok"
