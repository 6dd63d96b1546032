# Source me: start ri-kvstore on ephemeral loopback ports, set KVS_PID,
# KVS_GRPC, KVS_DIR; kvs_down stops it.  KVS_DP_LISTEN moves the data plane,
# KVS_EXTRA adds daemon flags (word-split).  Exits 77 when it is not built.
KVS_BIN="${RI_BUILD_DIR:?}/bin/ri-kvstore"
export UCX_TLS="${UCX_TLS:-posix,sysv,cma,tcp,self}"   # same host: shared memory
[ -x "$KVS_BIN" ] || { echo "skip: $KVS_BIN not built"; exit 77; }
KVS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ri-wk-XXXXXX")"
kvs_up() {
  rm -f "$KVS_DIR/ports"
  "$KVS_BIN" --listen="${1:-127.0.0.1:0}" --dataplane-listen="${KVS_DP_LISTEN:-127.0.0.1:0}" ${KVS_EXTRA:-} --metrics-listen=127.0.0.1:0 --insecure-admin \
    --memory="${KVS_MEMORY:-256MiB}" --no-hugepages --drain-timeout-ms=3000 --port-file="$KVS_DIR/ports" \
    >"$KVS_DIR/kvstore.log" 2>&1 3>&- &
  KVS_PID=$!
  for _ in $(seq 1 1500); do
    [ -s "$KVS_DIR/ports" ] && break
    kill -0 "$KVS_PID" 2>/dev/null || { cat "$KVS_DIR/kvstore.log"; return 1; }
    sleep 0.01
  done
  KVS_GRPC="$(sed -n 's/^grpc=//p' "$KVS_DIR/ports")"
  [ -n "$KVS_GRPC" ]
}
kvs_stop() {
  if [ -n "${KVS_PID:-}" ] && kill "$KVS_PID" 2>/dev/null; then
    # bounded: a daemon that ignores SIGTERM is killed after 5 s
    for _ in $(seq 1 50); do kill -0 "$KVS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$KVS_PID" 2>/dev/null || true
    wait "$KVS_PID" 2>/dev/null || true
  fi
  KVS_PID=
}
kvs_down() {
  kvs_stop
  rm -rf "$KVS_DIR"
}
trap kvs_down EXIT
