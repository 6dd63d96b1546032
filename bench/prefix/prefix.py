#!/usr/bin/env python3
"""ri bench prefix: time to first token with a cached shared document against
its cold prefill, through ri-worker's OpenAI-compatible HTTP service and
ri-kvstore's prefix blocks (docs/prefix.md), side by side with llama.cpp's
llama-server when one is given.

It starts ri-kvstore and one ri-worker (--kvstore, prefix cache on), makes a
document of exactly --doc-tokens token ids with the served model's tokenizer
(POST /tokenize) and one question of --question-tokens ids per client, and
for each client count N runs --rounds rounds of two cases, in turn:

  warm  N clients at once send the shared document + their own question; the
        document was published by one unmeasured request before the first
        round (what a RAG or system-prompt deployment sees);
  cold  N clients at once send a document no one sent before (its first
        tokens differ per request, so no block of it is cached): the whole
        prompt is prefilled, as without reuse.

Each request streams --max-tokens tokens; TTFT is request sent -> first
event with text (queueing included).  Per case: TTFT p50/max, the prompt
tokens the worker reports as cached (usage.prompt_tokens_details), aggregate
end-to-end tokens/s; per N the ratio cold/warm.  Memory: the kvstore's and
the worker's resident bytes (anonymous and shared, /proc/PID/status) after
the publishing request, and their peak while the largest warm case runs.
With --llama-server PATH the same prompts go to llama-server (same GGUF,
--threads, -np --llama-slots, cache_prompt) for --llama-clients clients:
warm after one priming request, and cold.

  ri bench prefix [--json PATH] [--model smollm2-135m|gemma3-270m|FILE]
                  [--doc-tokens 8192] [--question-tokens 64] [--clients 1,4,16]
                  [--attn retroinfer-remote] [--max-tokens 8] [--rounds 1]
                  [--cold-clients 1,4,16] [--threads 2] [--hog]
                  [--llama-server PATH] [--llama-clients 4] [--llama-slots 4]

Rows "prefix" (docs/bench-format.md).  Exits 77 when the model is missing,
1 when a request failed.
"""
import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
from bn_proc import ROOT, git_sha, machine, start_kvstore, stop, wait_port_file  # noqa: E402

# The memory "while decoding" is sampled once every client has had this many
# token events: past the first decode steps, which give back what the
# prefill no longer needs (the sliding-window layers' old K/V, the K/V the
# kvstore holds).
DECODING_EVENTS = 3
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
WORDS = ("river stone garden lantern harbor meadow copper violin orchard canyon ledger compass glacier "
         "pepper market thunder window saddle marble beacon falcon willow engine cotton summit parcel "
         "island mirror velvet quarry signal timber basket comet anchor prairie cabinet ember tunnel "
         "whistle almanac fabric lagoon pilgrim ribbon satchel tavern voyage wagon zephyr").split()


def skip(why):
    print("prefix: skipped: " + why)
    sys.exit(77)


# The memory files each process makes (memfd names; the worker's UCX
# segments, were its transports to use shared memory, are /dev/shm and SysV).
KVSTORE_FILES = ("/memfd:ri-prefix ", "/memfd:ri-region ")
WORKER_FILES = ("/memfd:ri-prefix-meta ", "/dev/shm/", "/SYSV")


def shared_bytes(pid, names):
    """The pages of the memory files that pid holds open or mapped whose
    name starts with one of names, each file once (its allocated blocks:
    touched pages, whoever touched them).  Unlike the machine's Shmem, this
    counts neither another process's files (a second kvstore on the
    machine) nor the files the worker maps from the kvstore."""
    seen, total = set(), 0
    if not names:
        return 0

    def add(path, name):
        nonlocal total
        if not (name + " ").startswith(names) and not name.startswith(names):
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512

    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                add("/proc/%d/fd/%s" % (pid, fd), os.readlink("/proc/%d/fd/%s" % (pid, fd)))
            except OSError:
                pass
        for line in open("/proc/%d/maps" % pid):
            f = line.split(None, 5)
            if len(f) == 6 and f[4] != "0" and f[5].startswith(names):
                add("/proc/%d/map_files/%s" % (pid, f[0]), f[5].rstrip("\n"))
    except OSError:
        pass
    return total


