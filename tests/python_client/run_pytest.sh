#!/bin/sh
# ctest entry python_client: build and install the Python client the way a
# user does (pip, from a copy of the repository layout, so the proto is found
# where `pip install ./clients/python` finds it), without network (no index,
# no build isolation, no dependencies: ./ri setup installed them), into a
# folder of the build directory, then run clients/python/tests with pytest
# against the daemon given as $1 (passed on as RI_KVSTORE).
#
# Exit: 0 all passed; 1 a failure, or pytest ran no test (its exit 5), or a
# test skipped; 77 (skipped) when grpcio / grpcio-tools / pytest are missing
# (offline set-up), or without openssl, after the tests that need no
# certificates passed (the TLS cases then did not run, so this is no pass).
set -u
daemon="${1:?usage: run_pytest.sh PATH/ri-kvstore}"
src="${RI_SOURCE_DIR:?}"
build="${RI_BUILD_DIR:?}"
py="${RI_PYTHON:-python3}"

[ -x "$daemon" ] || { echo "FAIL: $daemon is not built"; exit 1; }
command -v "$py" >/dev/null 2>&1 || { echo "skip: no $py"; exit 77; }
missing="$("$py" - <<'PY'
import importlib.util
need = {"grpc": "grpcio", "grpc_tools": "grpcio-tools", "pytest": "pytest", "setuptools": "setuptools",
        "wheel": "wheel"}
print(" ".join(p for m, p in need.items() if importlib.util.find_spec(m) is None))
PY
)" || { echo "FAIL: $py does not run"; exit 1; }
if [ -n "$missing" ]; then
  echo "skip: Python packages missing: $missing (./ri setup installs them with pip; offline?)"
  exit 77
fi

work="$build/python-client"
rm -rf "$work"
mkdir -p "$work/repo/clients" "$work/repo/proto" || exit 1
cp -R "$src/clients/python" "$work/repo/clients/python" || exit 1
# what an earlier in-place build or editable install left there, stale stubs
# included: the stubs must come from this build
(cd "$work/repo/clients/python" && rm -rf build ./*.egg-info retroinfer/_proto/retroinfer*.py \
   retroinfer/_proto/retroinfer*.pyi retroinfer/_proto/retroinfer.proto)
cp "$src/proto/retroinfer.proto" "$work/repo/proto/" || exit 1
if ! "$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-build-isolation \
       --target "$work/site" "$work/repo/clients/python" > "$work/pip.log" 2>&1; then
  cat "$work/pip.log"
  echo "FAIL: pip install of clients/python failed"
  exit 1
fi
[ -f "$work/site/retroinfer/_proto/retroinfer_pb2_grpc.py" ] \
  || { echo "FAIL: the installed package has no generated stubs"; exit 1; }

marker=""
have_openssl=1
if ! command -v openssl >/dev/null 2>&1; then
  have_openssl=0
  marker="not tls"
fi
cd "$work" || exit 1
PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" RI_KVSTORE="$daemon" RI_PYTEST_NO_SKIP=1 PYTHONDONTWRITEBYTECODE=1 \
  "$py" -m pytest -p no:cacheprovider -rs -v ${marker:+-m "$marker"} "$src/clients/python/tests"
rc=$?
case "$rc" in
  0) ;;
  5) echo "FAIL: pytest collected no tests"; exit 1 ;;
  *) echo "FAIL: pytest exited $rc"; exit 1 ;;
esac
if [ "$have_openssl" = 0 ]; then
  echo "skip: openssl not installed: the TLS and mutual-TLS cases did not run (the others passed)"
  exit 77
fi
exit 0
