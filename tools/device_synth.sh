#!/usr/bin/env bash
# The synthetic-model stage of tools/device_check.sh, from a bundle
# (tools/bundle.sh) on a machine that has nothing installed:
#   1. the tiny synthetic GGUF (ri-bench-dev --write-gguf);
#   2. the bundled ri-kvstore on loopback and ri-worker --device DEVICE with
#      --kvstore: the same prompt twice, a few tokens each (attn retroinfer
#      when the worker takes it on DEVICE, else full), both answered on
#      DEVICE (prefilled there; prefix reuse on); the tokens the second
#      attached from the kvstore are reported;
#   3. ri-bench-dev --attn full,retroinfer at batch 1, a short step count:
#      llama3-8b at 32K and 128K on cuda (retroinfer indexed on the device
#      at its first step); tiny at 32K on cpu, which only checks this script.
#
#   tools/device_synth.sh BUNDLE OUT [DEVICE]     DEVICE: cuda (default) or cpu
# Env: RI_SYNTH_STEPS (ri-bench-dev --steps, default 8).
# Exit: 0 passed; 1 a step failed; 77 no CUDA device.
set -uo pipefail
B="$1"
OUT="$2"
DEV="${3:-cuda}"
PRESET=$([ "$DEV" = cuda ] && echo llama3-8b || echo tiny)
mkdir -p "$OUT"
W="$(mktemp -d "${TMPDIR:-/tmp}/ri-synth-XXXXXX")"
pid=""
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$W"' EXIT
log() { printf '[device_synth %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { log "FAILED: $*"; exit 1; }
export UCX_TLS="${UCX_TLS:-posix,sysv,cma,tcp,self}"

"$B/run.sh" ri-bench-dev --preset tiny --seed 3 --write-gguf "$W/tiny.gguf" || fail "cannot write the tiny GGUF"

"$B/run.sh" ri-kvstore --listen=127.0.0.1:0 --dataplane-listen=127.0.0.1:0 --metrics-listen=127.0.0.1:0 \
  --insecure-admin --memory=256MiB --no-hugepages --drain-timeout-ms=1000 --port-file="$W/ports" \
  >"$OUT/synth-kvstore.log" 2>&1 &
pid=$!
for _ in $(seq 1 1000); do
  [ -s "$W/ports" ] && break
  kill -0 "$pid" 2>/dev/null || fail "ri-kvstore died at start (log $OUT/synth-kvstore.log)"
  sleep 0.01
done
grpc="$(sed -n 's/^grpc=//p' "$W/ports")"
[ -n "$grpc" ] || fail "ri-kvstore wrote no gRPC address"
log "ri-kvstore up at $grpc"

# ~1,900 bytes (one token a byte): long enough for retroinfer to index and
# publish prefix blocks (docs/prefix.md: T >= sinks + window + 1,024)
prompt="$(python3 -c 'print(" ".join("the quick brown fox %d jumps over the lazy dog." % i for i in range(40)))')"
ask() {   # ask ATTN: two requests with the same prompt into $W/out.ATTN
  python3 - "$prompt" "$1" >"$W/req" <<'PY'
import json, sys
for i in (1, 2):
    print(json.dumps({"id": i, "prompt": sys.argv[1], "max_tokens": 6, "attn": sys.argv[2]}))
PY
  "$B/run.sh" ri-worker --model "$W/tiny.gguf" --kvstore "$grpc" --device "$DEV" --timeout-ms 3000 \
    <"$W/req" >"$W/out.$1" 2>"$OUT/synth-worker-$1.log"
}
attn=retroinfer
ask retroinfer
if ! grep -q '"ok":true' "$W/out.retroinfer"; then
  log "ri-worker --device $DEV does not take retroinfer ($(grep -o '"error":"[^"]*"' "$W/out.retroinfer" | head -1)); full"
  attn=full
  ask full || { cat "$OUT/synth-worker-full.log"; fail "ri-worker --device $DEV exited with an error"; }
fi
cp "$W/out.$attn" "$OUT/synth-worker.jsonl"
python3 - "$W/out.$attn" "$DEV" "$attn" <<'PY' || fail "ri-worker answers (see $OUT/synth-worker.jsonl)"
import json, sys
# the tokens are random bytes: the text need not be UTF-8
rs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8", errors="replace") if l.startswith("{")]
dev, attn = sys.argv[2], sys.argv[3]
assert len(rs) == 2 and all(r["ok"] for r in rs), rs
for r in rs:
    run = r["runs"][0]
    assert run["device"] == dev and run["attn"] == attn and run["tokens"] > 0, run
# cached_tokens is reported, not required: a one-shot line may not see the
# first one's blocks published yet
print("worker on %s, attn %s: %d prompt tokens, %d attached from the kvstore the second time, %.0f tok/s decode"
      % (dev, attn, rs[1]["prompt_tokens"], rs[1]["cached_tokens"], rs[1]["runs"][0]["decode_tok_s"]))
PY
kill -TERM "$pid"
wait "$pid" || fail "ri-kvstore exited $? on SIGTERM"
pid=""

CONTEXTS=$([ "$DEV" = cuda ] && echo 32768,131072 || echo 32768)
log "ri-bench-dev --device $DEV --preset $PRESET --attn full,retroinfer at $CONTEXTS"
"$B/run.sh" ri-bench-dev --device "$DEV" --preset "$PRESET" --attn full,retroinfer --contexts "$CONTEXTS" --batch 1 \
  --steps "${RI_SYNTH_STEPS:-8}" --json "$OUT/bench-dev.json" | tee "$OUT/bench-dev.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 77 ] && exit 77
[ "$rc" = 0 ] || fail "ri-bench-dev exited $rc"
log "passed"
