#!/usr/bin/env bash
# Test-only Python packages:
# - gguf and numpy: the numpy reference of the model runtime
#   (tests/model/ref_llama.py) reads the GGUF through the registry's `gguf`
#   package;
# - grpcio, grpcio-tools, pytest (+ setuptools and wheel to build the package
#   without network): the Python client in clients/python and its pytest tests
#   against the real daemon (tests/python_client);
# - openai: ri-worker's HTTP service checked with the official client
#   (tests/worker/test_worker_openai.py).
# Installed only when missing; the tests skip (exit 77) without them, so a
# failed install (offline) is reported once and is not fatal
# (RI_PYDEPS_REQUIRED=1 makes it fatal).
# ri-setup-for: test
set -euo pipefail
need=() skips=()
if ! python3 -c 'import gguf, numpy' >/dev/null 2>&1; then
  need+=(gguf numpy)
  skips+=("the tests of the model against its numpy reference")
fi
if ! python3 -c 'import grpc, grpc_tools, pytest, setuptools, wheel' >/dev/null 2>&1; then
  need+=(grpcio grpcio-tools pytest setuptools wheel)
  skips+=("the Python client tests")
fi
# find_spec, not import: importing openai takes ~1 s, and this runs on every ./ri test.
if ! python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("openai") is None)' >/dev/null 2>&1; then
  need+=(openai)
  skips+=("the openai client test")
fi
[ ${#need[@]} -eq 0 ] && exit 0
echo "[pytest-deps] installing ${need[*]} with pip" >&2
python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "${need[@]}" 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check "${need[@]}" \
  || { skipped="$(printf '%s, ' "${skips[@]}")"
       echo "[pytest-deps] warning: pip install ${need[*]} failed (offline? proxy settings?); ${skipped%, } will be skipped" >&2
       [ "${RI_PYDEPS_REQUIRED:-0}" = 1 ] && exit 1
       exit 0; }