def rss(pid, names=KVSTORE_FILES):
    """(anonymous resident bytes of a process, the pages of the memory files
    it makes: shared_bytes).  The kvstore keeps blocks and regions in memory
    files whose pages count in a process's RSS only where it touched them
    through a mapping."""
    anon = 0
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, shared_bytes(pid, names)


def machine_shmem():
    """The machine's Shmem (/proc/meminfo): every process's memory files,
    recorded beside the per-process figures."""
    for line in open("/proc/meminfo"):
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    return 0


def anon_map_kind(lo, hi, name, flags):
    """What an anonymous mapping of the worker holds, from its look in
    smaps: glibc's thread arenas are 64 MiB-aligned heaps reserved without
    swap (VmFlags nr), the meta index's homes (kn_wave_place) are other
    unreserved ranges, thread stacks are 8 MiB, malloc's large chunks and
    the rest are plain private mappings."""
    if name:
        return name
    size = hi - lo
    if "nr" in flags and lo % (64 << 20) == 0 and size <= 64 << 20:
        return "malloc thread arenas"
    if "nr" in flags:
        return "reservations (meta index homes)"
    if size == 8 << 20:
        return "thread stacks"
    return "other anonymous (malloc's large chunks, ...)"


def anon_maps(pid):
    """A process's anonymous resident bytes by kind of mapping
    (/proc/PID/smaps, anon_map_kind): {kind: [mappings, bytes]}."""
    out = {}
    cur = None
    maps = []
    try:
        for line in open("/proc/%d/smaps" % pid):
            f = line.split()
            if f and "-" in f[0] and len(f) >= 5 and not f[0].endswith(":"):
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                cur = [lo, hi, " ".join(f[5:]), [], 0]
                maps.append(cur)
            elif cur is not None and f and f[0] == "Anonymous:":
                cur[4] = int(f[1]) * 1024
            elif cur is not None and f and f[0] == "VmFlags:":
                cur[3] = f[1:]
    except (OSError, ValueError):
        pass
    for lo, hi, name, flags, anon in maps:
        k = out.setdefault(anon_map_kind(lo, hi, name, flags), [0, 0])
        k[0] += 1
        k[1] += anon
    return out


def pool_used(metrics_addr):
    """The kvstore's own count of its pool bytes in use (sessions' pages,
    regions and prefix blocks), from its /metrics."""
    try:
        for line in http_get(metrics_addr, "/metrics").decode().splitlines():
            if line.startswith('ri_kvs_pool_bytes{state="used"}'):
                return int(float(line.split()[-1]))
    except (OSError, ValueError):
        pass
    return 0


def alloc_tags(worker_addr):
    """ri-worker's live heap bytes by allocation tag ({tag: bytes}), from
    its /metrics (ri_worker_alloc_bytes); {} when it cannot be read."""
    out = {}
    try:
        for line in http_get(worker_addr, "/metrics").decode().splitlines():
            if line.startswith('ri_worker_alloc_bytes{tag="'):
                out[line.split('"')[1]] = int(float(line.split()[-1]))
    except (OSError, ValueError):
        pass
    return out


def metric_value(worker_addr, name):
    """One unlabelled metric of ri-worker's /metrics, or None."""
    try:
        for line in http_get(worker_addr, "/metrics").decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def running_requests(worker_addr):
    """Requests ri-worker holds now (prefilling or decoding), from its
    /metrics (ri_worker_running_requests); None when it cannot be read."""
    n = metric_value(worker_addr, "ri_worker_running_requests")
    return None if n is None else int(n)


