#!/usr/bin/env python3
"""ri bench cluster: ri-kvstore nodes in one etcd-coordinated cluster
(docs/deploy.md, "A cluster of kvstores"): how many sessions 1, 2 and 3
nodes hold together, the per-sequence decode rate as sessions spread over
them, and how long a killed node's sequence takes to decode again.

For each node count K of --nodes it starts a real etcd, K ri-kvstore
daemons with --cluster and a bounded pool (--memory, no spill tier: a node
refuses a session it cannot hold), and one ri-worker with --cluster
(placement --placement), all on loopback, then measures:

  capacity  streaming requests that each reserve --hold-tokens tokens
            (max_tokens) are opened one after another, each kept decoding,
            until one is refused by every node (or --max-sessions): the
            sessions held;
  decode    --seqs sequences of a ~1.3K-token prompt (past the steady
            zone: every step reads clusters from a kvstore), --decode-tokens
            tokens each, at once: decode tokens/s per sequence (after its
            first token), the median;
  failover  (K >= 2) one greedy stream of the same prompt, --failover-tokens
            tokens; after a quarter of them the node holding its session
            (read from the directory) is killed with SIGKILL: the stall
            (the longest gap between tokens from the kill on: noticing the
            loss, placing a new session on another node, prefilling the
            prompt and the tokens so far again), whether the worker counted
            exactly one failover, and whether the text equals the same
            request run before without a kill.

Rows "cluster" (docs/bench-format.md): kvstores, sessions_held,
decode_tok_s, failover_s, outputs_identical, plus ratios against one node
and the lease period.  With --hog one spinning process per core runs for
the whole run (a shared CPU).

  ri bench cluster [--json PATH] [--nodes 1,2,3] [--memory 256MiB]
                   [--hold-tokens 1024] [--seqs 4] [--decode-tokens 48]
                   [--failover-tokens 64] [--lease-ms 2000]
                   [--placement most-free] [--threads 2] [--hog]

Exits 77 when the model or etcd is missing, 1 when a check failed.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
from bn_proc import ROOT, git_sha, machine, stop, wait_port_file  # noqa: E402

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
CLUSTER = "bench"


def skip(why):
    print("cluster: skipped: " + why)
    sys.exit(77)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- the processes ----

class Etcd:
    """A real etcd on free loopback ports, its data in tmp."""

    def __init__(self, tmp):
        self.client, peer = free_port(), free_port()
        self.url = "etcd://127.0.0.1:%d" % self.client
        d = os.path.join(tmp, "etcd")
        self.p = subprocess.Popen(
            ["etcd", "--name", "bench", "--data-dir", d,
             "--listen-client-urls", "http://127.0.0.1:%d" % self.client,
             "--advertise-client-urls", "http://127.0.0.1:%d" % self.client,
             "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
             "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
             "--initial-cluster", "bench=http://127.0.0.1:%d" % peer],
            stdout=open(os.path.join(tmp, "etcd.log"), "wb"), stderr=subprocess.STDOUT)
        end = time.time() + 30
        while time.time() < end:
            if self.ctl("endpoint", "health").returncode == 0:
                return
            if self.p.poll() is not None:
                raise SystemExit("etcd exited %d at start" % self.p.returncode)
            time.sleep(0.2)
        raise SystemExit("etcd did not answer in 30 s")

    def ctl(self, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        return subprocess.run(["etcdctl", "--endpoints", "127.0.0.1:%d" % self.client] + list(args),
                              capture_output=True, text=True, env=env, timeout=20)

    def keys(self, prefix):
        r = self.ctl("get", "--prefix", "--keys-only", prefix)
        return [k for k in r.stdout.split() if k]


def start_node(build, tmp, i, etcd, a):
    name = "kvs%d" % i
    ports = os.path.join(tmp, name + ".ports")
    grpc = free_port()
    p = subprocess.Popen([os.path.join(build, "bin", "ri-kvstore"), "--listen=127.0.0.1:%d" % grpc,
                          "--dataplane-listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--insecure-admin",
                          "--memory=" + a.memory, "--no-hugepages", "--drain-timeout-ms=3000",
                          "--port-file=" + ports, "--cluster=" + etcd.url, "--cluster-name=" + CLUSTER,
                          "--node-name=" + name, "--cluster-lease-ms=%d" % a.lease_ms],
                         stdout=open(os.path.join(tmp, name + ".log"), "wb"), stderr=subprocess.STDOUT)
    wait_port_file(p, ports, "ri-kvstore " + name, 180)
    return name, p


def start_worker(build, tmp, etcd, a, max_batch):
    port_file = os.path.join(tmp, "worker.port")
    cmd = [os.path.join(build, "bin", "ri-worker"), "--model", a.model_path, "--listen", "127.0.0.1:0",
           "--port-file", port_file, "--max-batch", str(max_batch), "--threads", str(a.threads),
           "--cluster", etcd.url, "--cluster-name", CLUSTER, "--placement", a.placement,
           "--cluster-lease-ms", str(a.lease_ms), "--worker-name", "bench-worker",
           "--prefix-replicas", str(a.prefix_replicas)]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=open(os.path.join(tmp, "worker.log"), "wb"),
                         stderr=subprocess.STDOUT)
    return p, wait_port_file(p, port_file, "ri-worker")["http"]


# ---- requests ----

_MODEL_IDS = {}


def model_id(addr):
    """The served model's id (GET /v1/models), once per worker."""
    if addr not in _MODEL_IDS:
        host, port = addr.rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request("GET", "/v1/models")
        _MODEL_IDS[addr] = json.loads(c.getresponse().read())["data"][0]["id"]
        c.close()
    return _MODEL_IDS[addr]

