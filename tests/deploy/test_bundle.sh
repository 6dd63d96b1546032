#!/bin/sh
# tools/bundle.sh: the folder a bare GPU machine gets.  Bundles this build
# into a temporary folder, then with the loader pointed at the bundle only
# (a clean environment, LD_LIBRARY_PATH = the bundle's lib/):
#  - ldd of every bundled program resolves each library inside the bundle,
#    except the C library's parts, the loader and the CUDA driver;
#  - the bundled ri-kvstore answers --help, starts on loopback (its port
#    file appears), maps no shared library from outside the bundle but
#    those, and stops on SIGTERM with exit 0;
#  - the bundled ri-bench-dev runs its CPU mode on the tiny synthetic model;
#  - --archive: the xz archive (at the fastest level here, so at most the
#    size of the default's) is under the 64 MiB a carry to the GPU machine
#    takes, and unpacks to the same files.
# A few seconds.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
src="${RI_SOURCE_DIR:-$here/../..}"
[ -x "$RI_BUILD_DIR/bin/ri-kvstore" ] && [ -x "$RI_BUILD_DIR/bin/ri-worker" ] && [ -x "$RI_BUILD_DIR/bin/ri-bench-dev" ] ||
  { echo "skip: ri-kvstore, ri-worker or ri-bench-dev not built"; exit 77; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ri-bundle-XXXXXX")"
pid=""
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
b="$tmp/bundle"
XZ_LEVEL=1 bash "$src/tools/bundle.sh" --archive "$tmp/bundle.tar.xz" "$b" "$RI_BUILD_DIR" ||
  fail "bundle.sh exited $?"
bytes="$(stat -c %s "$tmp/bundle.tar.xz")"
[ "$bytes" -le 67108864 ] || fail "the archive is $bytes bytes, over 64 MiB"
mkdir "$tmp/unpacked"
xz -dc "$tmp/bundle.tar.xz" | tar -C "$tmp/unpacked" -xf - || fail "the archive does not unpack"
diff -r "$b" "$tmp/unpacked/bundle" >/dev/null || fail "the unpacked archive differs from the folder"
echo "archive: $bytes bytes (folder $(du -sb "$b" | cut -f1)), unpacks to the same files"
cat "$b/MANIFEST" | cut -c1-300
system='^(linux-vdso|linux-gate|libc|libm|libpthread|libdl|librt|ld-linux[^.]*|libcuda)\.so'
# the run environment: nothing of ours beyond the bundle
run() { env -i PATH=/usr/bin:/bin HOME="$tmp" UCX_TLS=posix,sysv,cma,tcp,self "$@"; }

for p in "$b"/bin/*; do
  run LD_LIBRARY_PATH="$b/lib" ldd "$p" >"$tmp/ldd" 2>&1 || fail "ldd $p: $(cat "$tmp/ldd")"
  ! grep -q 'not found' "$tmp/ldd" || fail "$(basename "$p"): $(grep 'not found' "$tmp/ldd")"
  awk '/=> \//{print $1, $3}' "$tmp/ldd" | while read -r name path; do
    case "$path" in
      "$b/lib/"*) ;;
      *) echo "$name" | grep -Eq "$system" || { echo "FAIL: $(basename "$p") loads $path from outside the bundle"; exit 1; } ;;
    esac
  done || exit 1
done
echo "ldd: every library of $(ls "$b/bin" | wc -l) programs resolves inside the bundle (or is the C library / driver)"

run "$b/run.sh" ri-kvstore --help >"$tmp/help" 2>&1 || fail "bundled ri-kvstore --help: $(tail -3 "$tmp/help")"
grep -q -- '--listen' "$tmp/help" || fail "bundled ri-kvstore --help printed no options"

# env execs run.sh, which execs the daemon: $! is the daemon
env -i PATH=/usr/bin:/bin HOME="$tmp" UCX_TLS=posix,sysv,cma,tcp,self "$b/run.sh" ri-kvstore --listen=127.0.0.1:0 --dataplane-listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
  --insecure-admin --memory=64MiB --no-hugepages --drain-timeout-ms=1000 --port-file="$tmp/ports" \
  >"$tmp/kvstore.log" 2>&1 &
pid=$!
for _ in $(seq 1 1000); do
  [ -s "$tmp/ports" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/kvstore.log"; fail "bundled ri-kvstore died at start"; }
  sleep 0.01
done
[ -s "$tmp/ports" ] || fail "bundled ri-kvstore wrote no port file"
grep -q '^grpc=127.0.0.1:' "$tmp/ports" || fail "no gRPC address: $(cat "$tmp/ports")"
# the process's own view: which shared objects it mapped, and from where
awk '$6 ~ /\.so/ {print $6}' "/proc/$pid/maps" | sort -u >"$tmp/maps"
outside="$(grep -v "^$b/lib/" "$tmp/maps" | while read -r f; do
  basename "$f" | grep -Eq "$system" || echo "$f"; done)"
[ "$(grep -c "^$b/lib/" "$tmp/maps")" -gt 0 ] || fail "pid $pid mapped nothing from the bundle: $(cat "$tmp/maps")"
[ -z "$outside" ] || fail "the running ri-kvstore mapped libraries from outside the bundle: $outside"
echo "ri-kvstore from the bundle: up at $(sed -n 's/^grpc=//p' "$tmp/ports"), $(grep -c "^$b/lib/" "$tmp/maps") libraries mapped from the bundle"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=""
[ "$rc" -eq 0 ] || { tail -5 "$tmp/kvstore.log"; fail "bundled ri-kvstore exited $rc on SIGTERM"; }

run "$b/run.sh" ri-bench-dev --device cpu --preset tiny --contexts 256 --batch 1 --steps 2 --attn full \
  --json "$tmp/dev.json" >"$tmp/dev.txt" 2>&1 || { cat "$tmp/dev.txt"; fail "bundled ri-bench-dev exited $?"; }
grep -Eq '^full +256 +1 ' "$tmp/dev.txt" || { cat "$tmp/dev.txt"; fail "bundled ri-bench-dev printed no row"; }
echo "ok"