class Peak:
    """Samples a process's resident bytes (or another probe) every 50 ms until stopped."""

    def __init__(self, pid, probe=None):
        self.pid, self.peak, self.stop_ev = pid, (0, 0), threading.Event()
        self.probe = probe or (lambda: rss(self.pid))
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_ev.is_set():
            a, s = self.probe()
            if a + s > sum(self.peak):
                self.peak = (a, s)
            time.sleep(0.05)

    def stop(self):
        self.stop_ev.set()
        self.t.join()
        return self.peak


# ---- the processes ----

def start_worker(build, tmp, model, kvstore, a):
    port_file = os.path.join(tmp, "worker.port")
    cmd = [os.path.join(build, "bin", "ri-worker"), "--model", model, "--listen", "127.0.0.1:0",
           "--port-file", port_file, "--allow-attn", "full,retroinfer,retroinfer-remote",
           "--max-batch", str(max(a.clients)), "--threads", str(a.threads), "--kvstore", kvstore] + a.worker_arg
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(os.path.join(tmp, "worker.log"), "wb"),
                         stderr=subprocess.STDOUT)
    return p, wait_port_file(p, port_file, "ri-worker")["http"]


def start_llama(path, tmp, model, a, ctx):
    port = 18000 + os.getpid() % 1000
    cmd = [path, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(a.threads), "-tb",
           str(a.threads), "-np", str(a.llama_slots), "-c", str(ctx * a.llama_slots), "--no-webui"]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(os.path.join(tmp, "llama.log"), "wb"),
                         stderr=subprocess.STDOUT)
    end = time.time() + 180
    while time.time() < end:
        if p.poll() is not None:
            raise SystemExit("llama-server exited %d at start (%s)" % (p.returncode, os.path.join(tmp, "llama.log")))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return p, "127.0.0.1:%d" % port
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("llama-server did not answer /health in 180 s")


# ---- requests ----

def post_json(addr, path, body, timeout=600):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
    finally:
        c.close()
    if r.status != 200:
        raise RuntimeError("%s -> %d: %s" % (path, r.status, data[:300]))
    return json.loads(data)


def stream(addr, path, body, timeout=1800, on_first=None, progress=None):
    """One streaming request: (ttft_s, end_s, tokens, cached_tokens, error).
    progress (may be None): a dict kept current, "events" (token events so
    far) and "done" (the answer has ended)."""
    host, port = addr.rsplit(":", 1)
    t0 = time.time()
    ttft, tokens, cached, err, events = None, 0, None, None, 0
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=timeout)
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return None, time.time() - t0, 0, None, "HTTP %d: %s" % (r.status, r.read()[:200])
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            text = ""
            if "choices" in ev and ev["choices"]:
                text = ev["choices"][0].get("text") or ""
            elif "content" in ev:  # llama-server /completion
                text = ev.get("content") or ""
                if ev.get("stop"):
                    tm = ev.get("timings") or {}
                    cached = tm.get("cache_n", cached)
                    tokens = ev.get("tokens_predicted", tokens)
            if text or ev.get("choices"):
                events += 1
                if progress is not None:
                    progress["events"] = events
                if ttft is None:
                    ttft = time.time() - t0  # the first token's event (its text may be empty: EOS)
                if events == DECODING_EVENTS and on_first:
                    on_first()
                    on_first = None
            if text and "choices" in ev:
                tokens += 1
            u = ev.get("usage")
            if u:
                tokens = u.get("completion_tokens", tokens)
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
        c.close()
    except (OSError, ValueError, http.client.HTTPException) as e:
        err = str(e)
    end = time.time() - t0
    if progress is not None:
        progress["done"] = True
    if ttft is None and err is None:
        ttft = end  # no token event: the answer ended at once
    if on_first:
        on_first()  # fewer events than DECODING_EVENTS: count it as decoding at its end
    return ttft, end, tokens, cached, err


