#!/usr/bin/env python3
"""./ri plot (tools/plot.py): small bench files of every charted kind -> PNGs.

Checks that each kind gives its file with the name docs/bench-format.md
promises and real PNG content, that several attn-accuracy files make one
chart, that a dataplane file without latency percentiles still charts, that
serve charts end-to-end and decode tokens/s (an older file its tok_s), that
a bench without a chart is skipped, and that bad arguments exit 2.  Skipped
(77) without gnuplot.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.environ.get("RI_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLOT = os.path.join(ROOT, "tools", "plot.py")
MACHINE = {"cpu": "test CPU", "cores": 2, "load_avg": 0.5, "load_avg_end": 0.7}


def doc(bench, rows, **extra):
    return dict({"bench": bench, "git": "0123456789abcdef", "machine": MACHINE, "rows": rows}, **extra)


FILES = {
    "e2e.json": doc("e2e", [{"mode": m, "context": c, "batch": 1, "decode_tok_s": t}
                            for m, k in (("full", 1.0), ("retroinfer-local", 2.0)) for c, t in
                            ((1024, 80 * k), (4096, 40 * k))]),
    "dp.json": doc("dataplane", [{"transport": "shm", "delivery": "inline_reply", "hit_ratio": 0.9,
                                  "p50_us": 300, "p99_us": 900, "latency_us_pct": [100 + 8 * i for i in range(101)]}]),
    "dp-old.json": doc("dataplane", [{"transport": "tcp", "hit_ratio": 0, "p50_us": 1000, "p99_us": 4000}]),
    "acc1.json": doc("attn-accuracy", [{"method": m, "layer": "all", "budget_tokens": b, "rel_err_median": e}
                                       for m, b, e in (("full", 1900, 3e-7), ("retroinfer", 100, 0.15),
                                                       ("oracle", 100, 0.1))]),
    "acc2.json": doc("attn-accuracy", [{"method": m, "layer": "all", "budget_tokens": b, "rel_err_median": e}
                                       for m, b, e in (("retroinfer", 300, 0.06), ("oracle", 300, 0.04))]),
    "serve.json": doc("serve", [{"attn": a, "clients": c, "e2e_tok_s": t, "decode_tok_s": 3 * t, "load_avg": 1.0}
                                for a in ("full", "retroinfer") for c, t in ((1, 7.0), (4, 5.0), (16, 4.0))]),
    "serve-old.json": doc("serve", [{"attn": "full", "clients": c, "tok_s": t} for c, t in ((1, 7.0), (4, 5.0))]),
    "spill.json": doc("spill", [{"path": "pread", "op": "write", "mb_s": 100}]),
}
EXPECT = ["e2e-throughput.png", "dp-fetch-cdf.png", "dp-old-fetch-cdf.png", "attn-accuracy-budget.png",
          "serve-serve.png", "serve-old-serve.png"]

failures = []


def check(cond, what):
    print(("ok:   " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def main():
    if shutil.which("gnuplot") is None:
        print("skip: gnuplot not installed (deps/apt.txt: gnuplot-nox)")
        return 77
    with tempfile.TemporaryDirectory(prefix="ri-plot-") as tmp:
        paths = []
        for name, d in FILES.items():
            paths.append(os.path.join(tmp, name))
            with open(paths[-1], "w") as f:
                json.dump(d, f)
        out = os.path.join(tmp, "img")
        p = subprocess.run([sys.executable, PLOT, "--out", out] + paths, capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, "exit 0 (%d; %s)" % (p.returncode, p.stderr.strip()[-300:]))
        printed = sorted(os.path.basename(l) for l in p.stdout.split())
        check(printed == sorted(EXPECT), "each chart drawn once, the accuracy files together (%s)" % printed)
        got = sorted(os.listdir(out)) if os.path.isdir(out) else []
        check(got == sorted(EXPECT), "one PNG per chart, named as documented (%s)" % got)
        for name in EXPECT:
            path = os.path.join(out, name)
            head = open(path, "rb").read(8) if os.path.exists(path) else b""
            check(head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 5000,
                  "%s is a drawn PNG (%d bytes)" % (name, os.path.getsize(path) if head else 0))
        check("no chart for bench 'spill'" in p.stderr, "a bench without a chart is named and skipped")
        # serve: end-to-end and decode tokens/s, a line each per backend; an
        # older file (tok_s only) still charts its end-to-end line.
        sys.path.insert(0, os.path.dirname(PLOT))
        import plot
        _, script, series = plot.plot_serve(FILES["serve.json"])
        labels = sorted(k for k, _ in series)
        check(labels == ["full, decode", "full, end-to-end", "retroinfer, decode", "retroinfer, end-to-end"],
              "serve charts both figures per backend (%s)" % labels)
        check(dict(series)["full, decode"] == [(1, 21.0), (4, 15.0), (16, 12.0)] and
              dict(series)["full, end-to-end"] == [(1, 7.0), (4, 5.0), (16, 4.0)] and 'title "full, decode"' in script,
              "serve's lines carry each row's figure")
        _, _, series = plot.plot_serve(FILES["serve-old.json"])
        check([k for k, _ in series] == ["full, end-to-end"], "an older serve file (tok_s) charts end-to-end only")
        for args in ([], ["--bogus", paths[0]]):
            q = subprocess.run([sys.executable, PLOT] + args, capture_output=True, text=True, timeout=60)
            check(q.returncode == 2 and "usage" in q.stderr, "bad arguments %s -> exit 2 with usage" % args)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
