#!/bin/sh
# ri bench ruler --quick through the real SmolLM2 model: one trial of each
# of the six tasks at 1,200 tokens, methods full, retroinfer, quest,
# streaming (and retroinfer-remote through a ri-kvstore when it is built).
# The JSON must have one row per task and method with sane fields (the
# wave methods' rows the cluster size their index used, the report the
# build's commit), and the
# score of every trial must equal an independent re-scoring of its output
# here (so a scorer that always passes or always fails is caught); full
# attention must pass the easy niah_single trial.  Skipped (77) without the
# model.  ./ri plot must draw the file.  About 40 s on 2 idle cores.
set -u
bin="$RI_BUILD_DIR/bin"
model="${RI_TEST_MODEL:-${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
methods="full,retroinfer,quest,streaming"
[ -x "$bin/ri-kvstore" ] && methods="$methods,retroinfer-remote"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$bin/ri-bench-ruler" --quick --model "$model" --methods "$methods" --json "$tmp/r.json" > "$tmp/out.txt" 2>&1
rc=$?
tail -n 40 "$tmp/out.txt"
[ "$rc" -eq 0 ] || { echo "FAIL: ri-bench-ruler exited $rc"; exit 1; }
python3 - "$tmp/r.json" "$methods" <<'PY'
import json, math, re, sys

doc = json.load(open(sys.argv[1]))
methods = sys.argv[2].split(",")
tasks = ["niah_single", "niah_multikey", "niah_multivalue", "vt", "cwe", "qa"]
bad = []


def check(cond, what):
    if not cond:
        bad.append(what)


def wilson(k, n, z=1.959963984540054):
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def found(text, item):
    # case-insensitive, not inside a longer run of letters or digits
    pat = re.escape(item.lower())
    if item[:1].isalnum():
        pat = r"(?<![a-z0-9])" + pat
    if item[-1:].isalnum():
        pat = pat + r"(?![a-z0-9])"
    return re.search(pat, text.lower()) is not None


check(doc.get("bench") == "ruler", "bench is ruler")
# the build's commit (taken at build time), never "unknown"
check(re.fullmatch(r"[0-9a-f]{40}", str(doc.get("git"))) is not None, "git is a commit: %r" % doc.get("git"))
check(isinstance(doc.get("machine", {}).get("load_avg"), (int, float)), "machine.load_avg recorded")
rows = {(r["task"], r["attn"]): r for r in doc["rows"]}
check(len(doc["rows"]) == len(tasks) * len(methods), "%d rows, want %d" % (len(doc["rows"]), len(tasks) * len(methods)))
for t in tasks:
    full = rows.get((t, "full"))
    for m in methods:
        r = rows.get((t, m))
        if r is None:
            bad.append("no row for %s / %s" % (t, m))
            continue
        w = "%s/%s: " % (t, m)
        for f in ("model", "task", "context", "attn", "trials", "passed", "budget_tokens", "pass_rate", "ci_low",
                  "ci_high", "agreement", "prefill_s", "decode_s", "recall", "load_avg"):
            check(f in r, w + "has " + f)
        if not all(f in r for f in ("trials", "passed", "ci_low", "ci_high", "budget_tokens", "agreement")):
            continue
        check(r["trials"] == 1 and 0 <= r["passed"] <= r["trials"], w + "passed within trials")
        check(abs(r["pass_rate"] - r["passed"] / r["trials"]) < 1e-9, w + "pass_rate = passed / trials")
        lo, hi = wilson(r["passed"], r["trials"])
        check(abs(r["ci_low"] - lo) < 1e-6 and abs(r["ci_high"] - hi) < 1e-6,
              w + "Wilson interval %.4f-%.4f, want %.4f-%.4f" % (r["ci_low"], r["ci_high"], lo, hi))
        check(0 <= r["agreement"] <= 1 and 0 <= r["recall"] <= 1, w + "agreement and recall in [0, 1]")
        check(r["prefill_s"] > 0 and r["decode_s"] > 0, w + "times measured")
        check(r["context"] == 1200 and r["budget_tokens"] > 0, w + "context and budget")
        # the cluster size the wave index used: auto resolves to 4 at 1,200 tokens
        if m in ("retroinfer", "retroinfer-remote"):
            check(r.get("tokens_per_cluster") == 4, w + "tokens_per_cluster used %r, want 4" % r.get("tokens_per_cluster"))
        else:
            check("tokens_per_cluster" not in r, w + "no wave index, no tokens_per_cluster")
        if m == "full":
            check(r["agreement"] == 1, w + "full agrees with itself")
            check(r["budget_tokens"] > 1000, w + "full attends the whole prompt (%.0f)" % r["budget_tokens"])
        elif full is not None:
            check(r["budget_tokens"] < 0.5 * full["budget_tokens"],
                  w + "sparse: %.0f exact tokens of %.0f" % (r["budget_tokens"], full["budget_tokens"]))
        if m in ("quest", "streaming") and (t, "retroinfer") in rows:
            rb = rows[(t, "retroinfer")]["budget_tokens"]
            want = rb
            if m == "quest" and full is not None:
                # Quest's first 2 of SmolLM2's 30 layers attend densely (as in
                # its paper); the other 28 run at retroinfer's budget
                want = rb * 28 / 30 + full["budget_tokens"] * 2 / 30
            check(abs(r["budget_tokens"] - want) <= 1.5,
                  w + "budget %.1f = retroinfer's %.1f (%.1f with dense layers)" % (r["budget_tokens"], rb, want))
