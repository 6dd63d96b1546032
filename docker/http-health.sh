#!/bin/bash
# Container health check without curl: GET http://127.0.0.1:PORT/PATH over
# bash's /dev/tcp; healthy (exit 0) only on an HTTP 200 answer.
#   ri-http-health PORT PATH
set -eu
exec 3<>"/dev/tcp/127.0.0.1/$1"
printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
read -r _ code _ <&3
[ "$code" = 200 ]
