#!/usr/bin/env bash
# lab.sh — run a command on the NetReduce lab's hosts side, with the switch up.
#
#   scripts/lab.sh [--hosts N] [--mtu M] [--vm|--native] [--switch native|soft|bridge|bmv2]
#                  [--racks R [--link-loss PCT]] [--memory SIZE] [--cpus N] [--tcg single|multi]
#                  [--name NAME] [--preload MOD,...] [--aggregators K] -- CMD [ARGS...]
#
# The lab: hosts h0..hN-1 (network namespaces, rxe device each, 10.77.0.(I+1)), every host
# cabled to a port of one switch; the switch process (python -m switch, with its controller
# on 10.77.0.254:50051, cabled to the last port) runs in namespace NAME (--name, default
# nrlab).
#  - native (a kernel with per-namespace rxe, Linux >= 7.1): hosts are namespaces on this
#    machine, cabled by veth pairs to the switch namespace.
#  - vm (every other kernel, e.g. these machines'): one virtme-ng boot of the Debian kernel
#    that scripts/install.sh unpacked, under TCG; one virtio NIC per host whose other end is
#    a tap in nrlab, where the switch runs natively (emulation slows Python ~10x: the switch,
#    the hot spot, stays outside). CMD runs inside the VM as root, in its root namespace, with
#    the repo shared read-write at the same path, PATH starting with the venv, and
#    NR_LAB_HOSTS, NR_CONTROLLER, NR_LAB_DIR, NR_LAB_SWITCH (--switch), NR_LAB_SWITCHES (the
#    kinds CMD may restart the switch as: soft, native, racks, and bmv2 when p4c and
#    simple_switch_grpc are on lab.sh's PATH) and NR_LAB_RACKS (--racks) set.
# CMD's output and exit code come back; no TTY needed. Everything created (taps, namespaces,
# processes) is removed afterwards; the switch's counters are printed. Runs of one NAME are
# serialised machine-wide with a lock (/run/lock/netreduce-lab.lock for nrlab, else
# netreduce-lab-NAME.lock): labs of different names (NR_LAB_NAME or --name; [a-z0-9-],
# 2..12 characters) run side by side, each with its own switch namespace and its own
# directory, .lab (nrlab) or .lab-NAME, with the same host addresses inside. CMD may restart the switch as soft,
# native or bmv2 (same ports and controller address, fresh state) through $NR_LAB_DIR/switch.request
# (tests/lab/labswitch.py: use_switch, restart_switch).
# --switch native (the default) runs the switch process on the C data plane (python -m switch
# --target native: AF_XDP on the taps, one worker; switch/native/README.md); --switch soft runs
# the Python one, the pipeline's executable reference. A fabric's roles (--racks) are Python.
# --switch bridge joins the same ports with a kernel bridge instead of the
# switch process (a reference for what forwarding costs; no controller, no aggregation);
# --switch bmv2 puts BMv2 simple_switch_grpc with switch/p4 on the same ports (needs p4c
# and BMv2 on PATH; rings through it must use RoCE path MTU 256). A BMv2 switch's programs
# are compiled before it starts, p4c's progress shown: minutes on a fresh clone, nothing
# once build/p4* are fresh (scripts/lab_switch.sh).
# --racks R (R >= 2) runs a two-tier fabric instead of the one switch (docs/multirack.md,
# labswitches/fabric_lab.py): the hosts spread over R racks as evenly as possible in host order
# (the host table says which rack), one ToR process per rack on its hosts' ports, one spine
# process cabled to every ToR by a veth (and to the controller's leg), and the fabric's
# controller on the same address; --link-loss PCT loses PCT % of the frames on every
# ToR-spine link, both ways. --racks R --switch bmv2 runs the ToRs as tor.p4 and the spine
# as spine.p4 on BMv2 (rings must span racks; BMv2 cannot lose frames on purpose, so the
# loss is tc's on its veths: labswitches/fabric_lab.py; p4c compiles tor.p4, ~4 min here, and
# spine.p4 first). The hosts' side
# may also restart the switch as kind "racks:R[:PCT[:SPINE[:TORS]]]" with SPINE and TORS
# soft (default) or bmv2, e.g. racks:2:0:bmv2 (a BMv2 spine under software ToRs), and back
# to soft. --racks 1 is the single-switch lab.
# --tcg multi (default) emulates each vCPU on a host thread of its own; --tcg single runs
# every vCPU on one host thread, so the int3 race below cannot happen, but the vCPU thread
# then holds QEMU's big lock and starves the 9p file server: imports crawl (the fork servers
# listened after 121 s instead of 21 s; with torch, not within 600 s: docs/lab.md).
# The VM boots with tsc=reliable and, before CMD, scripts/guest_patching.sh makes the kernel
# do now the run-time code patching a job would trigger (a patch while another emulated CPU
# runs can end in "Oops: int3 ... Kernel panic" under multi-threaded TCG), then reports how
# many patches still ran during CMD (docs/lab.md, "Boot panics").
# --preload MOD,... : modules the hosts' fork servers import once more, beside numpy and
# netreduce (docs/lab.md, "Warm starts"), e.g. torch,torch.distributed when CMD launches
# torch ranks several times (each cold import of torch costs ~45 s of emulated CPU per rank).
# --aggregators K (1..4): no switch between the hosts but a kernel bridge (a plain L2
# network) with K one-armed aggregation servers on it (python -m switch --one-armed, on the
# C data plane, or in Python with --switch soft; each in a namespace of its own:
# scripts/lab_aggregators.sh); each host routes 10.78.J.0/24 via
# aggregator J (scripts/setup_rxe.sh --aggregators), and CMD gets NR_CONTROLLER and
# NR_INC_ADDR listing every aggregator's controller and 10.78.J.0/24 (K > 1: each call
# split over the K, netreduce/shards.py) and NR_LAB_AGGREGATORS=K; CMD may restart aggregator J with
# kind "agg:J" (tests/lab/labswitch.py).
# Default: --hosts 4 --mtu 9000 --switch native --tcg multi, --native when possible, else --vm.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${NR_VENV:-$ROOT/.venv}
PY=$VENV/bin/python
lab_name=${NR_LAB_NAME:-nrlab}
CTL_IP=10.77.0.254 CTL_PORT=50051 CTL_MAC=02:4e:52:00:00:fe
hosts=4 mtu=9000 mode=auto switch=native memory=4G cpus=2 racks=1 link_loss=0 tcg=multi preload=
aggregators=0

