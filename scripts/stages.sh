# stages.sh — sourced by .ci/run and scripts/test.sh: time named stages, print them as a table.
#
#   stage NAME CMD [ARGS...]   runs CMD; records "NAME<TAB>seconds<TAB>ok|failed (rc N)" in
#                              $NR_STAGES (a file; test.sh makes one when the caller did
#                              not) and returns CMD's exit code
#   stages_table               prints the recorded stages and their total
# The invariant: every stage that started is in the table, the one that failed included, so a
# slow or failed CI run says where its time went.

stage() {
  local name=$1 t0 rc=0
  shift
  echo "==> [$name] $*" | cut -c1-160
  t0=$(date +%s)
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" \
    "$([ $rc = 0 ] && echo ok || echo "failed (rc $rc)")" >> "$NR_STAGES"
  return $rc
}

stages_table() {
  [ -s "${NR_STAGES:-}" ] || return 0
  awk -F'\t' 'BEGIN { printf "\n%-44s %9s  %s\n", "stage", "seconds", "result" }
              { printf "%-44s %9d  %s\n", $1, $2, $3; total += $2 }
              END { printf "%-44s %9d  (%d min %d s)\n", "total", total, total / 60, total % 60 }' "$NR_STAGES"
}
