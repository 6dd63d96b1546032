#!/bin/sh
# Make a throw-away CA, a server certificate for 127.0.0.1/localhost and a
# client certificate in DIR (for the TLS tests).  Exits 77 without openssl.
set -eu
dir="$1"
command -v openssl >/dev/null 2>&1 || { echo "openssl not installed" >&2; exit 77; }
cd "$dir"
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj /CN=ri-test-ca 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > server.ext
openssl req $ec -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 \
  -extfile server.ext 2>/dev/null
openssl req $ec -keyout client.key -out client.csr -subj /CN=ri-test-client 2>/dev/null
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 2>/dev/null
# a second CA that signed nothing we trust
openssl req -x509 $ec -keyout other.key -out other.pem -days 2 -subj /CN=ri-other-ca 2>/dev/null
chmod 600 ./*.key