def ri_body(a, model_id, ids):
    return {"model": model_id, "prompt": ids, "max_tokens": a.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "attn": a.attn, "ignore_eos": True}


def llama_body(a, ids):
    return {"prompt": ids, "n_predict": a.max_tokens, "temperature": 0, "stream": True, "cache_prompt": True,
            "ignore_eos": True}


def run_case(send, prompts, when_all_first=None):
    """Send every prompt at once; per request (ttft, end, tokens, cached, err) and the wall time.
    when_all_first (may be None) runs once every request has had DECODING_EVENTS token events,
    with the requests' progress dicts (stream's)."""
    out = [None] * len(prompts)
    progress = [{"events": 0, "done": False} for _ in prompts]
    lock, firsts = threading.Lock(), [0]

    def first():
        with lock:
            firsts[0] += 1
            last = firsts[0] == len(prompts)
        if last and when_all_first:
            when_all_first(progress)

    def one(i):
        out[i] = send(prompts[i], first, progress[i])

    t0 = time.time()
    th = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out, time.time() - t0


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] if v else None


def case_row(server, case, n, results, wall, a):
    ttft = [r[0] for r in results if r[0] is not None]
    cached = [r[3] for r in results if r[3] is not None]
    errors = [r[4] for r in results if r[4]]
    toks = sum(r[2] for r in results)
    return {"server": server, "attn": a.attn if server == "ri-worker" else None, "case": case, "clients": n,
            "doc_tokens": a.doc_tokens, "question_tokens": a.question_tokens, "max_tokens": a.max_tokens,
            "requests": len(results), "errors": len(errors),
            "error_sample": errors[0] if errors else None,
            "ttft_p50_ms": 1000 * pct(ttft, 0.5) if ttft else None,
            "ttft_max_ms": 1000 * max(ttft) if ttft else None,
            "cached_tokens_median": pct(cached, 0.5) if cached else None,
            "tokens": toks, "seconds": wall, "e2e_tok_s": toks / wall if wall > 0 else None,
            "load_avg": os.getloadavg()[0]}


# ---- prompts ----

def make_doc(addr, n, rng):
    words = []
    ids = []
    while len(ids) < n:
        words += [rng.choice(WORDS) for _ in range(400)]
        words[-1] += "."
        ids = post_json(addr, "/tokenize", {"content": " ".join(words)})["tokens"]
    return ids[:n]


def make_questions(addr, n_clients, n_tok, rng):
    qs = []
    for i in range(n_clients):
        text = "\n\nQuestion %d: which of these words came first in the text above: %s" % (
            i, " ".join(rng.choice(WORDS) for _ in range(3 * n_tok)))
        ids = post_json(addr, "/tokenize", {"content": text})["tokens"][:n_tok - 4]
        ids += post_json(addr, "/tokenize", {"content": " Answer:"})["tokens"]
        qs.append((ids + ids[-1:] * n_tok)[:n_tok])
    return qs


def fresh(doc, k, rng):
    """The document with its first 16 tokens replaced by others: no block of it is cached."""
    head = [doc[rng.randrange(16, len(doc))] for _ in range(16)]
    return head + doc[16:]


