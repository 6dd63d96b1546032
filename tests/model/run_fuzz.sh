#!/bin/sh
# Run a libFuzzer target briefly (from a valid seed when SEED_WRITER is not
# "-"); skipped (77) when clang/libFuzzer was not available at build time.
# usage: run_fuzz.sh FUZZ_BINARY SEED_WRITER|- SECONDS [MAX_LEN]
fuzz="$1"; seed="$2"; secs="${3:-15}"; maxlen="${4:-4096}"
[ -x "$fuzz" ] || { echo "skip: fuzz target not built (needs clang with libFuzzer)"; exit 77; }
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/corpus"
if [ "$seed" != "-" ]; then "$seed" "$dir/corpus/valid.gguf" || exit 1; fi
cd "$dir" || exit 1
"$fuzz" -max_total_time="$secs" -rss_limit_mb=2048 -max_len="$maxlen" -print_final_stats=1 corpus >log 2>&1
rc=$?
tail -n 40 log
exit $rc
