#!/usr/bin/env bash
# guest_patching.sh settle|report — run by scripts/lab_guest.sh inside the lab VM (as root).
#
# Why: the kernel rewrites its own code at run time (jump labels / static keys, static calls)
# with int3 breakpoints and cross-CPU syncs (text_poke_bp). Under multi-threaded TCG another
# emulated CPU can still run a stale translation holding the int3 after the patch completed:
# "Oops: int3" in whatever function held the site, then "Kernel panic - not syncing: Fatal
# exception in interrupt". Traced in the lab (ftrace on arch_jump_label_transform_queue), a
# job's patches come from (a) net_get_random_once() sites (DO_ONCE: the first TCP/UDP
# hash of a boot flips a key from a worker, e.g. in udp_ehashfn), (b) sched_clock turning
# unstable when the clocksource watchdog distrusts the TSC (sched_clock_cpu; lab.sh boots
# with tsc=reliable, so that never happens), (c) tc ingress/clsact and filters turning
# global keys on and off (the fault tests' netem through an ifb), (d) the UDP encapsulation
# keys, which the first rxe device's tunnel sockets turn on and the last one's removal
# turns off (`rdma link delete`, as test_setup_rxe_is_idempotent does: 46 patches in a CI
# boot before this was held), (e) receive timestamps (netstamp_needed_key: SO_TIMESTAMP of
# every ping, switched from a worker; 22 patches in the next CI boot).
#
# settle: makes all of that happen now, while nothing else runs, and holds the tc keys on
#   for the whole boot (a dummy device nrkeys with clsact, a matchall/mirred filter and
#   netem, never removed) and the socket keys (a process holding a v4 and a v6 UDP socket
#   with UDP_ENCAP and SO_TIMESTAMP set), then waits for the deferred key workers; and starts an
#   ftrace watch on the code patchers (no cost unless they run).
# report: prints how many code patches ran since `settle` and, per distinct call chain,
#   how many and from where (0 is the goal: every patch during the command is a chance of
#   that panic under TCG).
set -uo pipefail

TRACING=/sys/kernel/tracing
PATCHERS=(arch_jump_label_transform_queue arch_static_call_transform smp_text_poke_single)
CAUSES=(__do_once_done __do_once_sleepable_done)   # traced too: their stacks name the site

say() { echo "[lab-guest] $*" >&2; }

