#!/usr/bin/env bash
# test.sh — every test: unit tests on this machine; with p4c and BMv2 (always under CI=true):
# switch/p4 compiled by p4c (the switch, the spine and the ToR program) and the conformance
# vectors (the switch's, the spine's and the ToR's) run on BMv2, none skipped; every lab test,
# in three lab boots (scripts/lab_suites.sh: lab A, 4 hosts, beside p4c and the unit tests
# from the start; lab C, 6 hosts in 2 racks, and lab D, 4 hosts on a bridge with a one-armed
# aggregator, alone once they are done). Extra arguments go to the
# unit and lab pytest runs (e.g. -x; a -k that selects nothing in a lab fails it). Prints a
# table of its stages and their seconds at the end (scripts/stages.sh). Exit code: non-zero
# when any test failed or none ran.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "test.sh: no venv: run scripts/install.sh first" >&2; exit 1; }
cd "$ROOT"
. "$ROOT/scripts/stages.sh"
if [ -z "${NR_STAGES:-}" ]; then            # the caller (.ci/run) prints the table itself
  export NR_STAGES; NR_STAGES=$(mktemp)
  trap 'stages_table; rm -f "$NR_STAGES"' EXIT
fi
# Every pytest run's lines also go to TESTLOG, and the failures' short summaries (pytest -rfE,
# 300 columns wide) are printed again at the end, where the tail of a long run shows them
# (a lab prints its switch's log and counters after its tests).
TESTLOG=$(mktemp)
export COLUMNS=300
logged() { "$@" 2>&1 | tee -a "$TESTLOG"; }
failures() {
  local lines
  lines=$(grep -E '^(\[lab .\] )?(FAILED|ERROR) ' "$TESTLOG" | cut -c1-1000 || true)
  rm -f "$TESTLOG"
  [ -n "$lines" ] || return 0
  printf '\ntest.sh: what failed (each line is pytest'"'"'s summary; the tests'"'"' own lines are above):\n%s\n' \
    "$lines" >&2
}

with_p4=false p4c_pids=""
if [ "${CI:-}" = true ] || { command -v p4c && command -v simple_switch_grpc; } >/dev/null; then
  with_p4=true
  # Fresh, in the background: the unit tests overlap it, and those that need a build run
  # last and wait for it (switch/p4/program.py locks each build directory; tests/conftest.py
  # orders them by build: the switch's, the spine's, then the ToR's); the lab's BMv2 reuses
  # it. Two compiles at a time (two cores): the ToR's, the longest (~4 min of CPU), from the
  # start, beside the switch's then the spine's (~2 and ~1 min), so that the switch's
  # BMv2 vectors run while the ToR still compiles. At nice 10: p4c has no timer to miss, and
  # lab A, beside it from the start and the longest stage, takes the CPU first (its tests
  # leave idle time that p4c fills: docs/tests.md, "CI time").
  rm -rf "$ROOT/build/p4" "$ROOT/build/p4-spine" "$ROOT/build/p4-tor"
  stage "test: p4c, the ToR (beside the rest)" nice -n 10 "$PY" -m switch.p4.program --tor >/dev/null &
  p4c_pids=$!
  stage "test: p4c, the switch then the spine" nice -n 10 \
    bash -c '"$0" -m switch.p4.program && "$0" -m switch.p4.program --spine' "$PY" >/dev/null &
  p4c_pids+=" $!"
fi

# Lab A from the start, beside p4c and the unit tests (alone, its VM waits on timers, restarts
# and RC retries a third of its time: docs/tests.md, "CI time"); its lines come prefixed
# "[lab A] ". Its BMv2 switches wait for p4c's builds (compile_program's lock).
( set -o pipefail; "$ROOT/scripts/lab_suites.sh" a "$@" 2>&1 | sed -u 's/^/[lab A] /' \
  | tee -a "$TESTLOG" ) &
lab_a_pid=$!

# The unit run holds the conformance vectors of both targets (tests/test_conformance.py):
# software always, BMv2 when p4c and BMv2 are there (under CI=true they fail, never skip,
# without them: tests/p4tools.py). Failures, errors and skips are listed (-rfEs). Three pytest-xdist workers, a
# file each at a time (--dist loadfile keeps tests/conftest.py's order within a file): the
# unit tests mostly wait (sockets, timers, subprocesses), 528 s in one process against
# 207 s in three (docs/tests.md).
# (a unit failure does not stop the run: the labs still run, and the exit code says it)
unit_rc=0
stage "test: unit tests, conformance on both targets" logged "$PY" -m pytest -q -rfEs -n 3 --dist loadfile \
  -m "not lab" tests "$@" \
  || unit_rc=$?
p4c_rc=0
for pid in $p4c_pids; do
  wait "$pid" || p4c_rc=$?
done
if [ "$p4c_rc" != 0 ]; then
  echo "test.sh: p4c failed to compile switch/p4 (build/p4*/p4c.log): no lab C" >&2
  wait "$lab_a_pid" || true
  failures
  exit 1
fi
$with_p4 || echo "==> [test] p4c / BMv2 not installed: the switch/p4 compile and the BMv2 conformance vectors did not run (scripts/install.sh --p4 ...; CI never passes without them)"

# Lab C once p4c (its BMv2 ToRs need build/p4-tor), the unit tests and lab A are done: alone
# on the machine, because its BMv2 fabric of three switches stalled beside lab A (rxe's retry
# race, docs/roce.md, under the go-back-N storms that load brings: docs/tests.md, "CI time").
# Its lines come prefixed "[lab C] ".
[ "$unit_rc" = 0 ] || echo "test.sh: the unit tests failed (rc $unit_rc): see above" >&2
lab_a_rc=0 lab_c_rc=0 lab_d_rc=0
wait "$lab_a_pid" || lab_a_rc=$?
( set -o pipefail; "$ROOT/scripts/lab_suites.sh" c "$@" 2>&1 | sed -u 's/^/[lab C] /' \
  | tee -a "$TESTLOG" ) || lab_c_rc=$?
( set -o pipefail; "$ROOT/scripts/lab_suites.sh" d "$@" 2>&1 | sed -u 's/^/[lab D] /' \
  | tee -a "$TESTLOG" ) || lab_d_rc=$?
[ "$lab_a_rc" = 0 ] || echo "test.sh: lab A failed: see its lines ([lab A] ...) above" >&2
[ "$lab_c_rc" = 0 ] || echo "test.sh: lab C failed: see its lines ([lab C] ...) above" >&2
[ "$lab_d_rc" = 0 ] || echo "test.sh: lab D failed: see its lines ([lab D] ...) above" >&2
failures
[ "$unit_rc" = 0 ] && [ "$lab_a_rc" = 0 ] && [ "$lab_c_rc" = 0 ] && [ "$lab_d_rc" = 0 ]
