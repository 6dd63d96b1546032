# shellcheck shell=bash
# Source me: two network namespaces joined by a veth pair, for running the
# kvstore and a worker as if on two hosts (tests/deploy/test_multinode.sh,
# bench/netns).  Everything lives inside the namespaces this file makes:
# the addresses (NS_ADDR_A/NS_ADDR_B, a /30 of 10.201.0.0/16) exist only
# there, and no interface of the host's own namespace is touched, so no
# traffic can leave them.
#
#   ns_pair_check              exit 77 unless root with ip-netns support
#   ns_pair_up                 make NS_A, NS_B, the veth pair and addresses
#   ns_a CMD... / ns_b CMD...  run a command in one of them (in the
#                              background, call `ip netns exec "$NS_A" CMD &`
#                              instead, so that $! is the command's pid)
#   ns_pair_down               remove both (idempotent; also on EXIT if you trap it)
# NS_TAG (default: this shell's pid) keeps concurrent users apart.
NS_TAG="${NS_TAG:-$$}"
NS_A="ri-ns-${NS_TAG}-a"
NS_B="ri-ns-${NS_TAG}-b"
NS_VETH_A="ria${NS_TAG}"
NS_VETH_B="rib${NS_TAG}"
NS_ADDR_A="10.201.$(( NS_TAG % 250 )).1"
NS_ADDR_B="10.201.$(( NS_TAG % 250 )).2"

ns_pair_check() {
  [ "$(id -u)" = 0 ] || { echo "skip: network namespaces need root"; exit 77; }
  command -v ip >/dev/null || { echo "skip: no ip(8) (iproute2)"; exit 77; }
  local probe="ri-ns-probe-$$"
  ip netns add "$probe" 2>/dev/null || { echo "skip: cannot make a network namespace here"; exit 77; }
  if ! ip link add "rip$$" type veth peer name "riq$$" netns "$probe" 2>/dev/null; then
    ip netns del "$probe"; echo "skip: no veth support"; exit 77
  fi
  ip link del "rip$$" 2>/dev/null || true
  ip netns del "$probe"
}

ns_a() { ip netns exec "$NS_A" "$@"; }
ns_b() { ip netns exec "$NS_B" "$@"; }

ns_pair_up() {
  ip netns add "$NS_A"
  ip netns add "$NS_B"
  # made inside NS_A with its peer in NS_B: never in the host's namespace
  ip -n "$NS_A" link add "$NS_VETH_A" type veth peer name "$NS_VETH_B" netns "$NS_B"
  ip -n "$NS_A" addr add "$NS_ADDR_A/30" dev "$NS_VETH_A"
  ip -n "$NS_B" addr add "$NS_ADDR_B/30" dev "$NS_VETH_B"
  ip -n "$NS_A" link set lo up
  ip -n "$NS_B" link set lo up
  ip -n "$NS_A" link set "$NS_VETH_A" up
  ip -n "$NS_B" link set "$NS_VETH_B" up
  local _
  for _ in $(seq 1 50); do   # wait for both ends' carrier
    [ "$(ns_a cat "/sys/class/net/$NS_VETH_A/operstate")" = up ] &&
      [ "$(ns_b cat "/sys/class/net/$NS_VETH_B/operstate")" = up ] && return 0
    sleep 0.1
  done
  echo "the veth pair did not come up" >&2
  return 1
}

# Bytes the B side of the pair has received so far.
ns_b_rx_bytes() { ns_b cat "/sys/class/net/$NS_VETH_B/statistics/rx_bytes"; }

ns_pair_down() {
  # Processes still inside our namespaces are ours (nothing else runs in
  # them): stop them first, or the namespaces outlive their names.
  local ns pids _
  for ns in "$NS_A" "$NS_B"; do
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    [ -n "$pids" ] || continue
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    for _ in $(seq 1 30); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.1; done
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  done
  # deleting a namespace removes its end of the veth pair, and with it the peer
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
}
