# stages.sh — sourced by .ci/run and scripts/test.sh: time named stages, print them as a table.
#
#   stage NAME CMD [ARGS...]   runs CMD; records "NAME<TAB>seconds<TAB>ok|failed (rc N)<TAB>
#                              start (epoch s)" in
#                              $NR_STAGES (a file; test.sh makes one when the caller did
#                              not) and returns CMD's exit code
#   stages_table               prints the recorded stages and the wall time since the first
#                              one started (stages run in the background overlap others:
#                              their seconds are not added up)
# The invariant: every stage that started is in the table, the one that failed included, so a
# slow or failed CI run says where its time went.

stage() {
  local name=$1 t0 rc=0
  shift
  echo "==> [$name] $*" | cut -c1-160
  t0=$(date +%s)
  "$@" || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" \
    "$([ $rc = 0 ] && echo ok || echo "failed (rc $rc)")" "$t0" >> "$NR_STAGES"
  return $rc
}

stages_table() {
  [ -s "${NR_STAGES:-}" ] || return 0
  awk -F'\t' -v now="$(date +%s)" \
      'BEGIN { printf "\n%-44s %9s  %s\n", "stage", "seconds", "result" }
       { printf "%-44s %9d  %s\n", $1, $2, $3; if (first == "" || $4 < first) first = $4 }
       END { wall = now - first
             printf "%-44s %9d  (%d min %d s)\n", "wall time", wall, wall / 60, wall % 60 }' \
      "$NR_STAGES"
}
