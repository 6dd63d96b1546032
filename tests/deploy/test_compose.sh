#!/usr/bin/env bash
# docker/compose.yaml on a real Docker engine (label "docker"; `./ri test
# --docker` runs it):
#  1. builds the four images (etcd, kvstore, worker, nginx front door) from
#     this tree and starts the stack with one kvstore and one worker; every
#     service turns healthy;
#  2. completions through the front door: a short greedy one, and a long
#     prompt on retroinfer-remote, which must reach the kvstore's data plane
#     from the worker's container over TCP (the kvstore's fetch counter
#     grows; the UCX address it hands out carries its container's address,
#     not loopback); the same on the shared-memory sidecar (profile shm)
#     with UCX limited to shared memory (no TCP at all);
#  3. scales to 2 workers: the front door finds the new replica (both
#     answer, per its upstream log) and both give the same greedy text;
#  4. kills one worker container: every request after it still succeeds,
#     served by the other;
#  5. the cluster: scales to 2 kvstores and 2 workers (both kvstores are in
#     etcd's directory); a streamed greedy completion on retroinfer-remote
#     loses its kvstore (docker kill of the container its session record in
#     etcd names) a few tokens in, and completes with the same text as
#     before on the other kvstore;
#  6. tears everything down (containers, network; the images stay cached).
# The engine: one that answers is used as is; else, as root, Debian's
# docker.io/docker-compose/debootstrap are installed and dockerd started with
# the settings that need no kernel extras (vfs storage, no NAT rules; data in
# /var/tmp/dockerd), and stopped again at the end; the base image debian:12
# is made with debootstrap when missing.  No engine to be had: skip (77).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${RI_SOURCE_DIR:-$(cd "$here/../.." && pwd)}"
model_dir="${RI_MODEL_DIR:-$HOME/.cache/retroinfer/models}"
model_file=SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model_dir/$model_file" ] || { echo "skip: no model at $model_dir/$model_file"; exit 77; }
t_start=$(date +%s)
say() { echo "[$(( $(date +%s) - t_start ))s] $*"; }

# ---- the engine ----
dd=/var/tmp/dockerd
started_engine=0
engine_up() { timeout 10 docker info >/dev/null 2>&1; }
if ! command -v docker >/dev/null || ! engine_up; then
  [ "$(id -u)" = 0 ] || { echo "skip: no Docker engine answers and not root to start one"; exit 77; }
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null ||
     { ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; }; then
    say "installing docker.io docker-compose debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null 2>&1 ||
      { echo "skip: cannot install a Docker engine (apt-get failed)"; exit 77; }
  fi
  mkdir -p "$dd"
  say "starting dockerd (data in $dd)"
  dockerd --data-root "$dd/root" --exec-root "$dd/exec" --pidfile "$dd/pid" --iptables=false --ip-masq=false \
    --storage-driver=vfs >>"$dd/log" 2>&1 &
  started_engine=1
  for _ in $(seq 1 60); do engine_up && break; sleep 0.5; done
  engine_up || { tail -20 "$dd/log"; echo "skip: dockerd did not come up"; kill "$(cat "$dd/pid" 2>/dev/null)" 2>/dev/null; exit 77; }
fi
if docker compose version >/dev/null 2>&1; then compose=(docker compose)
elif command -v docker-compose >/dev/null; then compose=(docker-compose)
else echo "skip: neither 'docker compose' nor docker-compose"; exit 77; fi
if ! docker image inspect debian:12 >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] && command -v debootstrap >/dev/null || { echo "skip: no debian:12 base image and no debootstrap"; exit 77; }
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  say "making the debian:12 base image with debootstrap (${mirror:-http://deb.debian.org/debian})"
  rm -rf /var/tmp/deb12root
  debootstrap --variant=minbase bookworm /var/tmp/deb12root "${mirror:-http://deb.debian.org/debian}" >/dev/null
  tar -C /var/tmp/deb12root -c . | docker import - debian:12 >/dev/null
  rm -rf /var/tmp/deb12root
fi

# ---- the stack ----
work="$(mktemp -d "${TMPDIR:-/tmp}/ri-compose-XXXXXX")"
chmod 755 "$work"
project="ricompose$$"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export RI_TOKENS_FILE="$work/tokens" RI_MODEL_DIR="$model_dir" RI_MODEL_FILE="$model_file"
RI_HTTP_PORT="$(free_port)"; RI_METRICS_PORT="$(free_port)"; RI_SHM_HTTP_PORT="$(free_port)"
export RI_HTTP_PORT RI_METRICS_PORT RI_SHM_HTTP_PORT
export RI_SHM_UCX_TLS=tcp,self   # the sidecar: TCP for the ops, its region for the reads
printf '# compose test\n%s compose-test\n' "$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')" >"$RI_TOKENS_FILE"
# the workers' API keys: clients (compose_client.py) send the key as a bearer token
RI_API_KEY="$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
export RI_API_KEYS_FILE="$work/api-keys" RI_API_KEY
printf '# compose test\n%s compose-client\n' "$RI_API_KEY" >"$RI_API_KEYS_FILE"
# the containers' user (uid 10001) reads the secrets; nobody else does
for f in "$RI_TOKENS_FILE" "$RI_API_KEYS_FILE"; do
  chown 10001 "$f" 2>/dev/null || chmod 644 "$f"
  [ "$(stat -c %u "$f")" = 10001 ] && chmod 400 "$f"
