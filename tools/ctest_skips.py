#!/usr/bin/env python3
"""List the tests a ctest run skipped, each with the reason it printed.

Usage: ctest_skips.py JUNIT_XML   (from ctest --output-junit)

A skipped test exits 77 after printing why (no model, no CUDA device, ...);
CTest shows only "Skipped".  This prints one line per skipped test: the last
output line that mentions skipping, else its last line.
"""
import sys
import xml.etree.ElementTree as ET


def reason(out):
    lines = [l.strip() for l in (out or "").splitlines() if l.strip()]
    for line in reversed(lines):
        if "skip" in line.lower() and not line.startswith("["):
            return line
    return lines[-1] if lines else "(no reason printed)"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ctest_skips.py JUNIT_XML")
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        sys.exit("ctest_skips: cannot read %s: %s" % (sys.argv[1], e))
    skipped = [tc for tc in root.iter("testcase") if tc.find("skipped") is not None]
    if not skipped:
        return
    print("skipped tests (%d), and why:" % len(skipped))
    for tc in skipped:
        out = tc.findtext("system-out")
        print("  %-34s %s" % (tc.get("name"), reason(out)))


if __name__ == "__main__":
    main()
