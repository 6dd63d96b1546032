#!/usr/bin/env bash
# Test-only Python packages: the numpy reference of the model runtime
# (tests/model/ref_llama.py) reads the GGUF through the registry's `gguf`
# package.  Installed only when missing; the tests skip (exit 77) without them,
# so a failed install (offline) is reported once and is not fatal
# (RI_PYDEPS_REQUIRED=1 makes it fatal).
set -euo pipefail
if python3 -c 'import gguf, numpy' >/dev/null 2>&1; then
  exit 0
fi
echo "[pytest-deps] installing gguf and numpy with pip" >&2
python3 -m pip install --quiet --disable-pip-version-check --break-system-packages gguf numpy 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check gguf numpy \
  || { echo "[pytest-deps] warning: pip install gguf numpy failed (offline? proxy settings?); the tests of the model against its numpy reference will be skipped" >&2
       [ "${RI_PYDEPS_REQUIRED:-0}" = 1 ] && exit 1
       exit 0; }
