#!/usr/bin/env bash
# etcd_up.sh, the shell tests' etcd: it starts, answers etcdctl, survives a
# kill -9 + restart on the same port with its data, and is gone after
# etcd_down; executed, it prints a URL that answers.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command -v etcdctl >/dev/null || { echo "skip: etcdctl not installed"; exit 77; }
export ETCDCTL_API=3
. "$here/etcd_up.sh"
etcd_up
url="$ETCD_URL"
etcdctl --endpoints="$url" put /t/k v1 >/dev/null
etcd_kill
if etcdctl --endpoints="$url" --command-timeout=1s get /t/k >/dev/null 2>&1; then
  echo "FAIL: etcd still answers after etcd_kill"; exit 1
fi
etcd_up
[ "$ETCD_URL" = "$url" ] || { echo "FAIL: restarted on $ETCD_URL, not $url"; exit 1; }
[ "$(etcdctl --endpoints="$url" get --print-value-only /t/k)" = v1 ] || { echo "FAIL: data lost over the restart"; exit 1; }
dir="$ETCD_DIR"
etcd_down
[ ! -e "$dir" ] || { echo "FAIL: $dir left behind"; exit 1; }

# executed: detached, prints its URL, pid in DIR/etcd.pid
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ri-etcd-up-XXXXXX")"
url2="$(bash "$here/etcd_up.sh" "$tmp")"
pid="$(cat "$tmp/etcd.pid")"
ok=0
[ "$(etcdctl --endpoints="$url2" endpoint health 2>&1 | grep -c 'is healthy')" = 1 ] && ok=1
kill "$pid"; for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -9 "$pid" 2>/dev/null || true
rm -rf "$tmp"
[ "$ok" = 1 ] || { echo "FAIL: executed etcd_up.sh gave $url2, which does not answer"; exit 1; }
echo "etcd_up.sh: ok"
