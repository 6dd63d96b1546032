#!/usr/bin/env bash
# The CUDA backend's device check (docs/cuda.md), for a GPU machine without
# internet, from the repository alone (plus, where the machine lacks the
# build's packages, the carried build outputs below).  About 3-6 minutes:
#
#   1. build the CUDA parts for sm_90 (only test_kn_xcheck_cuda,
#      test_model_dev and ri-bench-cuda) in $RI_DEVICE_BUILD (default
#      ./build-device)
#   2. the cross-check harness with the cuda backend registered (every op
#      against the reference at the harness's awkward shapes, with --slow:
#      also N = 131072)
#   2b. test_model_dev: the GPU decode path (gpuworker/model/mdl_dev.h)
#      against the CPU runtime: its GEMV at awkward shapes, two synthetic
#      models the test writes itself (llama, gemma3), then SmolLM2 and
#      Gemma 3 logits over 8 greedy steps (each only where it is installed:
#      $RI_MODEL_DIR or ~/.cache/retroinfer/models; a missing one is
#      reported as NOT RUN), and the time of a device step
#   3. ri-bench-cuda: HBM bandwidth (read kernel, device-to-device copy), the
#      device index build, full / tripartite / Quest decode at 128K and 1M
#      with the K/V in HBM, and the wave object with the cuda table at 32K
#   3c. the synthetic model from the bundle (tools/bundle.sh, tools/device_synth.sh):
#      the bundled ri-kvstore and ri-worker --device cuda on a tiny synthetic
#      GGUF decoding a few tokens, then ri-bench-dev --preset llama3-8b at
#      32K (batch 1 and 4); skipped with RI_SKIP_SYNTH=1 or without a bundle
#   4. a short table of timings; logs and JSON under $OUT (default ./device-out)
#
# Usage:
#   tools/device_check.sh               build (or use the carried binaries), run
#   tools/device_check.sh --build-only  build and gather the carried set, run
#                                       nothing (works on a machine without GPU)
# Environment: OUT, RI_DEVICE_BUILD, RI_JOBS (default: all CPUs),
#              CUDA_ARCH (default 90), RI_DEVICE_BENCH_ARGS (extra bench flags),
#              RI_XCHECK_TIMEOUT / RI_MODEL_DEV_TIMEOUT / RI_SYNTH_TIMEOUT /
#              RI_BENCH_TIMEOUT (seconds per stage: 120 / 90 / 150 / 120, so
#              that the whole check stays within about 8 minutes and a short
#              lease can cap each), RI_BUNDLE (default $RI_DEVICE_BUILD/bundle;
#              unpacked from $RI_BUNDLE.tar.xz when that is newer),
#              RI_SKIP_SYNTH=1, RI_SANITIZE=1 (then also the harness without
#              --slow under compute-sanitizer memcheck, where it is installed),
#              RI_PROFILE=1 (then also Nsight Compute's time of each decode
#              kernel over one round of the bench at 128K and at 1M, where
#              ncu is installed: ncu-128k.txt, ncu-1m.txt).
# Exit: 0 all passed; 1 something failed; 77 no CUDA device (nothing ran).
#
# The carried set (when the device machine lacks cmake, the CUDA toolkit or
# one of the -dev packages of deps/apt.txt that the top-level CMakeLists.txt
# requires): run `tools/device_check.sh --build-only` on a machine that has
# them, then carry
#   build-device/bundle.tar.xz              (~17 MB: tools/bundle.sh --archive)
# It holds every program the check runs (test_kn_xcheck_cuda,
# test_model_dev, ri-bench-cuda, ri-kvstore, ri-worker, ri-bench-dev) and
# the shared libraries they need beyond the C library (the CUDA runtime is
# linked statically).  On the device the script unpacks it (xz, or Python's
# lzma where xz is missing), runs those binaries and says so.  The older
# carried set (build-device/tests/..., bin/ri-bench-cuda, carry-lib,
# device-build.txt; the folder build-device/bundle) is still taken.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/device-out}"
BUILD="${RI_DEVICE_BUILD:-$ROOT/build-device}"
JOBS="${RI_JOBS:-$(nproc 2>/dev/null || echo 4)}"
ARCH="${CUDA_ARCH:-90}"
XCHECK="$BUILD/tests/test_kn_xcheck_cuda"
BENCH="$BUILD/bin/ri-bench-cuda"
DEVTEST="$BUILD/tests/test_model_dev"
BUNDLE="${RI_BUNDLE:-$BUILD/bundle}"
BUILD_ONLY=0

