#!/usr/bin/env bash
# Gather the programs a bare GPU machine needs into one folder that runs
# there without installing anything (docs/cuda.md "The bundle"): ri-kvstore,
# ri-worker, ri-bench-dev, the device test binaries, every shared library
# they load beyond the C library and the CUDA driver (from ldd), UCX's
# transport modules with theirs, and a launcher that points the loader at
# the bundle.
#
#   tools/bundle.sh [--archive FILE] DIR [BUILD]
#                                   BUILD: default $RI_BUILD_DIR, else ./build
#
# --archive FILE also writes DIR as FILE, a tar compressed with xz (its one
# top folder is DIR's name), for carrying to the GPU machine: the folder is
# about 75 MB (five programs link the CUDA runtime statically, ~9 MB each;
# stripping them saves only ~2 MB), its archive about 17 MB at xz's default
# level (XZ_LEVEL, default 6; 1 gives ~23 MB four times faster).  xz-utils
# is on nearly every Debian/Ubuntu; tools/device_check.sh unpacks it, with
# Python's lzma where xz is missing.  Fails when FILE would exceed
# RI_BUNDLE_MAX_BYTES (default 64 MiB, what a carry to the device takes).
#
# DIR/run.sh PROGRAM [ARGS]   runs DIR/bin/PROGRAM with LD_LIBRARY_PATH=DIR/lib
#                             (and RI_BUILD_DIR=DIR, where programs look for
#                             each other)
# DIR/MANIFEST                the commit, the programs, the libraries
# Kept from the machine: libc, libm, libpthread, libdl, librt, the dynamic
# loader (they must match the kernel's C library) and libcuda (the driver's).
# Exit: 0; 1 when a required program is not built, a library is not found,
# or the archive is over its bound.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ARCHIVE=""
if [ "${1:-}" = --archive ]; then
  [ $# -ge 2 ] || { echo "usage: tools/bundle.sh [--archive FILE] DIR [BUILD]" >&2; exit 2; }
  ARCHIVE="$2"
  shift 2
fi
[ $# -ge 1 ] || { echo "usage: tools/bundle.sh [--archive FILE] DIR [BUILD]" >&2; exit 2; }
DIR="$1"
BUILD="${2:-${RI_BUILD_DIR:-$ROOT/build}}"
REQUIRED=(bin/ri-kvstore bin/ri-worker bin/ri-bench-dev)
OPTIONAL=(tests/test_model_dev tests/test_kn_xcheck_cuda bin/ri-bench-cuda)
# what the machine keeps: the C library's parts, the loader, the driver
SYSTEM='^(linux-vdso|linux-gate|libc|libm|libpthread|libdl|librt|ld-linux[^.]*|libcuda)\.so'

die() { echo "bundle: $*" >&2; exit 1; }

mkdir -p "$DIR/bin" "$DIR/lib"
DIR="$(cd "$DIR" && pwd)"
progs=()
for p in "${REQUIRED[@]}"; do
  [ -x "$BUILD/$p" ] || die "$BUILD/$p is not built"
  progs+=("$BUILD/$p")
done
for p in "${OPTIONAL[@]}"; do
  [ -x "$BUILD/$p" ] && progs+=("$BUILD/$p")
done
for p in "${progs[@]}"; do
  cp -f "$p" "$DIR/bin/"
done

# copy_deps FILE...: the non-system libraries FILE loads, into DIR/lib
copy_deps() {
  local out
  out="$(ldd "$@" 2>/dev/null || true)"
  if grep -q 'not found' <<<"$out"; then
    grep 'not found' <<<"$out" | sort -u >&2
    die "a library is not found on this machine"
  fi
  awk '/=> \//{print $3} /^\t\//{print $1}' <<<"$out" | sort -u | while read -r lib; do
    base="$(basename "$lib")"
    [[ "$base" =~ $SYSTEM ]] && continue
    [ -e "$DIR/lib/$base" ] || cp -L "$lib" "$DIR/lib/$base"
  done
}
copy_deps "$DIR"/bin/*

# UCX loads its transports (shared memory, cma, verbs, ...) from ucx/ beside
# libucs: bring them and what they load, where this machine has them.
# (awk reads to the end: an early exit could kill ldd with SIGPIPE, and
# under pipefail and set -e that ended the script silently with status 1)
ucs="$(ldd "$DIR/bin/ri-kvstore" | awk '/libucs\.so/ && !found {print $3; found = 1}')"
if [ -n "$ucs" ] && [ -d "$(dirname "$ucs")/ucx" ]; then
  mkdir -p "$DIR/lib/ucx"
  for m in "$(dirname "$ucs")"/ucx/*.so*; do
    # a module whose own libraries are missing here (e.g. CUDA's) stays out;
    # the version links stay links
    if ldd "$m" 2>/dev/null | grep -q 'not found'; then continue; fi
    cp -P "$m" "$DIR/lib/ucx/"
  done
  ls "$DIR"/lib/ucx/*.so* >/dev/null 2>&1 && copy_deps "$DIR"/lib/ucx/*.so*
fi

cat >"$DIR/run.sh" <<'SH'
#!/bin/sh
# Run a bundled program: ./run.sh PROGRAM [ARGS]  (ls bin/ for the programs)
d="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 PROGRAM [ARGS]; programs: $(ls "$d/bin" | tr '\n' ' ')" >&2; exit 2; }
p="$1"
shift
export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RI_BUILD_DIR="$d"
exec "$d/bin/$p" "$@"
SH
chmod +x "$DIR/run.sh"

{
  echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "bundled $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) from $BUILD"
  echo "programs: $(ls "$DIR/bin" | tr '\n' ' ')"
  echo "libraries: $(ls "$DIR/lib" | grep -v '^ucx$' | tr '\n' ' ')"
  [ -d "$DIR/lib/ucx" ] && echo "ucx modules: $(ls "$DIR/lib/ucx" | tr '\n' ' ')"
} >"$DIR/MANIFEST"
echo "bundle: $(ls "$DIR/bin" | wc -l) programs, $(ls "$DIR/lib" | grep -vc '^ucx$') libraries, $(du -sh "$DIR" | cut -f1) in $DIR"

if [ -n "$ARCHIVE" ]; then
  command -v xz >/dev/null || die "--archive needs xz (xz-utils)"
  max="${RI_BUNDLE_MAX_BYTES:-67108864}"
  tar -C "$(dirname "$DIR")" -cf - "$(basename "$DIR")" | xz -T0 "-${XZ_LEVEL:-6}" >"$ARCHIVE.tmp"
  mv -f "$ARCHIVE.tmp" "$ARCHIVE"
  bytes="$(stat -c %s "$ARCHIVE")"
  echo "bundle: archive $ARCHIVE, $bytes bytes (folder $(du -sb "$DIR" | cut -f1) bytes)"
  [ "$bytes" -le "$max" ] || die "the archive ($bytes bytes) is over $max bytes"
fi
