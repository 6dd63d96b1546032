#!/usr/bin/env python3
"""ri bench ruler-pkg (bench/ruler/ruler_pkg.py) end to end, small: NVIDIA's
RULER package makes 2 samples each of vt (with its one-shot example) and
fwe at 1024 tokens (the niah generators spend a minute building
wonderwords' adjective-noun list on a busy machine; qa needs more tokens:
its generator adds ten documents at a time) with the worker's tokenizer,
a real ri-worker answers them with full attention, the package's scorer
scores them.  Checks the JSON report's shape (bench, git, machine.load_avg,
one row per task with every field, RULER's average), that every prompt fits
the length with the task's generation, and that scoring ran: each row's
passed (every expected item found) and score (RULER's, with partial credit)
equal an independent re-scoring of the prediction file (substring,
case-insensitive, as RULER).  A second run over the same folder
answers nothing again (resumed from the prediction files).  Then the fork
engine (--engine fork: ri-bench-ruler --prompts-in, one prefill per prompt)
on the same data with full and retroinfer@ct8: its full-attention texts
must equal the worker's, token for token, --check-http must pass, and the
variant gets its own rows.
Exits 77 (skipped) without the package, the model or the binary.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.environ.get("RI_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HARNESS = os.path.join(SRC, "bench", "ruler", "ruler_pkg.py")
TASKS = {"vt": ("string_match_all", 30), "fwe": ("string_match_all", 50)}
failures = []


def check(cond, what):
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def run(out, js, extra=()):
    cmd = [sys.executable, HARNESS, "--model", "smollm2-135m", "--lengths", "1024", "--tasks", ",".join(TASKS),
           "--samples", "2", "--methods", "full", "--threads", "2", "--out", out, "--json", js] + list(extra)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out_text, err_text = p.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        p.terminate()  # the harness stops its ri-worker on SIGTERM
        out_text, err_text = p.communicate()
        print(out_text[-2500:], err_text[-2500:], sep="\n")
        check(False, "the harness finished within 400 s")
        return 1
    print(out_text[-2500:], err_text[-2500:], sep="\n")
    return p.returncode


def rescore(path, metric):
    preds = [json.loads(l) for l in open(path) if l.strip()]
    per, frac = [], []
    for p in preds:
        hits = [r.lower() in p["pred"].strip().lower() for r in p["outputs"]]
        per.append(any(hits) if metric == "string_match_part" else all(hits))
        frac.append(float(any(hits)) if metric == "string_match_part" else sum(hits) / len(hits))
    return sum(per), len(preds), 100.0 * sum(frac) / len(frac)


def check_fork(tmp, http_out):
    """The fork engine over the HTTP run's data: the same texts."""
    out, js = os.path.join(tmp, "fork"), os.path.join(tmp, "f.json")
    shutil.copytree(os.path.join(http_out, "data"), os.path.join(out, "data"))
    rc = run(out, js, ["--engine", "fork", "--check-http", "1", "--methods", "full,retroinfer@ct8"])
    check(rc == 0 and os.path.exists(js), "the fork engine ran (rc %d)" % rc)
    if rc != 0:
        return
    rep = json.load(open(js))
    check(rep.get("engine") == "fork" and len(rep.get("http_check", [])) == 1 and
          all(c["same"] for c in rep["http_check"]), "fork: --check-http compared full's first answer (%s)" %
          rep.get("http_check"))
    check(sorted((r["task"], r["attn"]) for r in rep["rows"]) ==
          sorted((t, m) for t in TASKS for m in ("full", "retroinfer@ct8")), "fork: a row per task and method")
    for task in TASKS:
        pred = lambda o: {p["index"]: p["pred"] for p in map(json.loads, open(  # noqa: E731
            os.path.join(o, "pred", "1024", "full", task + ".jsonl")))}
        check(pred(out) == pred(http_out), "%s: the fork engine's texts equal the worker's" % task)


def main():
    with tempfile.TemporaryDirectory(prefix="ri-rp-") as tmp:
        out, js = os.path.join(tmp, "out"), os.path.join(tmp, "r.json")
        rc = run(out, js)
        if rc == 77:
            return 77
        check(rc == 0 and os.path.exists(js), "the harness ran (rc %d)" % rc)
        if failures:
            return 1
        rep = json.load(open(js))
        check(rep.get("bench") == "ruler" and rep.get("git") and
              isinstance(rep.get("machine", {}).get("load_avg"), (int, float)), "top level: bench, git, machine")
        rows = {r["task"]: r for r in rep["rows"]}
        check(sorted(rows) == sorted(TASKS), "a row per task (%s)" % sorted(rows))
        need = ("model", "task", "context", "attn", "trials", "passed", "budget_tokens",
                "wilson_lo", "wilson_hi", "score", "prompt_tokens_min", "prompt_tokens_median",
                "prompt_tokens_max")
        for task, (metric, gen) in TASKS.items():
            r = rows.get(task, {})
            check(all(k in r for k in need), "%s: every field (%s)" % (task, [k for k in need if k not in r]))
            check("tokens_per_cluster" not in r, "%s: no tokens_per_cluster for full attention" % task)
            check(r.get("attn") == "full" and r.get("context") == 1024 and r.get("trials") == 2 and
                  r.get("metric") == metric, "%s: full, 1024, 2 trials, scored by %s" % (task, metric))
            check(0 <= r["wilson_lo"] <= r["passed"] / 2 <= r["wilson_hi"] <= 1, "%s: the interval holds the rate"
                  % task)
            check(0 < r["prompt_tokens_min"] <= r["prompt_tokens_max"] and r["prompt_tokens_max"] - 1 + gen <= 1024,
                  "%s: prompts of %d..%d tokens fit 1024 with %d to generate (bos aside)" %
                  (task, r["prompt_tokens_min"], r["prompt_tokens_max"], gen))
            k, n, score = rescore(os.path.join(out, "pred", "1024", "full", task + ".jsonl"), metric)
            check(n == 2 and k == r["passed"], "%s: passed %d equals a re-scoring of the predictions (%d/%d)" %
                  (task, r["passed"], k, n))
            check(abs(r["score"] - score) < 0.01, "%s: RULER's score %.2f (partial credit) equals a re-scoring (%.2f)"
                  % (task, r["score"], score))
        avg = rep.get("averages", [])
        check(len(avg) == 1 and abs(avg[0]["ruler_avg"] - sum(r["score"] for r in rep["rows"]) / 2) < 0.01,
              "RULER's average over the tasks (%s)" % avg)
        sizes = {t: os.path.getsize(os.path.join(out, "pred", "1024", "full", t + ".jsonl")) for t in TASKS}
        rc = run(out, js)
        check(rc == 0 and all(os.path.getsize(os.path.join(out, "pred", "1024", "full", t + ".jsonl")) == s
                              for t, s in sizes.items()), "a second run resumes: nothing answered again")
        check_fork(tmp, out)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
