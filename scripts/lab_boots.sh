#!/usr/bin/env bash
# lab_boots.sh [DIR ...] — what the lab's kept guest kernel logs say (default: .lab/boots of
# this tree; scripts/lab.sh keeps the last 30 boots' logs there): per boot, whether it
# oopsed or panicked (an "Oops: int3" is the run-time code patching race of multi-threaded
# TCG: docs/lab.md, "Boot panics"), and how many kernel code patches ran during its command
# (scripts/guest_patching.sh writes the count into the log; "-" when the boot ended before
# it could), with the TCG mode it ran under (scripts/lab.sh writes it at the end of the log;
# "-" for older logs). Ends with the totals, per mode. Exit code 1 when any boot panicked or
# oopsed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- "$ROOT/.lab/boots"
logs=()
for d in "$@"; do
  [ -d "$d" ] || { echo "lab_boots.sh: no directory $d (no boot of that lab yet)" >&2; continue; }
  for f in "$d"/*.console.log; do [ -e "$f" ] && logs+=("$f"); done
done
boots=0 bad=0 int3=0 patched=0 counted=0
declare -A by_mode=() bad_by_mode=()
printf '%-44s %-7s %-8s %s\n' "boot (guest kernel log)" "tcg" "patches" "oops / panic"
for f in "${logs[@]}"; do
  boots=$((boots + 1))
  mode=$(sed -n 's/^nr-lab: boot of lab .*: tcg=\([a-z]*\),.*/\1/p' "$f" | tail -1)
  mode=${mode:--}
  by_mode[$mode]=$(( ${by_mode[$mode]:-0} + 1 ))
  n=$(sed -n 's/.*nr-lab: kernel code patches during the command: \([0-9]*\).*/\1/p' "$f" | tail -1)
  if [ -n "$n" ]; then counted=$((counted + 1)); [ "$n" -gt 0 ] && patched=$((patched + 1)); fi
  what=$(grep -oE 'Oops: [a-z0-9]+|Kernel panic - [^:]*' "$f" | sort -u | paste -sd, -)
  if [ -n "$what" ]; then
    bad=$((bad + 1))
    bad_by_mode[$mode]=$(( ${bad_by_mode[$mode]:-0} + 1 ))
    grep -q 'Oops: int3' "$f" && int3=$((int3 + 1))
  fi
  printf '%-44s %-7s %-8s %s\n' "$(basename "$f")" "$mode" "${n:--}" "${what:-none}"
done
echo "boots: $boots; oopsed or panicked: $bad (int3: $int3); with the patch count: $counted, of which with patches during the command: $patched"
for mode in "${!by_mode[@]}"; do
  echo "  tcg=$mode: ${by_mode[$mode]} boot(s), ${bad_by_mode[$mode]:-0} oopsed or panicked"
done
[ "$bad" = 0 ]
