#!/usr/bin/env bash
# lab_guest.sh HOSTS MTU [RACKS [LABDIR]] — run by scripts/lab.sh inside the lab VM (as root): brings the hosts
# up on the virtio NICs (matched by MAC; setup_rxe.sh returns once every rxe device opens
# through libibverbs from its namespace), marks LABDIR/started, runs the command lab.sh wrote
# (LABDIR/cmd.sh), records its exit code in LABDIR/rc (LABDIR: the lab's directory, .lab by
# default). lab.sh boots again when a VM ends without LABDIR/started.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
hosts=$1 mtu=$2 racks=${3:-1} LABDIR=${4:-$ROOT/.lab}
rc=1
trap 'echo "$rc" > "$LABDIR/rc"' EXIT

# The guest reads the machine's files over 9p, uncached: every stat and open is a round trip
# through the emulated virtio queue (~1.5 ms), so `python -c pass` took 8 s and
# `import numpy, grpc, netreduce.comm` 40 s. A second, read-only export of / (nrroot, which
# lab.sh adds) is mounted with cache=loose and laid over what the lab only reads: /usr, the
# venv and the project's code (not LABDIR, which the supervisor writes during the run, nor the
# rest of the tree). Measured in one boot: 1.4 s and 7-11 s (docs/lab.md, "Cached views").
# These views show the files as they were at boot: nothing edits them during a lab run.
cached_views() {
  local share=/run/nrroot d
  grep -qw nrroot /sys/bus/virtio/drivers/9pnet_virtio/virtio*/mount_tag 2>/dev/null || {
    echo "[lab-guest] no nrroot export: the lab reads every file uncached" >&2; return 0; }
  mkdir -p "$share" /run/nrusr/upper /run/nrusr/work
  if ! mount -t 9p -o ro,trans=virtio,version=9p2000.L,cache=loose,msize=512000,access=any \
       nrroot "$share"; then
    echo "[lab-guest] warning: mounting the cached export failed: every file is read uncached" >&2
    return 0
  fi
  # /usr: an overlay, so that what the guest writes there (e.g. a missing .pyc) stays possible
  mount -t overlay overlay -o "lowerdir=$share/usr,upperdir=/run/nrusr/upper,workdir=/run/nrusr/work" /usr
  for d in "$NR_LAB_VENV" "$ROOT"/{nr_contract,netreduce,flowctl,ring_setup,switch,labswitches,benchmarks,tests,examples}; do
    [ -d "$share$d" ] && mount --bind -o ro "$share$d" "$d"
  done
}
NR_LAB_VENV=$(sed -n 's/^export NR_LAB_VENV=//p' "$LABDIR/env")
aggregators=$(sed -n 's/^export NR_LAB_AGGREGATORS=//p' "$LABDIR/env")
cached_views

nics=()
for ((i = 0; i < hosts; i++)); do nics+=(--nic "$i=$(printf '02:4e:52:00:00:%02x' $((i + 1)))"); done
if ! out=$("$ROOT/scripts/setup_rxe.sh" up --hosts "$hosts" --mtu "$mtu" --racks "$racks" \
           --aggregators "${aggregators:-0}" "${nics[@]}" 2>&1); then
  echo "$out" >&2
  echo "[lab-guest] error: setup_rxe.sh up failed" >&2
  exit
fi
echo "$out" | sed 's/^/[lab-guest] /' >&2

# Run-time kernel code patching while the command runs can panic a multi-threaded TCG guest:
# have it happen now, and count what still happens during the command.
"$ROOT/scripts/guest_patching.sh" settle

set +u
. "$LABDIR/env"
set -u
cd "$ROOT"
: > "$LABDIR/started"
# ranks fork from these (netreduce launch): their imports are paid here, once per host
scripts/lab_forkservers.sh start "$hosts" || exit
bash "$LABDIR/cmd.sh"
rc=$?
scripts/lab_forkservers.sh stop
"$ROOT/scripts/guest_patching.sh" report