case "${1:-}" in
  --build-only) BUILD_ONLY=1 ;;
  "") ;;
  *) echo "usage: tools/device_check.sh [--build-only]" >&2; exit 2 ;;
esac

log() { printf '[device_check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[device_check] FAILED: %s\n' "$*" >&2; exit 1; }

START=$(date +%s)
mkdir -p "$OUT"

# unpack_bundle: $BUNDLE.tar.xz (one top folder, $BUNDLE's name) into
# $BUNDLE's parent, replacing an older $BUNDLE; with xz, else Python's lzma.
unpack_bundle() {
  local archive="$BUNDLE.tar.xz" parent
  [ -f "$archive" ] || return 0
  [ -x "$BUNDLE/run.sh" ] && [ ! "$archive" -nt "$BUNDLE/MANIFEST" ] && return 0
  parent="$(dirname "$BUNDLE")"
  rm -rf "$BUNDLE"
  if command -v xz >/dev/null; then
    xz -dc "$archive" | tar -C "$parent" -xf - || die "cannot unpack $archive"
  elif command -v python3 >/dev/null; then
    python3 -c 'import sys, tarfile
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], **kw)' "$archive" "$parent" \
      || die "cannot unpack $archive (python3)"
  else
    die "cannot unpack $archive: neither xz nor python3 here"
  fi
  touch "$BUNDLE/MANIFEST"
  log "unpacked $archive ($(du -sh "$BUNDLE" | cut -f1)): $(sed -n 1p "$BUNDLE/MANIFEST")"
}

# ---- 1. what the build needs ----
missing=()
command -v cmake >/dev/null || missing+=("cmake (>= 3.20)")
command -v cc >/dev/null || missing+=("a C compiler (build-essential)")
command -v pkg-config >/dev/null || missing+=("pkg-config")
NVCC="$(command -v nvcc || true)"
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -n "$NVCC" ] || missing+=("nvcc (the CUDA toolkit)")
if command -v pkg-config >/dev/null; then
  # what the top-level CMakeLists.txt requires (package names as in deps/apt.txt)
  for m in grpc:libgrpc-dev libprotobuf-c:libprotobuf-c-dev ucx:libucx-dev liburing:liburing-dev \
           cmocka:libcmocka-dev inih:libinih-dev libcjson:libcjson-dev libisal:libisal-dev \
           libmicrohttpd:libmicrohttpd-dev; do
    pkg-config --exists "${m%%:*}" || missing+=("${m#*:}")
  done
fi
command -v protoc-c >/dev/null || command -v protoc >/dev/null || missing+=("protobuf-c-compiler")

