#!/usr/bin/env bash
# setup_rxe.sh — the host side of the NetReduce lab on a Linux with per-namespace rxe (>= 7.1).
#
#   setup_rxe.sh up --hosts N [--mtu M] [--nic I=IFNAME|MAC ...] [--switch-ns NS] [--racks R]
#                   [--aggregators K]
#   setup_rxe.sh down [--switch-ns NS]
#   setup_rxe.sh status [--switch-ns NS]
#
# up: host I is network namespace hI with one interface nr0 (address 10.77.0.(I+1)/24,
#     MAC 02:4e:52:00:00:(I+1), MTU M, default 9000 so RoCE path MTU 4096 fits), checksum and
#     segmentation offloads off (a raw-socket switch forwards frames as they are), and an
#     rxe device rxeI on nr0. nr0 is either a veth whose peer nrpI sits in the switch
#     namespace NS (default nrlab) as switch port I+1, or, with --nic I=IFNAME|MAC, that NIC
#     moved into hI (e.g. a VM's virtio NIC whose other end is a switch port; by MAC, it is
#     looked up in the root namespace, waiting a few seconds for one that is coming back).
#     Idempotent: what exists already is kept and checked. Returns once every rxeI opens
#     through libibverbs from hI with its port ACTIVE (up to 30 s, else an error naming them).
#     --aggregators K: one-armed aggregators on the hosts' network (scripts/lab.sh
#     --aggregators): host I also holds 10.78.J.(I+1)/32 (a RoCEv2 GID of rxeI) for each
#     aggregator J < K, with 10.78.J.0/24 routed via aggregator J at 10.77.0.(200+J), so a
#     ring on that address (NR_INC_ADDR=10.78.J.0/24) goes through aggregator J.
# down: removes the hosts' rxe devices and namespaces (veth peers go with them).
# status: hosts, addresses, rxe devices, RoCEv2 GIDs, switch ports; with --racks R (R > 1,
#     the lab's two-tier fabric) also each host's rack: N hosts spread over R racks as evenly
#     as possible in host order, the first racks one larger (labswitches/fabric_lab.py).
set -euo pipefail

SUBNET=10.77.0
MIN_KERNEL=7.1
mtu=9000 hosts="" switch_ns=nrlab racks=1 aggregators=0
AGG_NET=10.78 AGG_BASE=200    # aggregator J: 10.77.0.(AGG_BASE+J); the hosts' ring addresses 10.78.J.0/24
declare -A nic=()

