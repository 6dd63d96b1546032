# A real etcd for shell tests, on free loopback ports with its data in a
# temporary folder.  Exits 77 (skipped) where /usr/bin/etcd is not installed.
#
# Sourced:   . tests/common/etcd_up.sh; etcd_up   -> ETCD_URL (host:port),
#            ETCD_PID, ETCD_DIR; etcd_kill (kill -9, keeps ports and data),
#            etcd_up again restarts on the same ports and data; etcd_down
#            stops it and removes the folder (also run at exit, before
#            an EXIT trap set earlier).
# Executed:  etcd_up.sh DIR  -> starts etcd detached with its data in DIR,
#            prints its client URL; DIR/etcd.pid holds its pid (the caller
#            kills it and removes DIR).
ETCD_BIN="${ETCD_BIN:-/usr/bin/etcd}"
[ -x "$ETCD_BIN" ] || { echo "skip: $ETCD_BIN not installed" >&2; exit 77; }

etcd_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# etcd_start DIR CLIENT_PORT PEER_PORT: start etcd, wait for /health (10 s).
etcd_start() {
  local dir="$1" c="$2" p="$3"
  "$ETCD_BIN" --name t0 --data-dir "$dir/data" \
    --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "t0=http://127.0.0.1:$p" --initial-cluster-state new \
    --logger zap --log-level warn >>"$dir/etcd.log" 2>&1 </dev/null 3>&- &
  ETCD_PID=$!
  echo "$ETCD_PID" >"$dir/etcd.pid"
  for _ in $(seq 1 1000); do
    if python3 - "$c" <<'PY' 2>/dev/null; then return 0; fi
import sys, urllib.request
sys.exit(0 if b'"health":"true"' in urllib.request.urlopen("http://127.0.0.1:%s/health" % sys.argv[1], timeout=1).read() else 1)
PY
    kill -0 "$ETCD_PID" 2>/dev/null || { cat "$dir/etcd.log" >&2; return 1; }
    sleep 0.01
  done
  cat "$dir/etcd.log" >&2
  return 1
}

etcd_up() {
  if [ -z "${ETCD_DIR:-}" ]; then
    ETCD_DIR="$(mktemp -d "${TMPDIR:-/tmp}/ri-etcd-XXXXXX")"
    ETCD_CLIENT_PORT="$(etcd_free_port)"
    ETCD_PEER_PORT="$(etcd_free_port)"
    ETCD_URL="127.0.0.1:$ETCD_CLIENT_PORT"
  fi
  etcd_start "$ETCD_DIR" "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT"
}
etcd_kill() {
  if [ -n "${ETCD_PID:-}" ]; then
    kill -KILL "$ETCD_PID" 2>/dev/null || true
    wait "$ETCD_PID" 2>/dev/null || true
  fi
  ETCD_PID=
}
etcd_down() {
  if [ -n "${ETCD_PID:-}" ] && kill "$ETCD_PID" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$ETCD_PID" 2>/dev/null || break; sleep 0.1; done
    etcd_kill
  fi
  ETCD_PID=
  [ -n "${ETCD_DIR:-}" ] && rm -rf "$ETCD_DIR"
  ETCD_DIR=
}

if [ "${BASH_SOURCE[0]:-$0}" = "$0" ]; then
  # executed: start detached in DIR and print the URL
  set -eu
  dir="${1:?usage: etcd_up.sh DIR}"
  mkdir -p "$dir"
  c="$(etcd_free_port)"; p="$(etcd_free_port)"
  etcd_start "$dir" "$c" "$p"
  echo "127.0.0.1:$c"
else
  # run before any EXIT trap already set (kvs_up.sh sets one too)
  _etcd_prev_trap="$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")"
  trap "etcd_down; ${_etcd_prev_trap:-:}" EXIT
fi
