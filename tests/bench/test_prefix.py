#!/usr/bin/env python3
"""ri bench prefix, small: a real ri-kvstore and ri-worker (SmolLM2,
retroinfer-remote), a 1,536-token document, one warm and one cold request.
Checks the report's shape and what the bench claims to measure: the warm
request reports the document's attachable blocks as cached (the whole
1,280 tokens of its five blocks), the cold one none, and the memory
figures are there.  Not that the numbers are good (that is the bench's
job).  Skipped (77) without the model.  About 40 s."""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "prefix", "prefix.py")
model = os.environ.get("RI_TEST_MODEL") or os.path.join(
    os.environ.get("RI_MODEL_DIR", os.path.expanduser("~/.cache/retroinfer/models")), "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.path.isfile(model):
    print("skip: no model at " + model)
    sys.exit(77)
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "prefix.json")
    r = subprocess.run([sys.executable, BENCH, "--model", model, "--doc-tokens", "1536", "--question-tokens", "16",
                        "--clients", "1", "--cold-clients", "1", "--max-tokens", "4", "--json", out,
                        "--build", os.environ.get("RI_BUILD_DIR", "build")], capture_output=True, text=True,
                       timeout=600)
    print(r.stdout[-3000:], r.stderr[-2000:])
    if r.returncode != 0:
        sys.exit("FAIL: the bench exited %d" % r.returncode)
    doc = json.load(open(out))
bad = []
check = lambda cond, what: cond or bad.append(what)
check(doc.get("bench") == "prefix", "bench is 'prefix'")
check(re.fullmatch(r"[0-9a-f]{40}(-dirty)?", str(doc.get("git"))) is not None, "git is a commit")
for k in ("cpu", "cores", "load_avg", "load_avg_end"):
    check(k in doc.get("machine", {}), "machine." + k)
rows = {(r["server"], r["case"], r["clients"]): r for r in doc.get("rows", [])}
warm, cold = rows.get(("ri-worker", "warm", 1)), rows.get(("ri-worker", "cold", 1))
check(warm is not None and cold is not None, "a warm and a cold row")
if warm and cold:
    for r in (warm, cold):
        for k in ("ttft_p50_ms", "ttft_max_ms", "e2e_tok_s", "load_avg", "tokens", "seconds"):
            check(isinstance(r.get(k), (int, float)), "%s.%s is a number" % (r["case"], k))
        check(r["errors"] == 0, "%s: no errors" % r["case"])
    # (1536 + 16 - 64) // 256 = 5 blocks wholly in the indexed range
    check(warm["cached_tokens_median"] == 1280, "warm: 1280 cached tokens (%r)" % warm["cached_tokens_median"])
    check(cold["cached_tokens_median"] == 0, "cold: nothing cached (%r)" % cold["cached_tokens_median"])
ratios = [x for x in doc.get("ratios", []) if x.get("server") == "ri-worker" and x.get("clients") == 1]
check(len(ratios) == 1 and ratios[0]["ttft_cold_over_warm"] > 0, "a cold/warm ratio")
mem = doc.get("memory", {})
for k in ("pool_used_one_copy", "pool_growth_over_one_copy", "worker_anon_growth_per_client_decoding"):
    check(k in mem, "memory." + k)
check(mem.get("pool_used_one_copy", 0) > 0, "publishing took pool memory")
if bad:
    print("FAIL:\n  " + "\n  ".join(bad))
    sys.exit(1)
print("ok")