done
dc() { "${compose[@]}" -f "$src/docker/compose.yaml" -p "$project" --profile shm "$@"; }
cleanup() {
  set +e
  if [ "${RI_COMPOSE_KEEP:-0}" != 1 ]; then
    dc logs --no-color >"$work/stack.log" 2>&1
    [ "$ok" = 1 ] || { echo "---- stack logs (last 80 lines) ----"; tail -80 "$work/stack.log"; }
    dc down -v --remove-orphans -t 5 >/dev/null 2>&1
  fi
  if [ "$started_engine" = 1 ]; then
    kill "$(cat "$dd/pid")" 2>/dev/null
    for _ in $(seq 1 100); do [ -e "$dd/pid" ] || break; sleep 0.1; done
  fi
  rm -rf "$work"
  say "torn down"
}
ok=0
trap cleanup EXIT

say "building the images"
# The build stage gets a tag of its own so that its compiled layers stay
# cached when the stale images of earlier runs are pruned (below).
docker build -q --network host -f "$src/docker/Dockerfile" --target build -t retroinfer/build-cache "$src" \
  >"$work/build.log" 2>&1 &&
  dc build -q >>"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; echo "FAIL: image build"; exit 1; }
# vfs storage copies every layer: drop this Dockerfile's images that no tag
# uses any more (earlier runs' layers), nobody else's.
docker image prune -f --filter label=org.retroinfer.dockerfile >/dev/null 2>&1 || true
say "starting kvstore, 1 worker, the shared-memory sidecar, front door"
dc up -d --scale worker=1 >"$work/up.log" 2>&1 || { cat "$work/up.log"; echo "FAIL: compose up"; exit 1; }

# Container ids of a service, and waiting until each is healthy.
ids() { dc ps -q "$1"; }
wait_healthy() {  # SERVICE COUNT SECONDS
  local end=$(( $(date +%s) + $3 )) n st
  while :; do
    n=0
    for c in $(ids "$1"); do
      st="$(docker inspect -f '{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$c")"
      case "$st" in running/healthy) n=$((n + 1)) ;; exited/*|dead/*) echo "FAIL: $1 container $c $st"; return 1 ;; esac
    done
    [ "$n" -ge "$2" ] && return 0
    [ "$(date +%s)" -lt "$end" ] || { echo "FAIL: $1: $n of $2 healthy after $3 s"; return 1; }
    sleep 1
  done
}
wait_healthy etcd 1 60
wait_healthy kvstore 1 60
wait_healthy worker 1 180
wait_healthy worker-shm 1 180
wait_healthy frontdoor 1 60
say "healthy: kvstore, worker, worker-shm, frontdoor"

# The checks talk HTTP from Python (no curl needed).
py() { python3 "$here/compose_client.py" "$@"; }
front="http://127.0.0.1:$RI_HTTP_PORT"
py models "$front"
py complete "$front" 3 >"$work/text1"
say "3 greedy completions through the front door: $(cat "$work/text1")"
metrics="http://127.0.0.1:$RI_METRICS_PORT/metrics"
f0="$(py metric "$metrics" ri_kvs_fetches_total)"
py remote "$front"
f1="$(py metric "$metrics" ri_kvs_fetches_total)"
[ "$f1" -gt "$f0" ] || { echo "FAIL: the kvstore served no fetch ($f0 -> $f1): the worker did not reach its data plane"; exit 1; }
say "retroinfer-remote from the worker's container: kvstore fetches $f0 -> $f1"
kvs="$(ids kvstore)"
kip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$kvs")"
dpaddr="$(docker exec "$kvs" ri status --addr 127.0.0.1:7070 | sed -n 's/^ *dataplane *//p')"
case "$dpaddr" in
  *"$(printf '%02x' ${kip//./ })"*) ;;
  *) echo "FAIL: the kvstore's data-plane address does not carry its address $kip: $dpaddr"; exit 1 ;;