def hog(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="ri bench prefix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m, gemma3-270m or a GGUF file")
    ap.add_argument("--doc-tokens", type=int, default=8192)
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--clients", default="1,4,16", help="concurrent clients of the warm case, comma-separated")
    ap.add_argument("--cold-clients", default=None,
                    help="client counts of the cold case (default: --clients; 0: no cold case)")
    ap.add_argument("--attn", default="retroinfer-remote", choices=("full", "retroinfer", "retroinfer-remote"))
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hog", action="store_true", help="one spinning process per core for the whole run")
    ap.add_argument("--kvstore-memory", default="8GiB")
    ap.add_argument("--worker-arg", action="append", default=[], help="one more ri-worker flag (repeatable)")
    ap.add_argument("--llama-server", default=None, help="llama-server binary for the side-by-side rows")
    ap.add_argument("--llama-clients", type=int, default=4)
    ap.add_argument("--llama-slots", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default=None)
    ap.add_argument("--build", default=os.environ.get("RI_BUILD_DIR", os.path.join(ROOT, "build")))
    a = ap.parse_args(argv)
    try:
        a.clients = [int(x) for x in a.clients.split(",")]
        a.cold_clients = [int(x) for x in a.cold_clients.split(",")] if a.cold_clients else list(a.clients)
        a.cold_clients = [n for n in a.cold_clients if n != 0]
    except ValueError:
        ap.error("--clients and --cold-clients take comma-separated numbers")
    if min(a.clients + a.cold_clients) < 1 or a.doc_tokens < 256 or a.question_tokens < 8:
        ap.error("clients >= 1, --doc-tokens >= 256, --question-tokens >= 8")
    return a


def resolve_model(name):
    if os.path.isfile(name):
        return name
    d = os.environ.get("RI_MODEL_DIR", os.path.expanduser("~/.cache/retroinfer/models"))
    path = os.path.join(d, MODELS.get(name, name))
    if not os.path.isfile(path):
        skip("no model %s (./ri model fetch)" % path)
    return path


def ri_cases(a, addr, model_id, doc, qs, kvs_pid, worker_pid, rows, mem, metrics):
    rng = random.Random(a.seed + 1)
    send = lambda ids, cb=None, pg=None: stream(addr, "/v1/completions", ri_body(a, model_id, ids), on_first=cb,
                                                progress=pg)
    # publish the document (unmeasured), then the memory of one copy
    k0, w0, p0, m0 = rss(kvs_pid), rss(worker_pid, WORKER_FILES), pool_used(metrics), machine_shmem()
    r = send(doc + qs[0])
    if r[4]:
        raise SystemExit("priming request failed: " + r[4])
    time.sleep(0.5)
    mem.update({"kvstore_before": k0, "worker_before": w0, "kvstore_one_copy": rss(kvs_pid),
                "pool_used_before": p0, "pool_used_one_copy": pool_used(metrics),
                "machine_shmem_before": m0, "machine_shmem_one_copy": machine_shmem(),
                "worker_after_one": rss(worker_pid, WORKER_FILES), "priming_cached_tokens": r[3]})
    biggest = max(a.clients)
    for rnd in range(a.rounds):
        for n in sorted(set(a.clients) | set(a.cold_clients)):
            if n in a.clients:
                peak = None
                if n == biggest and rnd == 0:
                    # the baseline right before: earlier cases (cold documents) hold blocks of their own
                    mem.update({"before_case_kvstore": rss(kvs_pid), "before_case_worker": rss(worker_pid, WORKER_FILES),
                                "before_case_pool_used": pool_used(metrics), "before_case_machine_shmem": machine_shmem(),
                                "before_case_worker_alloc": alloc_tags(addr),
                                "before_case_worker_maps": anon_maps(worker_pid)})
                    peak = (Peak(kvs_pid), Peak(worker_pid, lambda: (rss(worker_pid, ())[0], 0)),
                            Peak(0, lambda: (pool_used(metrics), 0)), Peak(0, lambda: (machine_shmem(), 0)))
                steady = {}

                def sample(progress):
                    steady.update({"worker_decoding": rss(worker_pid, WORKER_FILES), "pool_used_decoding": pool_used(metrics),
                                   "worker_alloc_decoding": alloc_tags(addr),
                                   "worker_maps_decoding": anon_maps(worker_pid),
                                   "worker_running_decoding": running_requests(addr),
                                   # tokens each live answer had streamed at the sample
                                   "answer_tokens_decoding": [p["events"] for p in progress if not p["done"]],
                                   "kv_bytes_per_token": metric_value(addr, "ri_worker_kv_bytes_per_token")})

                res, wall = run_case(send, [doc + qs[i % len(qs)] for i in range(n)], sample if peak else None)
                if peak:
                    mem.update(steady)
                    mem.update({"clients": n, "kvstore_peak": peak[0].stop(), "worker_peak": peak[1].stop(),
                                "pool_used_peak": peak[2].stop()[0], "machine_shmem_peak": peak[3].stop()[0]})
                rows.append(case_row("ri-worker", "warm", n, res, wall, a))
                print_row(rows[-1])
            if n in a.cold_clients:
                res, wall = run_case(send, [fresh(doc, i, rng) + qs[i % len(qs)] for i in range(n)])
                rows.append(case_row("ri-worker", "cold", n, res, wall, a))
                print_row(rows[-1])


