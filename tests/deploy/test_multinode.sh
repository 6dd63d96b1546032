#!/usr/bin/env bash
# Two "hosts" on one machine: ri-kvstore in one network namespace, ri-worker
# (retroinfer-remote backend, the real model) in another, joined only by a
# veth pair; the data plane runs over UCX's TCP transport on that link.
# Checks:
#  1. the UCX address the kvstore hands out carries its veth address, the
#     only one the worker can reach (not a wildcard, not loopback);
#  2. the worker decodes through the kvstore across the link: exit 0, "ok",
#     clusters fetched, and the link's byte counter grew by at least the bytes
#     fetched (so the data did cross it);
#  3. the text equals the in-process retroinfer backend's on the same prefill
#     (greedy: the remote decode computes the same attention up to rounding).
# The namespaces, the veth pair and their 10.201.x.y/30 addresses are made
# and removed here; nothing outside the namespaces is touched.  Skips (77)
# when not root, without netns/veth support or without the model.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${RI_SOURCE_DIR:-$(cd "$here/../.." && pwd)}"
bin="${RI_BUILD_DIR:?}/bin"
model="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "skip: no model at $model"; exit 77; }
for p in ri-kvstore ri-worker; do [ -x "$bin/$p" ] || { echo "skip: $p not built"; exit 77; }; done
. "$src/tools/netns_pair.sh"
ns_pair_check

dir="$(mktemp -d "${TMPDIR:-/tmp}/ri-mn-XXXXXX")"
kpid=
cleanup() {
  set +e
  if [ -n "$kpid" ]; then kill "$kpid" 2>/dev/null || true; wait "$kpid" 2>/dev/null || true; fi
  ns_pair_down
  rm -rf "$dir"
}
trap cleanup EXIT
ns_pair_up

# TCP only on both sides: the namespaces share the machine's memory, and UCX
# would otherwise carry the data by shared memory, not over the link.
export UCX_TLS=tcp,self
printf '# test tokens\n%s mn-tenant\n' "$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')" >"$dir/tokens"
chmod 600 "$dir/tokens"
ip netns exec "$NS_A" "$bin/ri-kvstore" --listen="$NS_ADDR_A:0" --dataplane-listen="$NS_ADDR_A:0" --tokens-file="$dir/tokens" \
  --metrics-listen=off --memory=512MiB --no-hugepages --port-file="$dir/ports" >"$dir/kvstore.log" 2>&1 &
kpid=$!
for _ in $(seq 1 500); do
  [ -s "$dir/ports" ] && break
  kill -0 "$kpid" 2>/dev/null || { cat "$dir/kvstore.log"; echo "FAIL: ri-kvstore did not start"; exit 1; }
  sleep 0.02
done
grpc="$(sed -n 's/^grpc=//p' "$dir/ports")"
dpaddr="$(sed -n 's/^dataplane=//p' "$dir/ports")"
echo "kvstore in $NS_A: grpc $grpc, data plane ${dpaddr:0:40}..."

# 1. The packed UCX address holds its TCP interface addresses as raw bytes.
hexip="$(printf '%02x' ${NS_ADDR_A//./ })"
case "$dpaddr" in
  *"$hexip"*) echo "the data-plane address carries $NS_ADDR_A ($hexip)" ;;
  *) echo "FAIL: the data-plane address does not carry $NS_ADDR_A: $dpaddr"; exit 1 ;;
esac
case "$dpaddr" in
  *7f000001*) echo "FAIL: the data-plane address carries 127.0.0.1: $dpaddr"; exit 1 ;;
esac

# 2. + 3. One prompt, decoded through the kvstore and in-process.
python3 - >"$dir/prompt.txt" <<'PY'
f = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
print("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it." + f * 27 +
      " The pass key is 52817. Remember it. 52817 is the pass key." + f * 27 +
      " What is the pass key? The pass key is", end="")
PY
rx0="$(ns_b_rx_bytes)"
t0=$(date +%s.%N)
wrc=0
ns_b "$bin/ri-worker" --kvstore "$grpc" --token-file "$dir/tokens" --model "$model" --prompt-file "$dir/prompt.txt" \
  --attn retroinfer-remote --compare-attn retroinfer --max-tokens 8 >"$dir/out" 2>"$dir/err" || wrc=$?
t1=$(date +%s.%N)
rx1="$(ns_b_rx_bytes)"
if [ "$wrc" != 0 ]; then
  echo "FAIL: ri-worker in $NS_B exited $wrc"; cat "$dir/err" "$dir/out"; tail -20 "$dir/kvstore.log"; exit 1
fi
python3 - "$dir/out" "$rx0" "$rx1" "$t0" "$t1" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
rx = int(sys.argv[3]) - int(sys.argv[2])
assert r["ok"], r
remote, local = r["runs"]
assert remote["attn"] == "retroinfer-remote" and local["attn"] == "retroinfer", r
fetched = remote["cache_hits"] + remote["cache_misses"]
print(f"remote over the veth: {remote['decode_tok_s']:.1f} tok/s, {remote['cache_misses']} clusters fetched "
      f"({remote['fetched_bytes']} B), {remote['uploaded_bytes']} B uploaded, hit ratio {remote['hit_ratio']:.2f}, "
      f"fetch wait {remote['fetch_wait_s'] * 1e3:.1f} ms over {remote['decode_steps']} steps; link received {rx} B; "
      f"in-process: {local['decode_tok_s']:.1f} tok/s; {float(sys.argv[5]) - float(sys.argv[4]):.1f} s in all")
assert fetched > 0 and remote["cache_misses"] > 0, "no cluster was fetched"
# the worker's side received at least the missed clusters' bytes over the link
assert rx >= remote["fetched_bytes"], f"link received {rx} B < {remote['fetched_bytes']} B fetched"
assert remote["text"] == local["text"], f"remote {remote['text']!r} != in-process {local['text']!r}"
print(f"same text: {remote['text']!r}")
PY
grep -q "session 1 created" "$dir/kvstore.log" || { echo "FAIL: the kvstore never saw the session"; exit 1; }
echo "multi-node: kvstore and worker in two namespaces over veth + UCX/TCP: ok"
