#!/usr/bin/env python3
"""ri-worker as an observer of a ri-kvstore cluster, against real processes:
one etcd, ri-kvstore daemons started with --cluster, ri-worker --cluster.

Modes (the first argument):
  cluster  etcd + 3 kvstores (512, 512 and 16 MiB) + 2 workers (round-robin):
           - bad worker flags exit 2; a worker whose etcd does not answer
             exits 1 saying so;
           - three requests land on three nodes (placement counters, and
             `ri cluster` lists the three nodes);
           - the small node refuses a long prompt's session (memory
             quota), and placement moves on (its refusal counted, every
             request answered);
           - kill -9 of the kvstore holding a streamed request's session:
             the stream ends with the greedy text of the same request
             without the kill, and the worker counts one failover;
           - etcd killed: a running request finishes, the directory reads
             stale, and a new request is still placed (last known list).
  prefix   etcd + 2 kvstores (hosts "ha" and "hb") + 2 workers (local-first,
           one per host): a document published through worker 1 on node A
           is attached by worker 2, placed on node B, after its blocks were
           copied from A to B through the worker (cached_tokens > 0, the
           same greedy text as worker 1's, the copies counted).

Exits 77 (skipped) without the model, the binaries or etcd.
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_worker_http as wh  # noqa: E402  (the Worker helper and the checks)
import test_worker_prefix as wp  # noqa: E402  (the document and questions)

check = wh.check
RI_CLUSTER = os.path.join(wh.BUILD, "bin", "ri-cluster")
RI = os.path.join(wh.BUILD, "bin", "ri")
ETCD = "/usr/bin/etcd"
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
LONG = ("There is an important info hidden inside a lot of irrelevant text." + FILLER * 27 +
        " The pass key is 52817. Remember it." + FILLER * 27 + " Repeat the pass key many times:")
ATTN = "retroinfer-remote"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


ETCD_UP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common", "etcd_up.sh")


class Etcd:
    """A real etcd on free loopback ports (tests/common/etcd_up.sh, executed)."""

    def __init__(self, tmp):
        d = os.path.join(tmp, "etcd")
        out = subprocess.run(["bash", ETCD_UP, d], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise SystemExit("etcd_up.sh: %d %s" % (out.returncode, out.stderr))
        self.url = "etcd://" + out.stdout.split()[-1]
        self.pid = int(open(os.path.join(d, "etcd.pid")).read())

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_kvstore(tmp, url, memory, host=None):
    """ri-kvstore --cluster url with memory bytes of pool; (process, gRPC address = its node name)."""
    ports = os.path.join(tmp, "kvs.ports")
    if os.path.exists(ports):
        os.unlink(ports)
    kvs = subprocess.Popen([wh.KVSTORE, "--listen=127.0.0.1:0", "--dataplane-listen=127.0.0.1:0",
                            "--metrics-listen=127.0.0.1:0", "--insecure-admin", "--memory=" + memory, "--no-hugepages",
                            "--drain-timeout-ms=3000", "--port-file=" + ports, "--cluster=" + url,
                            "--cluster-lease-ms=2000", *(["--cluster-host=" + host] if host else [])],
                           stdout=open(os.path.join(tmp, "kvstore.log"), "ab"), stderr=subprocess.STDOUT)
    for _ in range(1500):
        if os.path.exists(ports) and "grpc=" in open(ports).read():
            break
        if kvs.poll() is not None:
            raise SystemExit("ri-kvstore exited %d" % kvs.returncode)
        time.sleep(0.01)
    grpc = dict(l.split("=", 1) for l in open(ports).read().split("\n") if "=" in l)["grpc"]
    return kvs, grpc


def ri_cluster(url):
    out = subprocess.run([RI, "cluster", "--cluster", url], capture_output=True, text=True, timeout=30)
    return out.returncode, out.stdout + out.stderr


def wait_nodes(url, n, timeout=30):
    deadline = time.time() + timeout
    text = ""
    while time.time() < deadline:
        rc, text = ri_cluster(url)
        if rc == 0 and ("nodes: %d\n" % n) in text:
            return text
        time.sleep(0.2)
    return text


def ask(w, prompt, max_tokens=4):
    st, _, c = w.request("POST", "/v1/completions", wh.completion(prompt, max_tokens=max_tokens, attn=ATTN))
    return (c["choices"][0]["text"] if st == 200 else None), st


def by_node(m, name):
    """{node: value} of a per-node counter."""
    out = {}
    for k, v in m.items():
        if k.startswith(name + "{node=\""):
            out[k[len(name) + 7:-2]] = v
    return out


def worker_flags(url, tmp):
    """Settings errors exit 2 before anything starts; no directory: exit 1."""
    def run(*flags):
        return subprocess.run([wh.WORKER, *flags], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)
    r = run("--cluster", url, "--kvstore", "127.0.0.1:1")
    check(r.returncode == 2 and "exclude each other" in r.stderr, "--cluster with --kvstore: exit 2 (%d %s)" %
          (r.returncode, r.stderr.strip()))
    r = run("--cluster", url, "--placement", "nearest")
    check(r.returncode == 2 and "--placement" in r.stderr, "--placement nearest: exit 2 (%d)" % r.returncode)
    r = run("--cluster", "etcd://nohostport")
    check(r.returncode == 2 and "--cluster" in r.stderr, "--cluster without a port: exit 2 (%d)" % r.returncode)
    r = run("--cluster", url, "--worker-name", "bad name!")
    check(r.returncode == 2 and "--worker-name" in r.stderr, "--worker-name 'bad name!': exit 2 (%d)" % r.returncode)
    r = run("--cluster", "etcd://127.0.0.1:%d" % free_port(), "--timeout-ms", "1000")
    check(r.returncode == 1 and "cannot use the cluster" in r.stderr,
          "no etcd there: exit 1 saying so (%d %s)" % (r.returncode, r.stderr.strip()[-200:]))


def test_cluster(tmp):
    etcd = Etcd(tmp)
    url = etcd.url
    kvs = {}
    workers = []
    try:
        for mem in ("512MiB", "512MiB", "16MiB"):
            p, grpc = start_kvstore(tmp, url, mem)
            kvs[grpc] = p
        small = grpc
        text = wait_nodes(url, 3)
        check("nodes: 3\n" in text and all(g in text for g in kvs), "ri cluster lists the 3 nodes:\n" + text)
        worker_flags(url, tmp)

        os.environ["RI_WORKER_DIRECT"] = "false"  # two-sided reads: a decode step sees a dead node at once
        common = ("--cluster", url, "--placement", "round-robin", "--cluster-lease-ms", "2000", "--timeout-ms", "2000")
        w1 = wh.Worker(*common, "--worker-name", "w1", tmp=tmp)
        workers.append(w1)
        w2 = wh.Worker(*common, "--worker-name", "w2", tmp=tmp)
        workers.append(w2)

        # spread: round-robin over 3 nodes
        for i in range(3):
            t, st = ask(w1, "Count to %d:" % (i + 3))
            check(st == 200, "w1 request %d answered (%d)" % (i, st))
        placed = by_node(w1.metrics(), "ri_worker_cluster_placements_total")
        check(sorted(placed) == sorted(kvs) and all(v == 1 for v in placed.values()),
              "three requests, one on each node: %s" % placed)
        check(w1.metrics().get("ri_worker_cluster_nodes") == 3, "ri_worker_cluster_nodes 3")

        # the small node cannot hold a long prompt's session: it refuses, placement moves on
        for i in range(3):
            # distinct from the first token on: no shared prefix block pulls
            # placement to the node holding it (the prefix-aware tie-break)
            t, st = ask(w2, "Request %d. " % i + LONG, max_tokens=1)
            check(st == 200, "w2 long request %d answered (%d)" % (i, st))
        m2 = w2.metrics()
        refused = by_node(m2, "ri_worker_cluster_refusals_total")
        placed = by_node(m2, "ri_worker_cluster_placements_total")
        check(refused.get(small, 0) >= 1 and placed.get(small, 0) == 0 and sum(placed.values()) == 3,
              "the small node refused, the others took the sessions: refused %s placed %s" % (refused, placed))

        # kill -9 under a stream: the rebuild lands on another node at once
        ref, st = ask(w1, LONG, max_tokens=64)
        check(st == 200 and ref, "reference answer without a kill (%d)" % st)
        result = {}
        started, killed = threading.Event(), threading.Event()

        def stream():
            body = dict(wh.completion(LONG, max_tokens=64, attn=ATTN), stream_options={"include_usage": True})
            c = w1.conn(timeout=600)
            c.request("POST", "/v1/completions", body=wh.json.dumps(dict(body, stream=True)).encode(),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            text, n = "", 0
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = wh.json.loads(line[6:])
                if "error" in ev:
                    result["error"] = ev
                    break
                if ev.get("choices") and ev["choices"][0].get("text"):
                    n += 1
                    text += ev["choices"][0]["text"]
                    if n == 6:
                        started.set()
                        killed.wait(60)  # the kill lands while the worker is still decoding
            result["text"] = text
            c.close()

        th = threading.Thread(target=stream)
        th.start()
        check(started.wait(300), "the stream reached 6 tokens")
        rc, text = ri_cluster(url)
        owner = [l.split()[0] for l in text.splitlines() if " w1 " in l + " " and l.startswith("  ") and
                 l.split()[0] in kvs]
        check(len(owner) == 1, "ri cluster names the node of w1's session: %s\n%s" % (owner, text))
        if owner:
            kvs[owner[0]].kill()
            kvs[owner[0]].wait()
        killed.set()
        th.join(600)
        check(result.get("text") == ref, "the stream survived the kill with the same greedy text (%r vs %r, %s)" %
              (result.get("text"), ref, result.get("error")))
        m1 = w1.metrics()
        check(m1.get("ri_worker_cluster_failovers_total") == 1 and m1.get("ri_worker_sequences_rebuilt_total") == 1,
              "one failover, one rebuild (%s, %s)" % (m1.get("ri_worker_cluster_failovers_total"),
                                                      m1.get("ri_worker_sequences_rebuilt_total")))

        # etcd down: running requests finish, new ones are placed from the last known list
        holder = {}

        def running():
            holder["r"] = ask(w2, "Tell a short story about a cat:", max_tokens=24)
        th = threading.Thread(target=running)
        th.start()
        time.sleep(0.3)
        etcd.kill()
        th.join(300)
        check(holder.get("r", (None, 0))[1] == 200, "a request running when etcd died finished")
        stale = 0
        for _ in range(100):
            stale = w2.metrics().get("ri_worker_cluster_directory_stale")
            if stale == 1:
                break
            time.sleep(0.1)
        check(stale == 1, "ri_worker_cluster_directory_stale 1 with etcd down (%s)" % stale)
        t, st = ask(w2, "Count to 5:")
        check(st == 200, "a new request is placed with etcd down (%d)" % st)
    finally:
        for w in workers:
            w.stop()
        for p in kvs.values():
            if p.poll() is None:
                p.terminate()
                p.wait()
        etcd.kill()


def test_prefix(tmp):
    etcd = Etcd(tmp)
    url = etcd.url
    kvs = {}
    workers = []
    try:
        (pa, node_a), (pb, node_b) = start_kvstore(tmp, url, "512MiB", "ha"), start_kvstore(tmp, url, "512MiB", "hb")
        kvs = {node_a: pa, node_b: pb}
        check("nodes: 2\n" in wait_nodes(url, 2), "ri cluster lists the 2 nodes")
        common = ("--cluster", url, "--placement", "local-first", "--attn", ATTN)
        w1 = wh.Worker(*common, "--cluster-host", "ha", "--worker-name", "w1", tmp=tmp)
        workers.append(w1)
        w2 = wh.Worker(*common, "--cluster-host", "hb", "--worker-name", "w2", tmp=tmp)
        workers.append(w2)
        t1, u1 = wp.ask(w1, ATTN, wp.QUESTIONS[0])
        check(wp.cached(u1) == 0 and u1["prompt_tokens"] > 1200, "w1: first time, nothing cached (%s)" % u1)
        placed = by_node(w1.metrics(), "ri_worker_cluster_placements_total")
        check(placed.get(node_a) == 1 and not placed.get(node_b), "w1 placed on its host's node A: %s" % placed)
        # the blocks reach the directory with node A's next renewal
        ctl = ["etcdctl", "--endpoints", url[len("etcd://"):], "get", "--prefix", "--keys-only", "/ri/default/prefix/"]
        keys = ""
        for _ in range(100):
            keys = subprocess.run(ctl, capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3")).stdout
            if keys.count(node_a) >= 4:
                break
            time.sleep(0.1)
        check(keys.count(node_a) >= 4, "node A's blocks are in the directory (%d)" % keys.count(node_a))
        t2, u2 = wp.ask(w2, ATTN, wp.QUESTIONS[0])
        m2 = w2.metrics()
        placed = by_node(m2, "ri_worker_cluster_placements_total")
        check(placed.get(node_b) == 1 and not placed.get(node_a), "w2 placed on its host's node B: %s" % placed)
        check(m2.get("ri_worker_prefix_remote_copies_total", 0) >= 4 and
              m2.get("ri_worker_prefix_remote_copy_bytes_total", 0) > 0,
              "w2 copied the blocks from A to B (%s blocks, %s bytes)" %
              (m2.get("ri_worker_prefix_remote_copies_total"), m2.get("ri_worker_prefix_remote_copy_bytes_total")))
        check(wp.cached(u2) >= 1024, "w2: cached_tokens %d of %d" % (wp.cached(u2), u2["prompt_tokens"]))
        check(t2 == t1, "w2 answers w1's greedy text (%r vs %r)" % (t2, t1))
    finally:
        for w in workers:
            w.stop()
        for p in kvs.values():
            if p.poll() is None:
                p.terminate()
                p.wait()
        etcd.kill()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "cluster"
    if not os.path.exists(wh.MODEL):
        print("skip: no model at %s" % wh.MODEL)
        return 77
    for b in (wh.WORKER, wh.KVSTORE, RI_CLUSTER, ETCD):
        if not os.access(b, os.X_OK):
            print("skip: %s not there" % b)
            return 77
    helps = subprocess.run([wh.KVSTORE, "--help"], capture_output=True, text=True).stdout
    if "--cluster " not in helps:
        print("skip: %s has no --cluster" % wh.KVSTORE)
        return 77
    with tempfile.TemporaryDirectory(prefix="ri-cluster-") as tmp:
        try:
            {"cluster": test_cluster, "prefix": test_prefix}[mode](tmp)
        except Exception as e:
            check(False, "%s: %s" % (type(e).__name__, e))
        finally:
            for log in ("worker.log", "kvstore.log"):
                p = os.path.join(tmp, log)
                if wh.failures and os.path.exists(p):
                    print("--- %s (tail) ---" % log)
                    print(open(p, errors="replace").read()[-4000:])
    if wh.failures:
        print("%d check(s) failed" % len(wh.failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