def llama_cases(a, model, tmp, doc, qs, rows):
    ctx = a.doc_tokens + a.question_tokens + a.max_tokens + 64
    p, addr = start_llama(a.llama_server, tmp, model, a, ctx)
    try:
        send = lambda ids, cb=None, pg=None: stream(addr, "/completion", llama_body(a, ids), on_first=cb,
                                                    progress=pg)
        r = send(doc + qs[0])
        if r[4]:
            raise SystemExit("llama-server priming request failed: " + r[4])
        rng = random.Random(a.seed + 2)
        n = a.llama_clients
        for _ in range(a.rounds):
            res, wall = run_case(send, [doc + qs[i % len(qs)] for i in range(n)])
            rows.append(case_row("llama-server", "warm", n, res, wall, a))
            print_row(rows[-1])
            res, wall = run_case(send, [fresh(doc, i, rng) + qs[i % len(qs)] for i in range(n)])
            rows.append(case_row("llama-server", "cold", n, res, wall, a))
            print_row(rows[-1])
    finally:
        stop(p)


def print_row(r):
    f = lambda v, fmt: (fmt % v) if v is not None else "-"
    print("%-12s %-5s %3d  ttft p50 %9s ms  max %9s ms  cached %6s  %7s tok/s  err %d  load %.1f%s" % (
        r["server"], r["case"], r["clients"], f(r["ttft_p50_ms"], "%.0f"), f(r["ttft_max_ms"], "%.0f"),
        f(r["cached_tokens_median"], "%d"), f(r["e2e_tok_s"], "%.2f"), r["errors"], r["load_avg"],
        ("  (" + r["error_sample"] + ")") if r["error_sample"] else ""), flush=True)


def ratios(rows):
    out = []
    by = {(r["server"], r["case"], r["clients"]): r for r in rows}
    for (srv, case, n), r in sorted(by.items()):
        if case != "warm" or (srv, "cold", n) not in by:
            continue
        c = by[(srv, "cold", n)]
        if r["ttft_p50_ms"] and c["ttft_p50_ms"]:
            out.append({"server": srv, "clients": n, "ttft_cold_over_warm": c["ttft_p50_ms"] / r["ttft_p50_ms"],
                        "tok_s_warm_over_cold": (r["e2e_tok_s"] or 0) / c["e2e_tok_s"] if c["e2e_tok_s"] else None})
    for n in sorted({r["clients"] for r in rows if r["server"] == "llama-server"}):
        ours, theirs = by.get(("ri-worker", "warm", n)), by.get(("llama-server", "warm", n))
        if ours and theirs and ours["ttft_p50_ms"] and theirs["ttft_p50_ms"]:
            out.append({"server": "ri-worker/llama-server", "clients": n,
                        "ttft_llama_over_ours_warm": theirs["ttft_p50_ms"] / ours["ttft_p50_ms"]})
    return out


