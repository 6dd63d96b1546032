#!/usr/bin/env python3
"""The table of a `ri bench ruler-pkg --json` report, methods side by side,
in Markdown (docs/results/accuracy.md), and the accuracy goal checked per
length:

  on every task where full attention scores >= 50, a sparse method's pass
  count is not below full's 95% Wilson interval, and RULER's average over
  those tasks is within 3 points of full's (above full's interval is
  reported, not counted as a miss: it is no loss of accuracy).

  python3 bench/ruler/ruler_table.py REPORT.json [REPORT.json ..]

Several reports (e.g. one per length) are read as one.  Exits 0; the verdict
is printed, not enforced (a report is evidence, not a test).
"""
import json
import sys


def load(paths):
    rows, meta = [], []
    for p in paths:
        doc = json.load(open(p))
        rows += doc["rows"]
        meta.append("%s: model %s, engine %s, git %s, load %.1f-%.1f, %s s" % (
            p, doc.get("model"), doc.get("engine", "http"), doc.get("git"), doc["machine"].get("load_avg", 0),
            doc["machine"].get("load_avg_end", 0), doc.get("seconds")))
    return rows, meta


def cell(r):
    return "%d/%d (%.0f)" % (r["passed"], r["trials"], r["score"])


def table(rows, length):
    at = [r for r in rows if r["context"] == length]
    methods = list(dict.fromkeys(r["attn"] for r in at))
    tasks = list(dict.fromkeys(r["task"] for r in at))
    by = {(r["task"], r["attn"]): r for r in at}
    out = ["| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for t in tasks:
        out.append("| %s | " % t + " | ".join(cell(by[(t, m)]) if (t, m) in by else "-" for m in methods) + " |")
    avg = {m: sum(by[(t, m)]["score"] for t in tasks if (t, m) in by) / len(tasks) for m in methods}
    out.append("| RULER average | " + " | ".join("%.1f" % avg[m] for m in methods) + " |")
    budget = ["%.0f" % by[(tasks[0], m)]["budget_tokens"] if by.get((tasks[0], m), {}).get("budget_tokens") else "-"
              for m in methods]
    out.append("| exact tokens (%s) | " % tasks[0] + " | ".join(budget) + " |")
    return out, methods, tasks, by


def verdict(methods, tasks, by):
    """The goal per sparse method: full's interval on every task where full
    scores >= 50, and the pooled average within 3 points."""
    lines = []
    held = [t for t in tasks if by[(t, "full")]["score"] >= 50]
    for m in methods:
        if m == "full" or not held or any((t, m) not in by for t in held):
            continue
        n = lambda t: by[(t, m)]["trials"]  # noqa: E731
        below = [t for t in held if by[(t, m)]["passed"] < by[(t, "full")]["wilson_lo"] * n(t) - 1e-9]
        above = [t for t in held if by[(t, m)]["passed"] > by[(t, "full")]["wilson_hi"] * n(t) + 1e-9]
        gap = sum(by[(t, "full")]["score"] - by[(t, m)]["score"] for t in held) / len(held)
        pooled = sum(by[(t, "full")]["score"] - by[(t, m)]["score"] for t in tasks if (t, m) in by) / len(tasks)
        ok = not below and gap <= 3
        lines.append("- %s: %s (%d tasks where full >= 50: %+.1f points against full%s%s; all %d tasks: %+.1f)" % (
            m, "meets the goal" if ok else "misses the goal", len(held), -gap,
            "; below full's interval on " + ", ".join(below) if below else "",
            "; above it on " + ", ".join(above) if above else "", len(tasks), -pooled))
    return lines


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    rows, meta = load(argv)
    for m in meta:
        print("<!-- %s -->" % m)
    for length in sorted({r["context"] for r in rows}):
        out, methods, tasks, by = table(rows, length)
        print("\n**%d tokens** (passed/samples, RULER's score in brackets)\n" % length)
        print("\n".join(out))
        if "full" in methods:
            print()
            print("\n".join(verdict(methods, tasks, by)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