say() { echo "[lab] $*" >&2; }
die() { echo "[lab] error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

while [ $# -gt 0 ]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --vm) mode=vm; shift ;;
    --native) mode=native; shift ;;
    --switch) switch=$2; shift 2 ;;
    --racks) racks=$2; shift 2 ;;
    --link-loss) link_loss=$2; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --tcg) tcg=$2; shift 2 ;;
    --name) lab_name=$2; shift 2 ;;
    --preload) preload=$2; shift 2 ;;
    --aggregators) aggregators=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ $# -ge 1 ] || die "no command given: scripts/lab.sh [options] -- CMD [ARGS...]"
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, taps)"
[ -x "$PY" ] || die "no venv at $VENV: run scripts/install.sh first"
[[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 64 ] || die "--hosts must be 2..64"
case $switch in soft|native|bridge|bmv2) ;; *) die "--switch must be soft, native, bridge or bmv2" ;; esac
case $tcg in single|multi) ;; *) die "--tcg must be single or multi" ;; esac
[[ $racks =~ ^[0-9]+$ ]] && [ "$racks" -ge 1 ] && [ "$racks" -le "$hosts" ] || die "--racks must be 1..--hosts"
[[ $link_loss =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--link-loss must be a percentage"
[[ $lab_name =~ ^[a-z0-9-]{2,12}$ ]] || die "--name must be 2..12 of [a-z0-9-]"
[[ $preload =~ ^[A-Za-z0-9_.,]*$ ]] || die "--preload takes module names, comma-separated"
[[ $aggregators =~ ^[0-4]$ ]] || die "--aggregators must be 0..4"
if [ "$aggregators" -gt 0 ]; then
  [ "$racks" = 1 ] && case $switch in soft|native) true ;; *) false ;; esac || die "--aggregators: the hosts are on a plain bridge with one-armed aggregators (no --racks, no --switch)"
  agg_target=$switch switch=aggregators   # lab_aggregators.sh: native or soft
