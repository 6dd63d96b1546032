#!/usr/bin/env python3
"""ri bench cluster, small: a real etcd, 1 then 2 ri-kvstore nodes with small
pools and one ri-worker placing through the directory (SmolLM2).  Checks the
report's shape and what the bench claims to measure: two nodes hold twice
the sessions one node holds (admission is arithmetic on the pools), decode
works over both, and the kill of the node holding a stream's session is
noticed once (one failover) and the stream ends with the text of a run
without the kill.  Not that the numbers are good (that is the bench's
job).  With --prefix-replicas 2 the prompt's blocks are copied to the
other node, so the rebuild after the kill attaches them there.  Skipped
(77) without the model or etcd.  About 60 s."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "cluster", "cluster.py")
model = os.path.join(os.environ.get("RI_MODEL_DIR", os.path.expanduser("~/.cache/retroinfer/models")),
                     "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.path.isfile(model):
    print("skip: no model at " + model)
    sys.exit(77)
if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
    print("skip: etcd is not installed (Debian etcd-server, etcd-client)")
    sys.exit(77)
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "cluster.json")
    r = subprocess.run([sys.executable, BENCH, "--nodes", "1,2", "--memory", "96MiB", "--hold-tokens", "1024",
                        "--max-sessions", "8", "--seqs", "2", "--decode-tokens", "8", "--failover-tokens", "24",
                        "--prefix-replicas", "2",
                        "--json", out, "--build", os.environ.get("RI_BUILD_DIR", "build")],
                       capture_output=True, text=True, timeout=900)
    print(r.stdout[-3000:], r.stderr[-2000:])
    if r.returncode != 0:
        sys.exit("FAIL: the bench exited %d" % r.returncode)
    doc = json.load(open(out))
bad = []
check = lambda cond, what: cond or bad.append(what)
check(doc.get("bench") == "cluster", "bench is 'cluster'")
check(re.fullmatch(r"[0-9a-f]{40}(-dirty)?", str(doc.get("git"))) is not None, "git is a commit")
for k in ("cpu", "cores", "load_avg", "load_avg_start"):
    check(k in doc.get("machine", {}), "machine." + k)
rows = {row["kvstores"]: row for row in doc.get("rows", [])}
one, two = rows.get(1), rows.get(2)
check(one is not None and two is not None, "rows for 1 and 2 kvstores")
if one and two:
    for row in (one, two):
        for k in ("sessions_held", "decode_tok_s", "failover_s", "outputs_identical", "lease_ms", "load_avg"):
            check(k in row, "row field " + k)
        check(row["decode_tok_s"] and row["decode_tok_s"] > 0, "decode tok/s measured (%s)" % row["decode_tok_s"])
        check(row["refused_with"], "capacity ended with a refusal (%s)" % row["refused_with"])
    check(one["sessions_held"] >= 1 and two["sessions_held"] == 2 * one["sessions_held"],
          "2 nodes hold twice what 1 holds (%s, %s)" % (one["sessions_held"], two["sessions_held"]))
    check(two["failover_s"] is not None and two["failover_s"] > 0, "failover measured (%s)" % two["failover_s"])
    check("worker failovers 1" in (two.get("failover_note") or ""), "one failover (%s)" % two.get("failover_note"))
    m = re.search(r"replicated blocks (\d+)", two.get("failover_note") or "")
    check(m is not None and int(m.group(1)) > 0, "--prefix-replicas 2 copied blocks to the other node (%s)" %
          two.get("failover_note"))
    check(two["outputs_identical"] is True, "the stream's text survived the kill")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print("ok: cluster bench report (held %s -> %s, failover %.2f s)" % (one["sessions_held"], two["sessions_held"],
                                                                     two["failover_s"]))