class Stream:
    """One streaming completion on its own thread: token event times and text.
    state: "wait" (no token yet), "run", "done", "error"."""

    def __init__(self, addr, prompt, max_tokens):
        self.addr, self.prompt, self.max_tokens = addr, prompt, max_tokens
        self.times, self.text, self.err, self.state = [], "", None, "wait"
        self.conn, self.t0 = None, time.time()
        self.first = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        host, port = self.addr.rsplit(":", 1)
        body = {"model": model_id(self.addr), "prompt": self.prompt, "max_tokens": self.max_tokens,
                "temperature": 0, "stream": True, "ignore_eos": True}
        try:
            self.conn = http.client.HTTPConnection(host, int(port), timeout=600)
            self.conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                              headers={"Content-Type": "application/json"})
            r = self.conn.getresponse()
            if r.status != 200:
                self.err, self.state = "HTTP %d: %s" % (r.status, r.read()[:300]), "error"
                return
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if ev.get("error"):
                    self.err, self.state = json.dumps(ev["error"])[:300], "error"
                    return
                ch = ev.get("choices") or []
                if ch and ch[0].get("finish_reason") is not None:  # the closing event: no token
                    self.text += ch[0].get("text") or ""
                elif ch:
                    self.times.append(time.time())
                    self.text += ch[0].get("text") or ""
                    self.state = "run"
                    self.first.set()
            self.state = "done"
        except (OSError, ValueError, http.client.HTTPException) as e:
            if self.state != "closed":
                self.err, self.state = str(e), "error"
        finally:
            self.first.set()

    def close(self):
        """Cancel: the worker drops the request (and its session) when the client goes."""
        if self.state in ("wait", "run"):
            self.state = "closed"
        try:
            if self.conn is not None and self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def decode_tok_s(self):
        if len(self.times) < 2:
            return None
        return (len(self.times) - 1) / (self.times[-1] - self.times[0])


PROMPT = ("You are a careful assistant. Here is a list of cities and the rivers that run through them: "
          "Paris on the Seine, London on the Thames, Vienna on the Danube, Cairo on the Nile, Cologne on the Rhine, "
          "Warsaw on the Vistula, Prague on the Vltava, Lisbon on the Tagus. Repeat the list in reverse order, "
          "one city a line, and say for each which sea its river reaches.")