check(rows.get(("niah_single", "full"), {}).get("passed") == 1, "full attention passes the quick niah_single trial")
outs = doc.get("outputs", [])
check(len(outs) == len(tasks) * len(methods), "one output per trial and method")
for o in outs:
    k = sum(found(o["output"], e) for e in o["expected"])
    check(o["found"] == k and o["pass"] == (k == len(o["expected"])),
          "%s/%s: scored %d found (pass %s), re-scored %d: %r vs %r" % (o["task"], o["attn"], o["found"], o["pass"], k,
                                                                        o["output"], o["expected"]))
    r = rows.get((o["task"], o["attn"]))
    if r:
        check(r["passed"] == int(o["pass"]), "%s/%s: row agrees with its trial" % (o["task"], o["attn"]))
for b in bad:
    print("FAIL:", b)
print("checked %d rows, %d outputs: %s" % (len(doc["rows"]), len(outs), "FAILED" if bad else "ok"))
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || exit 1
# ./ri plot draws the file (tools/plot.py knows the ruler rows); needs gnuplot
if command -v gnuplot >/dev/null 2>&1; then
  python3 "$RI_SOURCE_DIR/tools/plot.py" --out "$tmp/img" "$tmp/r.json" || { echo "FAIL: ri plot failed"; exit 1; }
  [ -s "$tmp/img/r-pass.png" ] || { echo "FAIL: ri plot drew no r-pass.png"; exit 1; }
  echo "ri plot: r-pass.png drawn"
fi
# --prompts-in (the fork engine of ri bench ruler-pkg): a bad line or a
# lone flag is a clear error, and a bad method name is refused
"$bin/ri-bench-ruler" --model "$model" --prompts-in "$tmp/in.jsonl" > "$tmp/e1.txt" 2>&1
[ $? -eq 2 ] && grep -q 'go together' "$tmp/e1.txt" || { echo "FAIL: --prompts-in without --preds-out"; exit 1; }
printf '{"index": 0, "ids": [1, 2], "max_gen": 500}\n' > "$tmp/in.jsonl"
"$bin/ri-bench-ruler" --model "$model" --prompts-in "$tmp/in.jsonl" --preds-out "$tmp/p.jsonl" > "$tmp/e2.txt" 2>&1
[ $? -eq 1 ] && grep -q 'max_gen' "$tmp/e2.txt" && [ ! -s "$tmp/p.jsonl" ] ||
  { cat "$tmp/e2.txt"; echo "FAIL: a bad --prompts-in line"; exit 1; }
"$bin/ri-bench-ruler" --model "$model" --methods retroinfer@ct0 --prompts-in "$tmp/in.jsonl" \
  --preds-out "$tmp/p.jsonl" > "$tmp/e3.txt" 2>&1
[ $? -eq 2 ] && grep -q "unknown method 'retroinfer@ct0'" "$tmp/e3.txt" ||
  { cat "$tmp/e3.txt"; echo "FAIL: retroinfer@ct0 accepted"; exit 1; }
# one good prompt: a line per method, in order, with its counts
printf '{"index": 7, "ids": [1, 2, 3, 4, 5, 6, 7, 8], "max_gen": 4}\n' > "$tmp/in.jsonl"
"$bin/ri-bench-ruler" --model "$model" --methods full,retroinfer@ct8 --prompts-in "$tmp/in.jsonl" \
  --preds-out "$tmp/p.jsonl" > "$tmp/e4.txt" 2>&1 || { cat "$tmp/e4.txt"; echo "FAIL: --prompts-in"; exit 1; }
python3 - "$tmp/p.jsonl" <<'PY' || exit 1
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ok = [l["attn"] for l in lines] == ["full", "retroinfer@ct8"] and all(
    l["index"] == 7 and l["prompt_tokens"] == 8 and 0 < l["completion_tokens"] <= 4 for l in lines)
print("--prompts-in: %s" % ("ok" if ok else "FAIL %r" % lines))
sys.exit(0 if ok else 1)
PY
