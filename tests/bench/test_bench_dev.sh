#!/bin/sh
# ri-bench-dev on the CPU with the tiny synthetic preset (no model files,
# no GPU): every context x batch x method has a row with sane figures, the
# report names the device, preset and machine, and bad options are refused.
# Then --device cuda: skipped (77) without a CUDA device or in a build
# without one; where there is one, its rows are checked the same way (full
# and retroinfer, whose device sequences are indexed at the first step).
# A few seconds.
set -u
bin="$RI_BUILD_DIR/bin"
[ -x "$bin/ri-bench-dev" ] || { echo "skip: ri-bench-dev not built"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

check() {   # check JSON DEVICE METHODS
  python3 - "$1" "$2" "$3" <<'PY' || exit 1
import json, math, sys
doc = json.load(open(sys.argv[1]))
device, methods = sys.argv[2], sys.argv[3].split(",")
bad = []
if doc.get("bench") != "dev" or doc.get("device") != device or doc.get("preset") != "tiny":
    bad.append("header %r" % {k: doc.get(k) for k in ("bench", "device", "preset")})
if not doc.get("weight_bytes", 0) > 0 or "load_avg" not in doc.get("machine", {}):
    bad.append("no weight_bytes or machine.load_avg")
rows = {(r["attn"], r["context"], r["batch"]): r for r in doc["rows"]}
for m in methods:
    for ctx in (300, 1024):
        for b in (1, 3):
            r = rows.get((m, ctx, b))
            if r is None:
                bad.append("no row %s ctx %d batch %d" % (m, ctx, b))
                continue
            for k in ("decode_tok_s", "step_ms", "full_gbs", "first_step_ms", "load_avg", "exact_tokens_per_step",
                      "build_ms", "held_bytes"):
                if not (isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) and r[k] >= 0):
                    bad.append("%s %d %d: bad %s %r" % (m, ctx, b, k, r.get(k)))
            if not r["decode_tok_s"] > 0 or r["samples"] != 3:
                bad.append("%s %d %d: %r" % (m, ctx, b, r))
            # tok/s is the batch over the median step
            if abs(r["decode_tok_s"] * r["step_ms"] / 1e3 - b) > 1e-6 * b:
                bad.append("%s %d %d: tok/s %g does not match step %g ms" % (m, ctx, b, r["decode_tok_s"], r["step_ms"]))
            # a step attends at most every token it holds, and the sequences hold their K/V
            if not 0 < r["exact_tokens_per_step"] <= ctx + 8 or not r["held_bytes"] > 0:
                bad.append("%s %d %d: exact %r, held %r" % (m, ctx, b, r["exact_tokens_per_step"], r["held_bytes"]))
            if m != "full" and not r.get("vs_full", 0) > 0:
                bad.append("%s %d %d: no vs_full" % (m, ctx, b))
print("\n".join(bad) if bad else "report ok: %d rows" % len(doc["rows"]))
sys.exit(1 if bad else 0)
PY
}

"$bin/ri-bench-dev" --device cpu --preset tiny --contexts 300,1K --batch 1,3 --steps 3 \
  --json "$tmp/cpu.json" > "$tmp/cpu.txt" 2>&1 || { cat "$tmp/cpu.txt"; fail "cpu run exited $?"; }
cat "$tmp/cpu.txt"
grep -q '^retroinfer *1024 *3 ' "$tmp/cpu.txt" || fail "no retroinfer line in the table"
check "$tmp/cpu.json" cpu full,retroinfer

# refusals: a preset too large for the CPU path, an unknown preset, a bad batch
"$bin/ri-bench-dev" --device cpu --preset llama3-8b --contexts 300 > "$tmp/big.txt" 2>&1
[ $? -eq 2 ] && grep -q 'GGUF files are for presets under' "$tmp/big.txt" || fail "llama3-8b on the cpu not refused"
"$bin/ri-bench-dev" --device cpu --preset nope > /dev/null 2>&1
[ $? -eq 2 ] || fail "unknown preset not refused"
"$bin/ri-bench-dev" --device cpu --preset tiny --batch 9 > /dev/null 2>&1
[ $? -eq 2 ] || fail "batch 9 not refused"

"$bin/ri-bench-dev" --device cuda --preset tiny --contexts 300,1K --batch 1,3 --steps 3 --attn full,retroinfer \
  --json "$tmp/cuda.json" > "$tmp/cuda.txt" 2>&1
rc=$?
cat "$tmp/cuda.txt"
case $rc in
  77) grep -q '^skip: ' "$tmp/cuda.txt" || fail "exit 77 without a skip line"
      echo "cuda: skipped (no CUDA device here)" ;;
  0) check "$tmp/cuda.json" cuda full,retroinfer ;;
  *) fail "cuda run exited $rc" ;;
esac
echo "ok"