esac
case "$dpaddr" in *7f000001*) echo "FAIL: the data-plane address carries 127.0.0.1: $dpaddr"; exit 1 ;; esac
say "the data-plane address carries the kvstore container's $kip"
# (the sidecar reads clusters itself from its region, with few fetches:
# count every data-plane request, CONNECT and uploads included, and the
# clusters it reports having read in place)
o1="$(py metric "$metrics" ri_kvs_dp_ops_total)"; r1="$(py metric "$metrics" ri_kvs_direct_reads_total)"
py remote "http://127.0.0.1:$RI_SHM_HTTP_PORT"
o2="$(py metric "$metrics" ri_kvs_dp_ops_total)"; r2="$(py metric "$metrics" ri_kvs_direct_reads_total)"
[ "$o2" -gt "$o1" ] || { echo "FAIL: the sidecar sent no data-plane request ($o1 -> $o2)"; exit 1; }
[ "$r2" -gt "$r1" ] || { echo "FAIL: the sidecar read no cluster from its region ($r1 -> $r2)"; exit 1; }
say "retroinfer-remote from the sidecar (UCX_TLS=$RI_SHM_UCX_TLS, no shared IPC namespace): data-plane requests $o1 -> $o2, direct reads $r1 -> $r2"

say "scaling to 2 workers"
dc up -d --no-recreate --scale worker=2 >>"$work/up.log" 2>&1 || { cat "$work/up.log"; exit 1; }
wait_healthy worker 2 180
py complete "$front" 8 >"$work/text2"
[ "$(cat "$work/text1")" = "$(cat "$work/text2")" ] || { echo "FAIL: greedy text differs: $(cat "$work/text1") vs $(cat "$work/text2")"; exit 1; }
ups="$(dc logs --no-color frontdoor 2>/dev/null | grep -o 'upstream=[0-9.]*:8080' | sort -u | wc -l)"
[ "$ups" -ge 2 ] || { echo "FAIL: the front door used $ups worker(s), wanted 2"; exit 1; }
say "8 completions over 2 workers: same text, both replicas answered"

# awk reads all of ps's output: with pipefail, "head -1" exiting before ps's
# second line made the pipeline die of SIGPIPE and set -e end the test
# without a word (seen once in CI)
victim="$(ids worker | awk 'NR == 1')"
[ -n "$victim" ] || { echo "FAIL: no worker container to kill"; exit 1; }
say "killing worker container ${victim:0:12}"
docker kill "$victim" >/dev/null
py complete "$front" 6 >"$work/text3"
[ "$(cat "$work/text1")" = "$(cat "$work/text3")" ] || { echo "FAIL: after the kill: $(cat "$work/text3")"; exit 1; }
running="$(for c in $(ids worker); do docker inspect -f '{{.State.Running}}' "$c"; done | grep -c true || true)"
[ "$running" = 1 ] || { echo "FAIL: $running workers running after the kill, wanted 1"; exit 1; }
say "6 completions after the kill: all served by the surviving worker"

# ---- the cluster ----
# New replicas publish their ports on free host ports (the first kvstore
# keeps RI_METRICS_PORT; --no-recreate leaves it as it is).
say "scaling to 2 kvstores and 2 workers"
RI_METRICS_PORT= RI_SHM_HTTP_PORT= dc up -d --no-recreate --scale kvstore=2 --scale worker=2 >>"$work/up.log" 2>&1 ||
  { cat "$work/up.log"; exit 1; }
wait_healthy kvstore 2 120
wait_healthy worker 2 180
etcdc="$(ids etcd)"
etcdctl() { docker exec "$etcdc" /usr/bin/etcdctl --endpoints=127.0.0.1:2379 "$@"; }
nodes="$(etcdctl get --prefix --keys-only /ri/compose/nodes/ | grep -c . || true)"
[ "$nodes" = 2 ] || { echo "FAIL: $nodes kvstores in the directory, wanted 2"; etcdctl get --prefix /ri/compose/nodes/; exit 1; }
listed="$(docker exec "$(ids worker | awk 'NR == 1')" ri cluster --cluster etcd://etcd:2379 --cluster-name compose)"
echo "$listed" | grep -q '^nodes: 2$' || { echo "FAIL: ri cluster in a worker container: $listed"; exit 1; }
say "2 kvstores registered in etcd (ri cluster lists both)"
# Through the front door: either worker; both place on the same 2 kvstores.
# 96 tokens: long enough that the stream still runs when the kill lands
# (finding the node through docker exec takes a second)
py stream "$front" 96 >"$work/ref"
say "reference stream: $(cat "$work/ref")"
# The kill: the node named by the (only) live session record.
cat >"$work/kill.sh" <<EOS
set -e
node=\$(docker exec $etcdc /usr/bin/etcdctl --endpoints=127.0.0.1:2379 get --prefix --keys-only /ri/compose/sessions/ | awk -F/ 'NF >= 6 {print \$5; exit}')
[ -n "\$node" ] || { echo "FAIL: no session record in etcd" >&2; exit 1; }
echo "\$node" >"$work/victim"
docker kill "\${node#kvs-}" >/dev/null
EOS
py stream "$front" 96 6 "bash $work/kill.sh" >"$work/fo"
[ "$(cat "$work/ref")" = "$(cat "$work/fo")" ] || { echo "FAIL: the stream's text changed with the kill: $(cat "$work/fo")"; exit 1; }
say "killed kvstore $(cat "$work/victim") 6 tokens into a stream: it completed with the same text on the other node"
ok=1
say "compose: build, health, front door, data plane, scale, kill, cluster failover: ok"
