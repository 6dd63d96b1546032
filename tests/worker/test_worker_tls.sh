#!/usr/bin/env bash
# The worker library's control connection over TLS and mutual TLS, against
# the real daemon with throw-away certificates: the right CA is served (a
# session is created), another CA, plaintext, and (mutual TLS) a client
# without a certificate are refused with an error, and a client certificate
# without a CA is a parameter error.  Exits 77 without openssl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/kvs_up.sh"
cli="$RI_BUILD_DIR/tests/wk-tls-client"
[ -x "$cli" ] || { echo "skip: $cli not built"; exit 77; }
rc=0; sh "$RI_SOURCE_DIR/tests/kvstore_ctl/make_test_certs.sh" "$KVS_DIR" || rc=$?
[ "$rc" = 77 ] && { echo "skip: openssl not installed"; exit 77; }
[ "$rc" = 0 ] || { echo "make_test_certs.sh failed ($rc)"; exit 1; }
d="$KVS_DIR"
refused() {  # refused WHAT ARGS...: the client must fail and say why
  local what="$1"; shift
  if "$cli" "$@" 2>"$d/err"; then echo "FAIL: $what was served"; exit 1; fi
  grep -q "wk-tls-client:" "$d/err" || { echo "FAIL: $what: no error text"; cat "$d/err"; exit 1; }
  echo "ok: $what refused: $(head -c 200 "$d/err")"
}

KVS_EXTRA="--tls-cert=$d/server.pem --tls-key=$d/server.key" kvs_up
"$cli" "$KVS_GRPC" "$d/ca.pem" || { echo "FAIL: TLS with the right CA"; exit 1; }
echo "ok: TLS session created"
refused "another CA" "$KVS_GRPC" "$d/other.pem"
refused "plaintext to a TLS port" "$KVS_GRPC" -
refused "a client certificate without a CA" "$KVS_GRPC" - "$d/client.pem" "$d/client.key"
grep -q "needs tls_ca_file" "$d/err" || { echo "FAIL: cert without CA not named"; cat "$d/err"; exit 1; }
refused "a missing CA file" "$KVS_GRPC" "$d/no-such.pem"
kvs_stop

KVS_EXTRA="--tls-cert=$d/server.pem --tls-key=$d/server.key --tls-ca=$d/ca.pem" kvs_up
refused "mutual TLS without a client certificate" "$KVS_GRPC" "$d/ca.pem"
"$cli" "$KVS_GRPC" "$d/ca.pem" "$d/client.pem" "$d/client.key" || { echo "FAIL: mutual TLS"; exit 1; }
echo "ok: mutual TLS session created"
# the worker takes the same settings as flags
if [ -x "$RI_BUILD_DIR/bin/ri-worker" ]; then
  "$RI_BUILD_DIR/bin/ri-worker" --help | grep -- "--tls-ca" >/dev/null || { echo "FAIL: ri-worker has no --tls-ca"; exit 1; }
fi
echo "worker tls: ok"
