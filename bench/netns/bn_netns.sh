#!/usr/bin/env bash
# ri-bench-netns: the e2e bench (ri-bench-e2e, real model) with ri-kvstore in
# another network namespace, reached over a veth pair with UCX's TCP
# transport, as a worker on another host would reach it; then, unless
# --no-loopback, the same with the kvstore on loopback over TCP, so that the
# link's own cost shows.  Rows are the e2e rows (docs/bench-format.md) plus
# "link": "veth" or "loopback"; fetch_wait_ms_per_layer_step is what one
# layer-step waited for its fetch.  Needs root (it makes and removes the
# namespaces; addresses exist only inside them).
#   ./ri bench netns [--json PATH] [--no-loopback] [ri-bench-e2e args, e.g. --quick --batches 1]
set -euo pipefail
bin="$(cd "$(dirname "$0")" && pwd)"
json='' loopback=1 args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json="$2"; shift 2 ;;
    --json=*) json="${1#--json=}"; shift ;;
    --no-loopback) loopback=0; shift ;;
    -h|--help)
      cat <<EOF
usage: ri-bench-netns [--json PATH] [--no-loopback] [ri-bench-e2e options]
  --json PATH       write the report (veth and loopback rows) as JSON to this file
  --no-loopback     skip the run with the kvstore on loopback over TCP
Every other option goes to ri-bench-e2e (its usage line lists them).
Needs root (it makes and removes two network namespaces).
EOF
      exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
src="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$bin/../CMakeCache.txt")"
[ "$(id -u)" = 0 ] || { echo "ri-bench-netns: needs root (network namespaces)" >&2; exit 1; }
. "$src/tools/netns_pair.sh"
dir="$(mktemp -d "${TMPDIR:-/tmp}/ri-bn-netns-XXXXXX")"
kpid=
cleanup() {
  set +e
  if [ -n "$kpid" ]; then kill "$kpid" 2>/dev/null; wait "$kpid" 2>/dev/null; fi
  ns_pair_down
  rm -rf "$dir"
}
trap cleanup EXIT
ns_pair_up
export UCX_TLS=tcp,self   # across hosts: TCP (shared memory would bypass the link)

# the kvstore in A; private namespaces, so no tokens file (--insecure)
ip netns exec "$NS_A" "$bin/ri-kvstore" --listen="$NS_ADDR_A:0" --dataplane-listen="$NS_ADDR_A:0" --insecure --insecure-admin \
  --metrics-listen=off --memory=3GiB --no-hugepages --port-file="$dir/ports" >"$dir/kvstore.log" 2>&1 &
kpid=$!
for _ in $(seq 1 500); do
  [ -s "$dir/ports" ] && break
  kill -0 "$kpid" 2>/dev/null || { cat "$dir/kvstore.log" >&2; exit 1; }
  sleep 0.02
done
grpc="$(sed -n 's/^grpc=//p' "$dir/ports")"
echo "== kvstore in $NS_A ($grpc), the bench in $NS_B: UCX over TCP on the veth pair =="
ns_b "$bin/ri-bench-e2e" --kvstore "$grpc" --json "$dir/veth.json" "${args[@]}"
kill "$kpid"; wait "$kpid" 2>/dev/null || true; kpid=
if [ "$loopback" = 1 ]; then
  echo "== the same on loopback (the bench starts its own kvstore), UCX over TCP =="
  "$bin/ri-bench-e2e" --json "$dir/loopback.json" "${args[@]}"
fi
python3 - "$dir" "${json:-}" <<'PY'
import json, os, sys
d, out = sys.argv[1], sys.argv[2]
rep = None
for link in ("veth", "loopback"):
    p = os.path.join(d, link + ".json")
    if not os.path.exists(p):
        continue
    r = json.load(open(p))
    for row in r["rows"]:
        row["link"] = link
    if rep is None:
        rep = r
        rep["links"] = [link]
    else:
        rep["rows"] += r["rows"]
        rep["links"].append(link)
print("%-8s %-20s %7s %5s %9s %12s %14s %12s" % ("link", "mode", "context", "batch", "tok/s", "fetch B/tok",
                                                 "wait ms/l-step", "max wait ms"))
for row in rep["rows"]:
    if row.get("mode") != "retroinfer-kvstore":
        continue
    print("%-8s %-20s %7d %5d %9.2f %12.0f %14.3f %12.1f" % (row["link"], row["mode"], row["context"], row["batch"],
          row["decode_tok_s"], row["fetched_bytes_per_token"], row.get("fetch_wait_ms_per_layer_step", 0),
          row.get("max_wait_ms", 0)))
if out:
    json.dump(rep, open(out, "w"), indent=1)
PY