die() { echo "setup_rxe.sh: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

host_ip() { echo "$SUBNET.$(($1 + 1))"; }
host_mac() { printf '02:4e:52:00:00:%02x' $(($1 + 1)); }
rack_of() {  # host I's rack (ToR id) for $hosts hosts over $racks racks
  local i=$1 j first=0 size
  for ((j = 0; j < racks; j++)); do
    size=$((hosts / racks + (j < hosts % racks ? 1 : 0)))
    if [ "$i" -lt $((first + size)) ]; then echo "$j"; return; fi
    first=$((first + size))
  done
  echo -
}
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

check_kernel() {
  local v; v=$(uname -r)
  if ! modprobe rdma_rxe 2>/dev/null && [ ! -d /sys/module/rdma_rxe ]; then
    die "kernel $v has no rdma_rxe module (no Soft-RoCE here). Run the lab in a VM instead: scripts/lab.sh --hosts N -- CMD"
  fi
  if ! printf '%s\n%s\n' "$MIN_KERNEL" "${v%%[-+]*}" | sort -V -C; then
    die "kernel $v: its rxe lives only in the initial network namespace (per-namespace rxe needs Linux >= $MIN_KERNEL), so hosts in namespaces cannot talk. Use scripts/lab.sh, which boots a newer kernel in a VM"
  fi
}

resolve_nic() {  # IFNAME or MAC -> IFNAME in the root namespace
  local want=$1 a t
  case $want in
    *:*:*:*:*:*)
      # A NIC leaves a deleted namespace asynchronously: give it a moment to come back.
      for t in $(seq 50); do
        for a in /sys/class/net/*/address; do
          [ "$(cat "$a")" = "${want,,}" ] && { basename "$(dirname "$a")"; return 0; }
        done
        sleep 0.2
      done
      return 1 ;;
    *) ip link show "$want" >/dev/null 2>&1 && echo "$want" ;;
  esac
}

offloads_off() {  # ns ifname
  in_ns "$1" ethtool -K "$2" tx off tso off gso off gro off >/dev/null 2>&1 \
    || in_ns "$1" ethtool -K "$2" tx off >/dev/null 2>&1 || true
}

host_up() {  # I
  local i=$1 ns="h$1" ip mac
  ip=$(host_ip "$i"); mac=$(host_mac "$i")
  ns_exists "$ns" || ip netns add "$ns"
  in_ns "$ns" ip link set lo up
  if ! in_ns "$ns" ip link show nr0 >/dev/null 2>&1; then
    if [ -n "${nic[$i]:-}" ]; then
      local dev; dev=$(resolve_nic "${nic[$i]}") || die "host h$i: NIC ${nic[$i]} not found in the root namespace (NICs: $(ls /sys/class/net | tr '\n' ' '))"
      ip link set "$dev" down
      ip link set "$dev" netns "$ns"
      in_ns "$ns" ip link set "$dev" name nr0
    else
      ns_exists "$switch_ns" || ip netns add "$switch_ns"
      in_ns "$switch_ns" ip link del "nrp$i" >/dev/null 2>&1 || true
      ip link add nr0 netns "$ns" type veth peer name "nrp$i" netns "$switch_ns"
      in_ns "$switch_ns" ip link set "nrp$i" mtu "$mtu" up
      offloads_off "$switch_ns" "nrp$i"
    fi
  fi
  in_ns "$ns" ip link set nr0 address "$mac" mtu "$mtu"
  offloads_off "$ns" nr0
  in_ns "$ns" ip link set nr0 up
  in_ns "$ns" ip -4 addr replace "$ip/24" dev nr0
  # rxe answers for every address of the netdev; keep replies on the lab interface.
  in_ns "$ns" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.nr0.rp_filter=0
  if ! rdma link show "rxe$i/1" >/dev/null 2>&1; then
    in_ns "$ns" rdma link add "rxe$i" type rxe netdev nr0
  fi
  local got; got=$(in_ns "$ns" rdma link show "rxe$i/1" | grep -o 'netdev [^ ]*' | cut -d' ' -f2 || true)
  [ "$got" = nr0 ] || die "host h$i: rxe$i exists but is bound to '${got:-?}', not nr0 of h$i"
  local j
  # The aggregators' neighbour entries are static: rxe resolves the next hop when a QP goes
  # to RTR, and an ARP reply from a TCG-slow aggregator namespace once came too late
  # (modify QP to RTR: ETIMEDOUT). Aggregator J's MAC is lab_aggregators.sh's.
  for ((j = 0; j < aggregators; j++)); do
    in_ns "$ns" ip neigh replace "$SUBNET.$((AGG_BASE + j))" \
      lladdr "$(printf '02:4e:52:00:01:%02x' $((j + 1)))" dev nr0 nud permanent
    in_ns "$ns" ip -4 addr replace "$AGG_NET.$j.$((i + 1))/32" dev nr0
    in_ns "$ns" ip route replace "$AGG_NET.$j.0/24" via "$SUBNET.$((AGG_BASE + j))" dev nr0 \
      src "$AGG_NET.$j.$((i + 1))"
  done
}

rocev2_ipv4_gid() {  # dev: the first RoCE v2 GID that maps an IPv4 address
  local d=/sys/class/infiniband/$1/ports/1 g n
  for g in "$d"/gids/*; do
    n=${g##*/}
    case $(cat "$g" 2>/dev/null) in
      0000:0000:0000:0000:0000:ffff:*)
        [ "$(cat "$d/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] && { cat "$g"; return 0; } ;;
    esac
  done
  return 0
}

USABLE_WAIT=30   # seconds `up` waits for every rxe device to be usable in its namespace