build() {
  local args=(-DCMAKE_BUILD_TYPE=Release -DRI_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH"
              "-DCMAKE_CUDA_COMPILER=$NVCC")
  log "configure $BUILD (sm_$ARCH, $NVCC)"
  cmake -S "$ROOT" -B "$BUILD" "${args[@]}" >"$OUT/cmake.log" 2>&1 \
    || { tail -20 "$OUT/cmake.log" >&2; die "cmake configure failed (log: $OUT/cmake.log)"; }
  log "build test_kn_xcheck_cuda test_model_dev ri-bench-cuda ri-kvstore ri-worker ri-bench-dev (-j$JOBS)"
  cmake --build "$BUILD" -j "$JOBS" --target test_kn_xcheck_cuda test_model_dev ri-bench-cuda \
    ri-kvstore ri-worker ri-bench-dev >"$OUT/build.log" 2>&1 \
    || { grep -E 'error|Error' "$OUT/build.log" | head -20 >&2; die "build failed (log: $OUT/build.log)"; }
  rm -rf "$BUILD/bundle" "$BUILD/bundle.tar.xz"
  # the archive only for carrying (--build-only): xz takes half a minute
  local archive=()
  [ "$BUILD_ONLY" = 1 ] && archive=(--archive "$BUILD/bundle.tar.xz")
  bash "$ROOT/tools/bundle.sh" "${archive[@]}" "$BUILD/bundle" "$BUILD" >"$OUT/bundle.log" 2>&1 \
    || { cat "$OUT/bundle.log" >&2; die "tools/bundle.sh failed"; }
  if grep -qiE 'warning' "$OUT/build.log"; then
    log "the build printed warnings (see $OUT/build.log)"
  fi
  # the carried set: shared libraries beyond the C/C++ runtime, and a stamp
  rm -rf "$BUILD/carry-lib"
  mkdir -p "$BUILD/carry-lib"
  { ldd "$XCHECK" "$BENCH" "$DEVTEST" 2>/dev/null || true; } | awk '/=> \//{print $3}' | sort -u |
    { grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' || true; } |
    while read -r lib; do cp -L "$lib" "$BUILD/carry-lib/"; done
  local dirty=""
  if git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1 &&
     ! git -C "$ROOT" diff --quiet HEAD -- kernels gpuworker bench tests cmake CMakeLists.txt; then
    dirty=" + uncommitted changes"
  fi
  { echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$dirty";
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) for sm_$ARCH with $("$NVCC" --version | tail -1)"; } \
    >"$BUILD/device-build.txt"
}

if [ ${#missing[@]} -eq 0 ]; then
  build
elif [ "$BUILD_ONLY" = 1 ]; then
  die "cannot build here; missing: ${missing[*]}"
elif [ -x "$XCHECK" ] && [ -x "$BENCH" ]; then
  unpack_bundle
  log "cannot build here (missing: ${missing[*]}); using the carried binaries:"
  sed 's/^/    /' "$BUILD/device-build.txt" 2>/dev/null || log "    (no device-build.txt: unknown origin)"
elif unpack_bundle && [ -x "$BUNDLE/bin/test_kn_xcheck_cuda" ] && [ -x "$BUNDLE/bin/ri-bench-cuda" ]; then
  XCHECK="$BUNDLE/bin/test_kn_xcheck_cuda"
  BENCH="$BUNDLE/bin/ri-bench-cuda"
  DEVTEST="$BUNDLE/bin/test_model_dev"
  mkdir -p "$BUILD"
  [ -f "$BUILD/device-build.txt" ] || sed -n 1p "$BUNDLE/MANIFEST" >"$BUILD/device-build.txt"
  log "cannot build here (missing: ${missing[*]}); using the bundle's binaries ($BUNDLE):"
  sed -n '1,2p' "$BUNDLE/MANIFEST" | sed 's/^/    /'
else
  die "cannot build (missing: ${missing[*]}) and no carried binaries in $BUILD; on a machine with them run 'tools/device_check.sh --build-only' and carry build-device/bundle.tar.xz"
fi
log "built: $(sed -n 1p "$BUILD/device-build.txt" 2>/dev/null || echo '?') ($(( $(date +%s) - START )) s so far)"
if [ "$BUILD_ONLY" = 1 ]; then
  du -sh "$BUILD/bundle.tar.xz" "$BUILD/bundle" | sed 's/^/    /'
  exit 0
fi
export LD_LIBRARY_PATH="$BUILD/carry-lib:$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 2. a device? ----
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1 || true
  log "nvidia-smi: $(head -1 "$OUT/gpu.txt")"
fi

# ---- 3. the cross-check harness on the device ----
log "test_kn_xcheck_cuda --slow (the unit cases plus N = 131072)"
set +e
timeout "${RI_XCHECK_TIMEOUT:-120}" "$XCHECK" --slow >"$OUT/xcheck.log" 2>&1
xc_rc=$?
set -e
if [ "$xc_rc" = 77 ]; then
  if [ -s "$OUT/gpu.txt" ] && ! grep -qiE 'fail|error|not found' "$OUT/gpu.txt"; then
    # nvidia-smi sees a GPU the CUDA runtime does not: usually a driver older
    # than the toolkit the binaries were built with (the runtime is static)
    cat "$OUT/xcheck.log" >&2
    die "nvidia-smi lists a GPU but the CUDA runtime found none (see above; the build used $(sed -n 2p "$BUILD/device-build.txt" 2>/dev/null || echo 'an unknown toolkit'))"
  fi
  echo "no CUDA device here: the harness skipped (exit 77); nothing measured" | tee "$OUT/NO_DEVICE"
  exit 77
fi
log "test_kn_xcheck_cuda exit $xc_rc ($(grep -cE '^FAIL' "$OUT/xcheck.log" || true) FAIL lines; log $OUT/xcheck.log)"
grep -E 'cuda +[a-z_]+ +checked' "$OUT/xcheck.log" | sed 's/^/    /' || true

# ---- 3b. the GPU decode path against the CPU runtime ----
# (before the bench, so that a bench that overruns cannot cost its result)
md_rc=""   # empty: not run (a carried set from before the test existed)
md_summary="not run (no $DEVTEST in the carried set)"
if [ -x "$DEVTEST" ]; then
  log "test_model_dev (GEMV at awkward shapes; SmolLM2 and Gemma 3 decode vs the CPU)"
  set +e
  timeout "${RI_MODEL_DEV_TIMEOUT:-90}" "$DEVTEST" >"$OUT/model-dev.log" 2>&1
  md_rc=$?
  set -e
  md_failed="$(grep -oE '^\[  FAILED  \] test_[a-z0-9_]+' "$OUT/model-dev.log" | sed 's/.*\] //' | sort -u |
    paste -sd ',' - || true)"
  md_summary="exit $md_rc${md_failed:+ (failed: $md_failed)}; $(grep -E '^model cross-check' "$OUT/model-dev.log" |
    sed 's/ (no model at.*)//; s/model cross-check //' | paste -sd ';' - || true)"
  log "test_model_dev $md_summary (log $OUT/model-dev.log)"
fi

# ---- 3c. the synthetic model from the bundle ----
syn_rc=""
syn_summary="not run (RI_SKIP_SYNTH=1)"
if [ "${RI_SKIP_SYNTH:-0}" != 1 ]; then
  if [ -x "$BUNDLE/run.sh" ]; then
    log "synthetic model from the bundle: ri-kvstore + ri-worker --device cuda (tiny, retroinfer), ri-bench-dev llama3-8b full,retroinfer at 32K and 128K"
    set +e
    timeout "${RI_SYNTH_TIMEOUT:-150}" bash "$ROOT/tools/device_synth.sh" "$BUNDLE" "$OUT" cuda >"$OUT/synth.log" 2>&1
    syn_rc=$?
    set -e
    syn_summary="exit $syn_rc; $(grep -E '^worker on' "$OUT/synth.log" | head -1 || true)"
  else
    syn_summary="not run (no bundle at $BUNDLE: tools/bundle.sh)"
  fi
  log "synthetic model: $syn_summary (log $OUT/synth.log)"
fi

# ---- 4. bandwidth and the decode bench on the device ----
log "ri-bench-cuda (128K, 1M; wave object at 32K)"
set +e
# shellcheck disable=SC2086
timeout "${RI_BENCH_TIMEOUT:-120}" "$BENCH" --json "$OUT/bench-cuda.json" ${RI_DEVICE_BENCH_ARGS:-} >"$OUT/bench-cuda.log" 2>&1
bn_rc=$?
set -e
log "ri-bench-cuda exit $bn_rc (log $OUT/bench-cuda.log)"

# ---- 4b. out-of-bounds and race checks (optional) ----
san_summary="not run (RI_SANITIZE unset)"
if [ "${RI_SANITIZE:-0}" = 1 ]; then
  if command -v compute-sanitizer >/dev/null; then
    log "compute-sanitizer --tool memcheck test_kn_xcheck_cuda"
    set +e
    timeout "${RI_SANITIZE_TIMEOUT:-120}" compute-sanitizer --tool memcheck --error-exitcode 3 \
      "$XCHECK" >"$OUT/sanitize.log" 2>&1
    san_rc=$?
    set -e
    san_summary="memcheck exit $san_rc; $(grep -E 'ERROR SUMMARY' "$OUT/sanitize.log" | tail -1 || true)"
  else
    san_summary="not run (no compute-sanitizer on this machine)"
  fi
  log "sanitizer: $san_summary"
fi

# ---- 4c. per-kernel device times (optional) ----
prof_summary="not run (RI_PROFILE unset)"
if [ "${RI_PROFILE:-0}" = 1 ]; then
  if command -v ncu >/dev/null; then
    prof_summary=""
    for n in 131072 1048576; do
      f="$OUT/ncu-$([ $n = 131072 ] && echo 128k || echo 1m).txt"
      log "ncu: decode kernels at N = $n"
      set +e
      # the decode kernels only (not the index build's), clocks as they are
      timeout "${RI_PROFILE_TIMEOUT:-120}" ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        -k 'regex:kn_cu_(w_|decode|split_merge|logits|head_stats|score|est_|quest)|Segmented' \
        --print-summary per-kernel "$BENCH" --only "$n" --rounds 1 --steps 1 --wave-n 0 >"$f" 2>&1
      prof_summary="$prof_summary N=$n: exit $?;"
      set -e
    done
  else
    prof_summary="not run (no ncu on this machine)"
  fi
  log "ncu: $prof_summary"
fi

# ---- 5. the table ----
echo
echo "== device check: $(sed -n 1p "$BUILD/device-build.txt" 2>/dev/null), $(head -1 "$OUT/gpu.txt" 2>/dev/null || echo 'device ?') =="
grep -E '^(cuda:|index_build|full|tripartite|quest|wave object)' "$OUT/bench-cuda.log" || echo "(no bench figures: see $OUT/bench-cuda.log)"
echo "GPU decode path (test_model_dev): $md_summary"
echo "synthetic model (bundle): $syn_summary"
grep -E '^(full|retroinfer) ' "$OUT/bench-dev.log" 2>/dev/null | sed 's/^/    ri-bench-dev llama3-8b: /' || true
echo "compute-sanitizer: $san_summary"
echo "ncu: $prof_summary"
grep -E '^device decode' "$OUT/model-dev.log" 2>/dev/null | sed 's/^/    /' || true
echo "cross-check harness: exit $xc_rc; bench: exit $bn_rc; $(( $(date +%s) - START )) s in all"
cat >"$OUT/device-check.json" <<EOF
{"commit": "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)",
 "arch": "sm_$ARCH", "xcheck_rc": $xc_rc, "bench_rc": $bn_rc, "model_dev_rc": ${md_rc:-null},
 "synth_rc": ${syn_rc:-null}, "bench_dev_json": "bench-dev.json",
 "seconds": $(( $(date +%s) - START )), "bench_json": "bench-cuda.json"}
EOF
[ "$xc_rc" = 0 ] && [ "$bn_rc" = 0 ] && { [ -z "$md_rc" ] || [ "$md_rc" = 0 ]; } &&
  { [ -z "$syn_rc" ] || [ "$syn_rc" = 0 ]; } || exit 1
exit 0
