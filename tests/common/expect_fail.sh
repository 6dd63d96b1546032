#!/bin/sh
# expect_fail.sh REGEX PROGRAM [ARGS...]
# A mutation check: PROGRAM runs with a deliberate fault turned on and must
# catch it.  Passes only when PROGRAM exits with a failure (not 0, not 77 =
# skipped) and its output matches REGEX (the check that was meant to fire),
# so a test that fails for an unrelated reason does not count.  A PROGRAM
# that skips (77: it cannot run here) makes this check skip too.
set -u
re=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out" | tail -n 40
if [ "$rc" -eq 0 ]; then
    echo "expect_fail: '$*' passed with its mutation on: the test cannot catch it"
    exit 1
fi
if [ "$rc" -eq 77 ]; then
    echo "expect_fail: '$*' skipped (77): the mutation was not checked here"
    exit 77
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$re"; then
    echo "expect_fail: '$*' failed (exit $rc) but not with /$re/"
    exit 1
fi
echo "expect_fail: the mutation was caught (exit $rc, /$re/ seen)"
exit 0