wait_usable() {  # hosts: until libibverbs in hI opens rxeI and its port is ACTIVE, for every I
  # The verbs view (netlink device list, /dev/infiniband/uverbsN, the provider) is not the
  # sysfs one `status` prints: wait for udev to finish with the new devices, then open each
  # device from its own namespace exactly as a rank would, so the first rank never races them.
  local n=$1 i t0=$SECONDS pending settled rounds=0 late=""
  command -v udevadm >/dev/null && udevadm settle --timeout="$USABLE_WAIT" 2>/dev/null || true
  settled=$((SECONDS - t0))
  while :; do
    rounds=$((rounds + 1))
    pending=()
    for ((i = 0; i < n; i++)); do
      in_ns "h$i" ibv_devinfo -d "rxe$i" 2>/dev/null | grep -q 'state:.*PORT_ACTIVE' || pending+=("rxe$i")
    done
    [ ${#pending[@]} = 0 ] && break
    [ $rounds = 1 ] && late="${pending[*]}"
    if [ $((SECONDS - t0)) -ge "$USABLE_WAIT" ]; then
      echo "setup_rxe.sh: ${pending[*]} not usable from their namespaces after ${USABLE_WAIT}s:" >&2
      for ((i = 0; i < n; i++)); do
        echo "  h$i: ibv_devices: $(in_ns "h$i" ibv_devices 2>&1 | tail -n +3 | awk '{print $1}' | tr '\n' ' ')" >&2
      done
      echo "  rdma link: $(rdma link show 2>&1 | tr '\n' ';')" >&2
      echo "  /dev/infiniband: $(ls /dev/infiniband 2>&1 | tr '\n' ' ')" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "setup_rxe.sh: rxe0..rxe$((n - 1)) usable from their namespaces after $((SECONDS - t0)) s" \
    "(udev settled in ${settled} s; ${late:-every device} ${late:+not usable at first, }usable after $rounds round(s))" >&2
}

hosts_present() { ip netns list | awk '{print $1}' | { grep -E '^h[0-9]+$' || true; } | sed 's/^h//' | sort -n; }

cmd_up() {
  [ -n "$hosts" ] || die "up needs --hosts N"
  [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "--hosts must be 1..200"
  [ "$mtu" -ge 1500 ] || die "--mtu must be >= 1500"
  check_kernel
  for ((i = 0; i < hosts; i++)); do host_up "$i"; done
  wait_usable "$hosts"
  cmd_status
}

# A process left in a host's namespace keeps it alive after `ip netns del`, with its NIC
# in it, out of reach of the next `up`: SIGTERM them, SIGKILL what is left after 5 s.
stop_ns_processes() {
  local pids t
  pids=$(ip netns pids "$1" 2>/dev/null | tr '\n' ' ')
  [ -n "${pids// /}" ] || return 0
  echo "setup_rxe.sh: stopping the processes left in $1: $pids" >&2
  kill $pids 2>/dev/null || true
  for ((t = 0; t < 50; t++)); do
    [ -n "$(ip netns pids "$1" 2>/dev/null)" ] || return 0
    sleep 0.1
  done
  kill -9 $(ip netns pids "$1" 2>/dev/null) 2>/dev/null || true
}

cmd_down() {
  local i
  for i in $(hosts_present); do
    stop_ns_processes "h$i"
    rdma link show "rxe$i/1" >/dev/null 2>&1 && in_ns "h$i" rdma link delete "rxe$i" 2>/dev/null || true
    ip netns del "h$i"
  done
  # A VM NIC that was nr0 returns to the root namespace when its namespace goes (once no
  # process holds the namespace: hence the stop above): nothing to do.
  echo "setup_rxe.sh: lab hosts removed"
}

cmd_status() {
  local any=0 i
  local rack_col=""
  [ "$racks" -gt 1 ] && rack_col=" rack"
  printf '%-4s %-8s %-15s %-17s %-6s %-6s %-40s %s\n' host netdev address mac mtu rxe gid "switch-port$rack_col"
  [ -n "$hosts" ] || hosts=$(hosts_present | wc -w)
  for i in $(hosts_present); do
    any=1
    local addr mac mtu_ rxe gid port
    addr=$(in_ns "h$i" ip -4 -o addr show dev nr0 2>/dev/null | awk '{print $4}' | head -1)
    mac=$(in_ns "h$i" cat /sys/class/net/nr0/address 2>/dev/null || echo -)
    mtu_=$(in_ns "h$i" cat /sys/class/net/nr0/mtu 2>/dev/null || echo -)
    rxe=-; gid=-
    if rdma link show "rxe$i/1" >/dev/null 2>&1; then
      rxe="rxe$i"
      gid=$(rocev2_ipv4_gid "rxe$i")
      gid=${gid:--}
    fi
    if ns_exists "$switch_ns" && in_ns "$switch_ns" ip link show "nrp$i" >/dev/null 2>&1; then
      port="$((i + 1)) ($switch_ns/nrp$i)"
    else
      port="$((i + 1)) (NIC)"
    fi
    [ "$racks" -gt 1 ] && port+=" tor$(rack_of "$i")"
    printf '%-4s %-8s %-15s %-17s %-6s %-6s %-40s %s\n' "h$i" nr0 "${addr:--}" "$mac" "$mtu_" "$rxe" "$gid" "$port"
  done
  [ $any = 1 ] || echo "(no lab hosts)"
}

[ $# -ge 1 ] || { usage; exit 2; }
cmd=$1; shift
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --switch-ns) switch_ns=$2; shift 2 ;;
    --racks) racks=$2; shift 2 ;;
    --nic) nic[${2%%=*}]=${2#*=}; shift 2 ;;
    --aggregators) aggregators=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ $racks =~ ^[0-9]+$ ]] && [ "$racks" -ge 1 ] || die "--racks must be a positive number"
[[ $aggregators =~ ^[0-9]$ ]] || die "--aggregators must be 0..9"
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, rdma link)"
case $cmd in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  -h|--help|help) usage ;;
  *) die "unknown command $cmd (up|down|status)" ;;
esac