def main(argv):
    a = parse_args(argv)
    model = resolve_model(a.model)
    if a.llama_server and not os.access(a.llama_server, os.X_OK):
        raise SystemExit("--llama-server %s is not an executable" % a.llama_server)
    report = {"bench": "prefix", "git": git_sha(a.build), "machine": machine(), "model": os.path.basename(model),
              "attn": a.attn, "hog": a.hog}
    rows, mem, hogs = [], {}, hog(os.cpu_count() or 1) if a.hog else []
    tmp = tempfile.mkdtemp(prefix="ri-bench-prefix-")
    kvs = worker = None
    try:
        kvs, ports = start_kvstore(a.build, tmp, a.kvstore_memory)
        worker, addr = start_worker(a.build, tmp, model, ports["grpc"], a)
        model_id = json.loads(http_get(addr, "/v1/models"))["data"][0]["id"]
        rng = random.Random(a.seed)
        doc = make_doc(addr, a.doc_tokens, rng)
        qs = make_questions(addr, max(a.clients + a.cold_clients + [a.llama_clients]), a.question_tokens, rng)
        print("prefix: %s, document %d tokens, questions %d tokens, attn %s, logs in %s" % (
            os.path.basename(model), len(doc), a.question_tokens, a.attn, tmp), flush=True)
        ri_cases(a, addr, model_id, doc, qs, kvs.pid, worker.pid, rows, mem, ports["metrics"])
        stop(worker)
        worker = None
        if a.llama_server:
            llama_cases(a, model, tmp, doc, qs, rows)
    finally:
        stop(worker)
        stop(kvs)
        for h in hogs:
            h.kill()
    report["rows"] = rows
    report["ratios"] = ratios(rows)
    report["memory"] = mem
    report["machine"]["load_avg_end"] = os.getloadavg()[0]
    for r in report["ratios"]:
        print("ratio", json.dumps(r))
    if mem.get("kvstore_peak"):
        # one copy: what publishing the document added; with N attached: that copy plus what the
        # N sessions added on top of it during their case
        one = sum(mem["kvstore_one_copy"]) - sum(mem["kvstore_before"])
        grow = one + sum(mem["kvstore_peak"]) - sum(mem["before_case_kvstore"])
        mem["kvstore_growth_over_one_copy"] = grow / one if one > 0 else None
        pone = mem["pool_used_one_copy"] - mem["pool_used_before"]
        pgrow = pone + mem["pool_used_peak"] - mem["before_case_pool_used"]
        mem["pool_growth_over_one_copy"] = pgrow / pone if pone > 0 else None
        print("memory: kvstore pool in use: one copy %.1f MiB, with %d clients attached %.1f MiB (%.2fx)" % (
            pone / 2**20, mem["clients"], pgrow / 2**20, pgrow / pone if pone > 0 else float("nan")))
        if "worker_decoding" in mem:
            wdec = mem["worker_decoding"][0] - mem["before_case_worker"][0]
            mem["worker_anon_growth_per_client_decoding"] = wdec / mem["clients"]
            print("memory: worker +%.1f MiB anonymous per client once all %d decode; kvstore pool then %.1f MiB "
                  "over before" % (wdec / mem["clients"] / 2**20, mem["clients"],
                                   (mem["pool_used_decoding"] - mem["before_case_pool_used"]) / 2**20))
            before, during = mem.get("before_case_worker_alloc", {}), mem.get("worker_alloc_decoding", {})
            per = {t: (during.get(t, 0) - before.get(t, 0)) / mem["clients"] for t in during}
            mem["worker_alloc_growth_per_client_decoding"] = per
            top = sorted(per.items(), key=lambda kv: -kv[1])[:6]
            print("memory: worker heap per client by allocation tag: " +
                  ", ".join("%s %.2f MiB" % (t, b / 2**20) for t, b in top))
            # with a short answer the first requests end before the last one
            # decodes: per client undercounts what each live sequence holds
            live = mem.get("worker_running_decoding")
            if live:
                per_live = {t: (during.get(t, 0) - before.get(t, 0)) / live for t in during}
                mem["worker_alloc_growth_per_live_sequence_decoding"] = per_live
                top = sorted(per_live.items(), key=lambda kv: -kv[1])[:8]
                print("memory: worker heap per live sequence (%d at the sample) by allocation tag: " % live +
                      ", ".join("%s %.2f MiB" % (t, b / 2**20) for t, b in top))
                # where the anonymous growth lies, by mapping (heap tags count
                # allocated bytes; this counts resident pages)
                mb, md = mem.get("before_case_worker_maps", {}), mem.get("worker_maps_decoding", {})
                maps = {k: [md[k][0] - mb.get(k, [0, 0])[0], (md[k][1] - mb.get(k, [0, 0])[1]) / live]
                        for k in md}
                for k in mb:
                    if k not in md:
                        maps[k] = [-mb[k][0], -mb[k][1] / live]
                mem["worker_anon_growth_per_live_sequence_by_mapping"] = maps
                top = sorted(maps.items(), key=lambda kv: -abs(kv[1][1]))[:10]
                print("memory: worker anonymous growth per live sequence by mapping: " +
                      ", ".join("%s (%+d maps) %.2f MiB" % (k, v[0], v[1] / 2**20) for k, v in top))
                steady_zone_allowance(mem, a, wdec)
        wgrow = mem["worker_peak"][0] - mem["before_case_worker"][0]
        mem["worker_anon_growth_per_client"] = wgrow / mem["clients"]
        print("memory: kvstore anonymous + its memory files: one copy %.1f MiB, with %d clients attached %.1f MiB "
              "(%.2fx); worker +%.1f MiB "
              "anonymous per client at peak" % (one / 2**20, mem["clients"], grow / 2**20,
                                                 grow / one if one > 0 else float("nan"), wgrow / mem["clients"] / 2**20))
        wfiles = mem["worker_decoding"][1] - mem["before_case_worker"][1] if "worker_decoding" in mem else None
        if wfiles is not None:
            mem["worker_files_growth_decoding"] = wfiles
            print("memory: worker memory files (its shared meta index of the prefix) +%.1f MiB over the case; "
                  "machine Shmem +%.1f MiB at the peak (every process's files)" % (
                      wfiles / 2**20, (mem["machine_shmem_peak"] - mem["before_case_machine_shmem"]) / 2**20))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if any(r["errors"] for r in rows) else 0


