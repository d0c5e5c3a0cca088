#!/usr/bin/env bash
# lab_guest.sh HOSTS MTU [RACKS] — run by scripts/lab.sh inside the lab VM (as root): brings the hosts
# up on the virtio NICs (matched by MAC; setup_rxe.sh returns once every rxe device opens
# through libibverbs from its namespace), marks .lab/started, runs the command lab.sh wrote,
# records its exit code in .lab/rc. lab.sh boots again when a VM ends without .lab/started.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LABDIR=$ROOT/.lab
hosts=$1 mtu=$2 racks=${3:-1}
rc=1
trap 'echo "$rc" > "$LABDIR/rc"' EXIT

nics=()
for ((i = 0; i < hosts; i++)); do nics+=(--nic "$i=$(printf '02:4e:52:00:00:%02x' $((i + 1)))"); done
if ! out=$("$ROOT/scripts/setup_rxe.sh" up --hosts "$hosts" --mtu "$mtu" --racks "$racks" "${nics[@]}" 2>&1); then
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
