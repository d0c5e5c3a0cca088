#!/usr/bin/env bash
# lab_boots.sh [DIR ...] — what the lab's kept guest kernel logs say (default: .lab/boots of
# this tree; scripts/lab.sh keeps the last 30 boots' logs there): per boot, whether it
# oopsed or panicked (an "Oops: int3" is the run-time code patching race of multi-threaded
# TCG: docs/lab.md, "Boot panics"), and how many kernel code patches ran during its command
# (scripts/guest_patching.sh writes the count into the log; "-" when the boot ended before
# it could). Ends with the totals. Exit code 1 when any boot panicked or oopsed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- "$ROOT/.lab/boots"
logs=()
for d in "$@"; do
  [ -d "$d" ] || { echo "lab_boots.sh: no directory $d" >&2; exit 2; }
  for f in "$d"/*.console.log; do [ -e "$f" ] && logs+=("$f"); done
done
boots=0 bad=0 int3=0 patched=0 counted=0
printf '%-44s %-8s %s\n' "boot (guest kernel log)" "patches" "oops / panic"
for f in "${logs[@]}"; do
  boots=$((boots + 1))
  n=$(sed -n 's/.*nr-lab: kernel code patches during the command: \([0-9]*\).*/\1/p' "$f" | tail -1)
  if [ -n "$n" ]; then counted=$((counted + 1)); [ "$n" -gt 0 ] && patched=$((patched + 1)); fi
  what=$(grep -oE 'Oops: [a-z0-9]+|Kernel panic - [^:]*' "$f" | sort -u | paste -sd, -)
  if [ -n "$what" ]; then
    bad=$((bad + 1))
    grep -q 'Oops: int3' "$f" && int3=$((int3 + 1))
  fi
  printf '%-44s %-8s %s\n' "$(basename "$f")" "${n:--}" "${what:-none}"
done
echo "boots: $boots; oopsed or panicked: $bad (int3: $int3); with the patch count: $counted, of which with patches during the command: $patched"
[ "$bad" = 0 ]