# The steady zone's shape at the worker's defaults (sink and window tokens of
# the retroinfer backends; the bench does not change them).
SINK_TOKENS, WINDOW_TOKENS = 4, 64


def steady_zone_allowance(mem, a, wdec):
    """What each live sequence may hold in the worker, in the same bytes as its
    anonymous growth: the K/V of its steady zone at the sample (the sinks, the
    last WINDOW_TOKENS tokens of the prompt, which the question fills when it is
    that long, and the answer streamed so far).  Recorded as
    steady_zone_bytes_per_live_sequence and the growth's ratio to it."""
    answers, per_tok = mem.get("answer_tokens_decoding"), mem.get("kv_bytes_per_token")
    if not answers or not per_tok:
        return
    tokens = SINK_TOKENS + max(WINDOW_TOKENS, a.question_tokens) + sum(answers) / len(answers)
    allow = tokens * per_tok
    grow = wdec / len(answers)
    mem["steady_zone_tokens_per_live_sequence"] = tokens
    mem["steady_zone_bytes_per_live_sequence"] = allow
    mem["worker_anon_growth_per_live_sequence_decoding"] = grow
    mem["worker_growth_over_steady_zone"] = grow / allow
    print("memory: per live sequence (%d at the sample): worker +%.2f MiB anonymous against its steady zone "
          "(sinks, window/question, %.1f answer tokens: %.0f tokens x %.0f B = %.2f MiB): %.2fx" % (
              len(answers), grow / 2**20, sum(answers) / len(answers), tokens, per_tok, allow / 2**20,
              grow / allow))


def http_get(addr, path):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read()
    c.close()
    return data


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