warm_sockets() {  # the first TCP/UDP (v4, v6) hashes of the boot: every net_get_random_once
  python3 - <<'EOF'
import socket
for fam, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    try:
        srv = socket.socket(fam, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        srv.bind((addr, 0)); srv.listen(1)
        cli = socket.create_connection(srv.getsockname()[:2], timeout=5)
        acc, _ = srv.accept(); cli.sendall(b"x"); acc.recv(1)
        udp = []
        for _ in range(2):   # two reuseport listeners: the lookup hashes (udp_ehashfn)
            u = socket.socket(fam, socket.SOCK_DGRAM)
            u.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            u.bind((addr, udp[0].getsockname()[1] if udp else 0)); u.settimeout(5); udp.append(u)
        snd = socket.socket(fam, socket.SOCK_DGRAM)
        snd.connect(udp[0].getsockname()[:2])            # a connected socket: its 4-tuple hash
        snd.send(b"x")
        for u in udp:
            u.setblocking(False)
            try:
                u.recv(1)
            except BlockingIOError:
                pass
        for s in (srv, cli, acc, snd, *udp):
            s.close()
    except OSError as e:
        print(f"[lab-guest] socket warm-up over {addr}: {e}")
EOF
}

hold_tc_keys() {  # tc's global keys on for the whole boot: later adds/removes never flip them
  # Two dummy devices (frames sent to them vanish), each with a link-local /30 so a ping
  # leaves through it: nrkeys with netem, clsact and matchall/mirred filters to an ifb;
  # nrhash with 4 tx queues, whose queue choice hashes a frame (the flow dissector's once,
  # which rxe's first frame through a host's fq_codel would otherwise flip mid-job).
  modprobe -q ifb 2>/dev/null; modprobe -q sch_netem 2>/dev/null
  ip link add nrkeys type dummy 2>/dev/null || return 0
  ip link add nrkeysifb type ifb 2>/dev/null
  ip link add nrhash numtxqueues 4 type dummy 2>/dev/null
  local d
  for d in nrkeys nrkeysifb nrhash; do ip link set "$d" up 2>/dev/null; done
  ip addr add 169.254.77.1/30 dev nrkeys 2>/dev/null
  ip addr add 169.254.77.5/30 dev nrhash 2>/dev/null
  tc qdisc add dev nrkeys root netem loss 1% 2>/dev/null
  tc qdisc add dev nrkeys clsact 2>/dev/null
  tc filter add dev nrkeys ingress matchall action mirred egress redirect dev nrkeysifb 2>/dev/null
  tc filter add dev nrkeys egress matchall action mirred egress redirect dev nrkeysifb 2>/dev/null
  tc qdisc add dev nrkeysifb root netem loss 1% 2>/dev/null
  ping -c 2 -i 0.2 -W 1 169.254.77.2 >/dev/null 2>&1
  python3 - <<'EOF_PY'    # a frame with no socket hash, as rxe sends them
import socket
frame = (bytes.fromhex("02000000000602000000000508004500001c000100004011") + bytes(2)
         + socket.inet_aton("169.254.77.5") + socket.inet_aton("169.254.77.6")
         + bytes.fromhex("12b712b700080000"))
try:
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind(("nrhash", 0)); s.send(frame)
except OSError as e:
    print(f"[lab-guest] raw frame through nrhash: {e}")
EOF_PY
}

hold_socket_keys() {  # a process for the whole boot holding sockets that keep keys on:
  # UDP encapsulation (rxe's tunnel sockets) and receive timestamps (netstamp_needed_key,
  # which every ping's SO_TIMESTAMP turned on and off from a worker: 22 patches in a CI boot)
  setsid python3 - >/dev/null 2>&1 </dev/null <<'EOF_PY' &
import signal, socket
SOL_UDP, UDP_ENCAP, UDP_ENCAP_ESPINUDP, SO_TIMESTAMP = 17, 100, 2, 29   # linux/udp.h, asm-generic/socket.h
held = []
for fam in (socket.AF_INET, socket.AF_INET6):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.setsockopt(SOL_UDP, UDP_ENCAP, UDP_ENCAP_ESPINUDP)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    held.append(s)
signal.pause()
EOF_PY
}

settle() {
  warm_sockets
  hold_tc_keys
  hold_socket_keys
  sleep 2     # the DO_ONCE keys flip from a worker after the first use
  mountpoint -q "$TRACING" || mount -t tracefs nodev "$TRACING" 2>/dev/null || {
    say "no tracefs: code patches during the command are not counted"; return 0; }
  : > "$TRACING/set_ftrace_filter"
  local f
  for f in "${PATCHERS[@]}" "${CAUSES[@]}"; do echo "$f" >> "$TRACING/set_ftrace_filter" 2>/dev/null; done
  echo 1 > "$TRACING/options/func_stack_trace"
  echo function > "$TRACING/current_tracer" && echo 1 > "$TRACING/tracing_on"
  sleep 1
  : > "$TRACING/trace"    # what enabling the tracer patched is not the command's
}

report() {
  [ -r "$TRACING/trace" ] && [ "$(cat "$TRACING/current_tracer" 2>/dev/null)" = function ] || return 0
  local n
  n=$(grep -cE "^ *[^#=].* ($(IFS='|'; echo "${PATCHERS[*]}")) <-" "$TRACING/trace")
  say "kernel code patches during the command: $n (each one a chance of an int3 panic under multi-threaded TCG)"
  # ... and into the guest kernel log, which lab.sh keeps per boot (scripts/lab_boots.sh)
  echo "nr-lab: kernel code patches during the command: $n" > /dev/kmsg 2>/dev/null
  if [ "$n" -gt 0 ]; then    # per distinct call chain: how many, the first time, the chain
    python3 - "$TRACING/trace" "${PATCHERS[@]}" <<'EOF_PY' >&2
import re, sys
path, patchers = sys.argv[1], set(sys.argv[2:])
chains, first, current = {}, {}, None
for line in open(path):
    m = re.match(r"\s*(\S+)\s+\[\d+\]\s+\S+\s+([\d.]+): (\w+) <-", line)
    if m:
        current = [m[1], m[2]] if m[3] in patchers else None
        continue
    f = re.match(r"\s*=> (\S+)", line)
    if f and current is not None and not f[1].startswith("[") and len(current) < 10:
        current.append(f[1])
        if len(current) == 10 or f[1].startswith("entry_SYSCALL") or f[1] == "ret_from_fork":
            key = " < ".join(current[4:])
            chains[key] = chains.get(key, 0) + 1
            first.setdefault(key, f"{current[0]} at {current[1]} s")
            current = None
for key, count in sorted(chains.items(), key=lambda kv: -kv[1]):
    print(f"[lab-guest]   {count} x ({first[key]}): {key}")
EOF_PY
  fi
}

case ${1:-} in
  settle) settle ;;
  report) report ;;
  *) echo "usage: $0 settle|report" >&2; exit 2 ;;
esac
