#!/bin/sh
# test_bench_serve_smoke: a short ri-bench-serve run (1 and 2 clients, 2 rounds, every
# backend, 4 tokens) against the worker and kvstore it starts.  Fails when
# any request fails; skipped (77) when the bench reports no model (3).
# usage: smoke.sh BENCH JSON
"$1" --clients 1,2 --requests 2 --attn full,retroinfer,retroinfer-remote --max-tokens 4 --prompt-words 40 --json "$2"
rc=$?
[ "$rc" = 3 ] && exit 77
exit "$rc"
