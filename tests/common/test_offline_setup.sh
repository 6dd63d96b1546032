#!/bin/sh
# Offline set-up: in a network namespace without a network and with an empty
# model cache, the model hook reports the failed download once and exits 0
# (so `./ri test` goes on), a test that needs the model then skips (77) naming
# the missing file, RI_MODEL_REQUIRED=1 (./ri demo) makes the failure fatal,
# and a wrong model file present is an error.  Skipped (77) where no network
# namespace can be made (not root).
set -u
src="${RI_SOURCE_DIR:?}"
unshare -n true 2>/dev/null || { echo "skip: cannot make a network namespace here (needs root)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
hook="$src/deps/setup.d/10-model.sh"
# PIP_RETRIES=0: fail at once (pip backs off between retries for ~10 s).
offline() { unshare -n env PIP_RETRIES=0 HOME="$tmp/home" RI_MODEL_DIR="$tmp/models" "$@"; }

offline bash "$hook" > "$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[ "$rc" -eq 0 ] || { echo "FAIL: the model hook exited $rc offline (setup would stop)"; exit 1; }
n=$(grep -c "warning: could not download" "$tmp/out")
[ "$n" -eq 1 ] || { echo "FAIL: the failed download was reported $n times, not once"; exit 1; }
grep -q "will be skipped" "$tmp/out" || { echo "FAIL: the hook does not say what will be skipped"; exit 1; }
[ ! -e "$tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] || { echo "FAIL: a model file appeared"; exit 1; }

RI_MODEL_DIR="$tmp/models" sh "$src/tests/model/test_generate.sh" > "$tmp/gen" 2>&1
rc=$?
[ "$rc" -eq 77 ] || { cat "$tmp/gen"; echo "FAIL: test_generate exited $rc without the model, not 77"; exit 1; }
grep -q "no model at $tmp/models" "$tmp/gen" || { cat "$tmp/gen"; echo "FAIL: the skip does not name the missing file"; exit 1; }

offline env RI_MODEL_REQUIRED=1 bash "$hook" > /dev/null 2>&1 && { echo "FAIL: RI_MODEL_REQUIRED=1 did not make it fatal"; exit 1; }

mkdir -p "$tmp/models"
echo junk > "$tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf"
offline bash "$hook" > "$tmp/bad" 2>&1 && { cat "$tmp/bad"; echo "FAIL: a wrong model file passed offline"; exit 1; }
grep -q "is not the pinned model" "$tmp/bad" || { cat "$tmp/bad"; echo "FAIL: no message for a wrong model file"; exit 1; }
echo "ok"