fi
SWNS=$lab_name
if [ "$lab_name" = nrlab ]; then LABDIR=$ROOT/.lab; LOCK=/run/lock/netreduce-lab.lock
else LABDIR=$ROOT/.lab-$lab_name; LOCK=/run/lock/netreduce-lab-$lab_name.lock; fi
if [ "$racks" -gt 1 ]; then
  case $switch in
    soft|native) switch="racks:$racks:$link_loss" ;;   # the fabric's roles are Python
    bmv2) switch="racks:$racks:$link_loss:bmv2:bmv2"
          say "--racks $racks --switch bmv2: the ToRs run tor.p4 and the spine spine.p4 on BMv2 (switch/p4/README.md)" ;;
    *) die "--racks $racks runs a fabric: --switch soft or bmv2, not $switch" ;;
  esac
fi

native_ok() {
  modprobe rdma_rxe 2>/dev/null || return 1
  printf '%s\n%s\n' 7.1 "$(uname -r | sed 's/[-+].*//')" | sort -V -C
}
if [ $mode = auto ]; then
  if native_ok; then mode=native; else mode=vm; fi
elif [ $mode = native ] && ! native_ok; then
  die "--native: kernel $(uname -r) has no per-namespace rdma_rxe (needs >= 7.1); use --vm"
fi

mkdir -p "$LABDIR"
# One lab per name and machine: its switch namespace is machine-wide, whatever the clone.
mkdir -p "${LOCK%/*}"
exec 9>"$LOCK"
flock -w 3600 9 || die "another lab run holds $LOCK"
rm -f "$LABDIR"/fabric-* "$LABDIR"/{rc,switch.ready,switch-stats.json,switch.log,switch.pid,switch.kind,switch.request,switch.reply,cmd.sh,env,controller.token,tenant*.token,hosts.policy,fabric.token,ca.pem,controller.pem,controller.key}
# This run's controller secrets: the lab's own principal ("lab", the first entry: what the
# hosts' clients send) and TENANTS more, each also in a file of its own that a job can use
# as its token ($NR_LAB_TENANT_TOKENS: `netreduce bench --tenants` runs jobs as them).
TENANTS=3
secret() { echo "$1 $(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"; }
tenant_tokens=""
(umask 077
 secret lab > "$LABDIR/controller.token"
 for ((t = 0; t < TENANTS; t++)); do
   secret "tenant$t" | tee "$LABDIR/tenant$t.token" >> "$LABDIR/controller.token"
 done)
for ((t = 0; t < TENANTS; t++)); do tenant_tokens+="${tenant_tokens:+:}$LABDIR/tenant$t.token"; done
# The lab's hosts policy (a controller with several principals needs one, docs/security.md):
# the lab is one operator's, so each of its principals may use every lab host; an address
# still belongs to one principal's registered ring at a time. A shared switch gives each
# principal its own hosts instead.
{ echo "# principal  hosts (written by scripts/lab.sh)"
  for who in lab $(seq -f 'tenant%g' 0 $((TENANTS - 1))); do
    echo "$who 10.77.0.0/24$([ "$aggregators" -gt 0 ] && echo " 10.78.0.0/16")"
  done
} > "$LABDIR/hosts.policy"
# ... which travels only over TLS: the controller's certificate from a CA made for this run
"$ROOT/scripts/lab_tls.sh" "$LABDIR" "$CTL_IP" 127.0.0.1 $(for ((j = 0; j < aggregators; j++)); do echo "10.77.0.$((200 + j))"; done) || die "scripts/lab_tls.sh: cannot make the lab's TLS certificate (openssl)"