# ~1.3K tokens: past the steady zone (sinks and recent window), so decoding
# reads clusters from the kvstore every step and a killed node is noticed.
FILL = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
LONG = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it." + FILL * 27 +
        " The pass key is 52817. Remember it. 52817 is the pass key." + FILL * 27 +
        " What is the pass key? The pass key is")


def worker_metric(addr, name):
    """A counter of the worker's /metrics, summed over its labels."""
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.split("{")[0].split(" ")[0] == name)


def sessions_in_directory(etcd):
    """(node, session id) of every session record of the cluster."""
    out = []
    for k in etcd.keys("/ri/%s/sessions/" % CLUSTER):
        parts = k.split("/")
        if len(parts) >= 6:
            out.append((parts[4], parts[5]))
    return out


def measure_capacity(addr, a):
    held, refused = [], None
    while len(held) < a.max_sessions:
        s = Stream(addr, PROMPT + " (%d)" % len(held), a.hold_tokens)
        s.first.wait(300)
        if s.state == "run":
            held.append(s)
            continue
        refused = s.err or "no token in 300 s"
        s.close()
        break
    n = len(held)
    for s in held:
        s.close()
    return n, refused


def measure_decode(addr, a):
    ss = [Stream(addr, LONG + " [%d]" % i, a.decode_tokens) for i in range(a.seqs)]
    for s in ss:
        s.th.join(900)
    rates = sorted(r for r in (s.decode_tok_s() for s in ss) if r)
    errs = [s.err for s in ss if s.err]
    return (rates[len(rates) // 2] if rates else None), errs


def measure_failover(addr, etcd, nodes, a):
    """(seconds the stream stalled around the kill, text identical, note)."""
    ref = Stream(addr, LONG, a.failover_tokens)
    ref.th.join(900)
    if ref.err:
        return None, None, "reference run: " + ref.err
    before = worker_metric(addr, "ri_worker_cluster_failovers_total")
    s = Stream(addr, LONG, a.failover_tokens)
    while len(s.times) < a.failover_tokens // 4 and s.state in ("wait", "run"):
        time.sleep(0.01)
    owners = sessions_in_directory(etcd)
    if not owners:
        s.close()
        return None, None, "no session record in the directory"
    victim = owners[0][0]
    if victim not in nodes:
        s.close()
        return None, None, "session record names unknown node %s" % victim
    n_before = len(s.times)
    t_kill = time.time()
    nodes[victim].send_signal(signal.SIGKILL)
    nodes[victim].wait()
    s.th.join(900)
    if s.err or len(s.times) <= n_before:
        return None, False, "stream after the kill of %s: %s" % (victim, s.err or "no token")
    failovers = worker_metric(addr, "ri_worker_cluster_failovers_total") - before
    # the stall: from the kill to the first token of the sequence rebuilt
    # elsewhere, i.e. the longest gap between tokens from the kill on
    ts = [t_kill] + [t for t in s.times if t > t_kill]
    stall = max(b - x for x, b in zip(ts, ts[1:]))
    note = "killed %s after %d tokens; worker failovers %d; replicated blocks %d; same text %s" % (
        victim, n_before, failovers, worker_metric(addr, "ri_worker_prefix_replica_blocks_total"),
        s.text == ref.text)
    if failovers != 1:
        return None, s.text == ref.text, note + " (wanted 1: the kill was not noticed)"
    return stall, s.text == ref.text, note


# ---- the run ----

def run_nodes(k, build, a, rows, base):
    tmp = tempfile.mkdtemp(prefix="ri-bench-cluster-")
    etcd, nodes, worker = None, {}, None
    try:
        etcd = Etcd(tmp)
        for i in range(k):
            name, p = start_node(build, tmp, i, etcd, a)
            nodes[name] = p
        worker, addr = start_worker(build, tmp, etcd, a, max(a.max_sessions, a.seqs) + 2)
        held, why = measure_capacity(addr, a)
        time.sleep(2 * a.lease_ms / 1000.0)  # cancelled sessions go
        rate, derrs = measure_decode(addr, a)
        fo_s, same, fo_note = (None, None, None)
        if k >= 2:
            fo_s, same, fo_note = measure_failover(addr, etcd, nodes, a)
        if k == 1:
            base.update(held=held, rate=rate)
        row = {"bench": "cluster", "kvstores": k, "sessions_held": held, "refused_with": why,
               "decode_tok_s": rate, "decode_errors": derrs, "failover_s": fo_s, "outputs_identical": same,
               "failover_note": fo_note, "lease_ms": a.lease_ms, "placement": a.placement,
               "prefix_replicas": a.prefix_replicas,
               "memory_per_node": a.memory, "hold_tokens": a.hold_tokens, "seqs": a.seqs,
               "held_ratio": held / base["held"] if base.get("held") else None,
               "decode_ratio": rate / base["rate"] if rate and base.get("rate") else None,
               "failover_leases": fo_s / (a.lease_ms / 1000.0) if fo_s is not None else None,
               "hog": a.hog, "load_avg": os.getloadavg()[0]}
        rows.append(row)
        print("%8d %13d %10s %13s %12s %10s %9.2f" % (
            k, held, "%.2f" % row["held_ratio"] if row["held_ratio"] else "-",
            "%.2f" % rate if rate else "-", "%.2f" % row["decode_ratio"] if row["decode_ratio"] else "-",
            "%.2f" % fo_s if fo_s is not None else "-", row["load_avg"]), flush=True)
        if fo_note:
            print("          failover: " + fo_note, flush=True)
    finally:
        stop(worker)
        for p in nodes.values():
            stop(p)
        if etcd is not None:
            stop(etcd.p)
        if a.keep_tmp:
            print("cluster: logs kept in " + tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="ri bench cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--nodes", default="1,2,3")
    ap.add_argument("--memory", default="256MiB", help="pool of each kvstore")
    ap.add_argument("--hold-tokens", type=int, default=1024, help="tokens each capacity session reserves")
    ap.add_argument("--max-sessions", type=int, default=48)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--failover-tokens", type=int, default=64)
    ap.add_argument("--lease-ms", type=int, default=2000)
    ap.add_argument("--prefix-replicas", type=int, default=1,
                    help="ri-worker --prefix-replicas: nodes holding each published prefix block (2: a failover "
                         "attaches the prompt's blocks on another node instead of prefilling them)")
    ap.add_argument("--placement", default="most-free", choices=("local-first", "most-free", "round-robin"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hog", action="store_true", help="one spinning process per core for the whole run")
    ap.add_argument("--keep-tmp", action="store_true")
    ap.add_argument("--build", default=os.environ.get("RI_BUILD", os.path.join(ROOT, "build")))
    return ap.parse_args(argv)


def main(argv):
    a = parse_args(argv)
    if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
        skip("etcd is not installed (Debian etcd-server, etcd-client)")
    models = os.environ.get("RI_MODEL_DIR", os.path.expanduser("~/.cache/retroinfer/models"))
    a.model_path = os.path.join(models, MODEL)
    if not os.path.exists(a.model_path):
        skip("no model at " + a.model_path)
    load_start = os.getloadavg()[0]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] \
        if a.hog else []
    rows, base = [], {}
    print("kvstores  sessions_held  held_x1  decode_tok_s  decode_x1  failover_s  load_avg")
    try:
        for k in [int(x) for x in a.nodes.split(",") if x]:
            run_nodes(k, a.build, a, rows, base)
    finally:
        for h in hogs:
            h.kill()
    ok = all(r["sessions_held"] > 0 and r["decode_tok_s"] for r in rows) and \
        all(r["outputs_identical"] for r in rows if r["kvstores"] >= 2)
    mach = dict(machine(), load_avg_start=load_start)
    report = {"bench": "cluster", "git": git_sha(a.build), "machine": mach, "rows": rows,
              "args": {k: v for k, v in vars(a).items() if k not in ("build",)}}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
        print("cluster: wrote " + a.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