supervisor_pid=""
cleanup() {
  set +e
  if [ -n "$supervisor_pid" ]; then kill -TERM "$supervisor_pid" 2>/dev/null; wait "$supervisor_pid" 2>/dev/null; fi
  declare -F switch_stop >/dev/null && switch_stop
  declare -F aggregators_down >/dev/null && aggregators_down
  if [ -s "$LABDIR/switch.log" ]; then say "switch log and counters:"; sed 's/^/[switch] /' "$LABDIR/switch.log" >&2; fi
  [ $mode = native ] && "$ROOT/scripts/setup_rxe.sh" down --switch-ns "$SWNS" >/dev/null 2>&1
  ip netns del "$SWNS" 2>/dev/null
  true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the switch namespace: ports + the controller's own leg ------------------------------
ip netns del "$SWNS" 2>/dev/null || true
ip netns add "$SWNS"
ip -n "$SWNS" link set lo up
ip -n "$SWNS" link add nrctl type veth peer name nrctlp
ip -n "$SWNS" link set nrctl address "$CTL_MAC" mtu "$mtu" up
ip -n "$SWNS" link set nrctlp mtu "$mtu" up
ip -n "$SWNS" addr add "$CTL_IP/24" dev nrctl
for d in nrctl nrctlp; do ip netns exec "$SWNS" ethtool -K "$d" tx off tso off gso off gro off >/dev/null 2>&1 || true; done

ports=()
if [ $mode = native ]; then
  say "native lab: kernel $(uname -r), $hosts hosts on veths"
  "$ROOT/scripts/setup_rxe.sh" down --switch-ns "$SWNS" >/dev/null 2>&1 || true
  "$ROOT/scripts/setup_rxe.sh" up --hosts "$hosts" --mtu "$mtu" --switch-ns "$SWNS" --racks "$racks" \
    --aggregators "$aggregators" >&2
  for ((i = 0; i < hosts; i++)); do ports+=(--port "$((i + 1))=nrp$i"); done
else
  kver=$(ls -d /lib/modules/*/vmlinuz 2>/dev/null | sed 's|/lib/modules/||; s|/vmlinuz||' | sort -V | tail -1)
  [ -n "$kver" ] || die "no VM kernel under /lib/modules/*/vmlinuz: run scripts/install.sh"
  command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: run scripts/install.sh"
  say "vm lab: kernel $kver under TCG, $hosts hosts on virtio NICs, switch on taps in $SWNS"
  # the guest sees the code read-only (cached views, lab_guest.sh): compile it here, once
  "$PY" -m compileall -q "$ROOT"/{nr_contract,netreduce,flowctl,ring_setup,switch,labswitches,benchmarks,tests,examples} >/dev/null || true
  # nrroot: / once more, read-only, for the guest's cached views (scripts/lab_guest.sh)
  qemu_opts="-accel tcg,thread=$tcg -virtfs local,path=/,mount_tag=nrroot,security_model=none,readonly=on,multidevs=remap"
  for ((i = 0; i < hosts; i++)); do
    ip -n "$SWNS" tuntap add "nrtap$i" mode tap
    ip -n "$SWNS" link set "nrtap$i" mtu "$mtu" txqueuelen 10000 up
    ip netns exec "$SWNS" ethtool -K "nrtap$i" tx off tso off gso off gro off >/dev/null 2>&1 || true
    ports+=(--port "$((i + 1))=nrtap$i")
    qemu_opts+=" -netdev tap,id=nr$i,ifname=nrtap$i,script=no,downscript=no"
    qemu_opts+=" -device virtio-net-pci,netdev=nr$i,mac=$(printf '02:4e:52:00:00:%02x' $((i + 1))),host_mtu=$mtu"
  done
fi
ports+=(--port "$((hosts + 1))=nrctlp" --mac "$CTL_MAC=$((hosts + 1))")

# --- the switch and its supervisor: scripts/lab_switch.sh ----------------------------------
# Every host's MAC is configured: the software switch maps ring ports statically, BMv2 learns none.
for ((i = 0; i < hosts; i++)); do ports+=(--mac "$(printf '02:4e:52:00:00:%02x' $((i + 1)))=$((i + 1))"); done
. "$ROOT/scripts/lab_switch.sh"

case $switch in
  bridge)
    ip -n "$SWNS" link add nrbr type bridge
    ip -n "$SWNS" link set nrbr mtu "$mtu" up
    for ((i = 1; i < ${#ports[@]}; i += 2)); do
      [ "${ports[$((i - 1))]}" = --port ] || continue
      ip -n "$SWNS" link set "${ports[$i]#*=}" master nrbr
    done
    echo bridge > "$LABDIR/switch.kind"
    say "kernel bridge nrbr up: ${ports[*]}" ;;
  aggregators)
    . "$ROOT/scripts/lab_aggregators.sh"
    aggregators_up "${ports[@]}"
    echo "aggregators:$aggregators" > "$LABDIR/switch.kind"
    for ((j = 0; j < aggregators; j++)); do aggregator_start "$j" || die "$agg_error"; done
    say "kernel bridge nrbr joins the hosts and $aggregators one-armed aggregator(s)" ;;
  *) switch_start "$switch" || die "$switch_error" ;;
esac
switch_supervise &
supervisor_pid=$!
switch_kinds="soft native racks"        # what the supervisor can start (NR_LAB_SWITCHES on the hosts' side)
if command -v p4c >/dev/null && command -v simple_switch_grpc >/dev/null; then switch_kinds+=" bmv2"; fi

# --- the command ---------------------------------------------------------------------------
{
  printf 'export PATH=%q\n' "$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  printf 'export HOME=/root NR_LAB=1 NR_LAB_HOSTS=%q NR_LAB_MTU=%q NR_LAB_DIR=%q NR_CONTROLLER=%q NR_CONTROLLER_TOKEN=%q NR_CONTROLLER_CA=%q\n' \
    "$hosts" "$mtu" "$LABDIR" "$CTL_IP:$CTL_PORT" "$LABDIR/controller.token" "$LABDIR/ca.pem"
  printf 'export NR_LAB_SWITCHES=%q NR_LAB_SWITCH=%q NR_LAB_RACKS=%q NR_LAB_TENANT_TOKENS=%q\n' "$switch_kinds" "$switch" "$racks" "$tenant_tokens"
  printf 'export NR_FORKSERVERS=/run/netreduce-forkservers\n'
  # rxe's retry forever unless the caller sets a budget: under TCG (and CI's load beside it)
  # an ACK can come later than a real NIC's 7 x 67 ms; the budget's own tests set the finite
  # default (tests/lab/test_transport_faults.py, the DDP flaps of test_torch.py)
  printf 'export NR_RETRY_CNT=%q\n' "${NR_RETRY_CNT:-7}"
  # one variable a line: lab_guest.sh reads NR_LAB_VENV and NR_LAB_AGGREGATORS with sed
  printf 'export NR_LAB_VENV=%q\nexport NR_LAB_PRELOAD=%q\nexport NR_LAB_AGGREGATORS=%q\n' \
    "$VENV" "$preload" "$aggregators"
  if [ "$aggregators" -gt 0 ]; then
    # K > 1: one controller and one routed "inc" network per aggregator (netreduce/shards.py)
    ctls=$(for ((j = 0; j < aggregators; j++)); do printf '10.77.0.%d:%s,' $((200 + j)) "$CTL_PORT"; done)
    incs=$(for ((j = 0; j < aggregators; j++)); do printf '10.78.%d.0/24,' "$j"; done)
    printf 'export NR_CONTROLLER=%q NR_INC_ADDR=%q\n' "${ctls%,}" "${incs%,}"
  fi
  for v in CI PYTEST_ADDOPTS NR_DEBUG; do
    [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  true
} > "$LABDIR/env"
printf '%q ' "$@" > "$LABDIR/cmd.sh"; echo >> "$LABDIR/cmd.sh"

BOOT_LOGS=30           # guest kernel logs kept in .lab/boots/
ALARMS='BUG:|Oops|Kernel panic|Call Trace|WARNING:|Out of memory|oom-kill|segfault|general protection'
console_alarms() {  # the guest kernel log's oops/panic/OOM/segfault lines, if any
  grep -qE "$ALARMS" "$1" 2>/dev/null || return 0
  say "guest kernel log $1: oops/panic/OOM/segfault lines:"
  grep -E "$ALARMS" "$1" | tail -n 40 | sed 's/^/[guest-kernel] /' >&2
  if grep -q 'Oops: int3' "$1"; then
    say "the guest hit a stale int3 of run-time code patching (multi-threaded TCG): see docs/lab.md, \"Boot panics\"; --tcg single avoids it"
  fi
}
kernel_log_opts() {  # qemu options: a virtio console whose output goes to file $1
  echo "-device virtio-serial-pci,id=nrkcon -chardev file,id=nrkcon0,path=$1 -device virtconsole,chardev=nrkcon0,bus=nrkcon.0"
}
console_tail() {  # ... and its last lines (for a boot that gave no exit code)
  [ -s "$1" ] || { say "the guest kernel log $1 is empty"; return 0; }
  say "guest kernel log, last 40 lines ($1):"
  tail -n 40 "$1" | sed 's/^/[guest-kernel] /' >&2
}
rc=0
if [ $mode = native ]; then
  (set +u; . "$LABDIR/env"; cd "$ROOT"; scripts/lab_forkservers.sh start "$hosts"
   trap 'scripts/lab_forkservers.sh stop' EXIT; bash "$LABDIR/cmd.sh") || rc=$?
else
  # Every boot keeps its guest kernel log in .lab/boots/ (the last BOOT_LOGS): a second
  # kernel console, hvc0 on a virtio console of its own, at loglevel 7, written by qemu on
  # the host, so it survives an oops or a panic (vng sends ttyS0 to /dev/null, and the one
  # 8250 console cannot serve two UARTs). A boot
  # that died before the guest started the command (no .lab/started) is booted once more,
  # loudly; one that died while the command ran is not (the command may have had effects).
  mkdir -p "$LABDIR/boots"
  for attempt in 1 2; do
    rm -f "$LABDIR/rc" "$LABDIR/started"
    console=$LABDIR/boots/$(date -u +%Y%m%dT%H%M%SZ)-$$-$attempt.console.log
    t0=$(date +%s)
    # qemu opens its console as /proc/self/fd/1 and /2 with O_TRUNC: a log file the caller
    # redirected to would be truncated mid-run. So vng only ever sees pipes.
    { PATH="$VENV/bin:$PATH" ip netns exec "$SWNS" "$VENV/bin/vng" --run "/lib/modules/$kver/vmlinuz" --disable-kvm \
        --user root --memory "$memory" --cpus "$cpus" --rwdir "$ROOT" \
        --qemu-opts="$qemu_opts $(kernel_log_opts "$console")" --append "console=hvc0 loglevel=7 tsc=reliable" \
        --exec "$ROOT/scripts/lab_guest.sh $hosts $mtu $racks $LABDIR" < /dev/null 2>&1 1>&3 3>&- | cat >&2; } 3>&1 | cat || true
    say "VM ran $(( $(date +%s) - t0 )) s; guest kernel log: ${console#"$ROOT"/}"
    # (qemu opened the log with O_TRUNC at boot: only now may the host add to it)
    echo "nr-lab: boot of lab $lab_name: tcg=$tcg, $cpus vCPU(s), $hosts host(s), VM ran $(( $(date +%s) - t0 )) s" >> "$console"
    if [ -f "$LABDIR/rc" ]; then
      rc=$(cat "$LABDIR/rc")
      console_alarms "$console"
      break
    fi
    console_alarms "$console"; console_tail "$console"
    if [ -f "$LABDIR/started" ]; then
      say "the VM ended while the command ran and gave no exit code (guest kernel log above)"
      rc=1; break
    fi
    if [ $attempt = 1 ]; then
      say "RETRYING: the VM ended before the guest started the command (guest kernel log above); booting once more"
    else
      say "the VM ended twice before the guest started the command: giving up"
      rc=1
    fi
  done
  { ls -1t "$LABDIR"/boots/*.console.log 2>/dev/null | tail -n +$((BOOT_LOGS + 1)) | xargs -r rm -f; } || true
fi
say "command exited $rc"
exit "$rc"
