#!/usr/bin/env bash
# lab_suites.sh [a|c|d] [PYTEST ARGS...] — every lab test, as CI runs them (scripts/test.sh):
# three lab boots, each recorded as a stage (scripts/stages.sh; the table is printed at the
# end when no caller prints it): lab A, lab C, then lab D, or only the one named first. Extra arguments
# go to each lab's pytest (e.g. -x; a -k that selects nothing in a lab fails it). Needs
# scripts/install.sh done; the BMv2 tests need build/p4* (the switch's and the spine's in lab
# A, the ToR's in lab C): test.sh compiles them beside lab A, whose BMv2 switches wait for
# them (compile_program locks each build directory), else the tests compile them on demand,
# slowly. After each lab, what its boots said (scripts/lab_boots.sh). Exit code: non-zero
# when any lab failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. "$ROOT/scripts/stages.sh"
if [ -z "${NR_STAGES:-}" ]; then
  export NR_STAGES; NR_STAGES=$(mktemp)
  trap 'stages_table; rm -f "$NR_STAGES"' EXIT
fi
labs="a c d"
case ${1:-} in a|c|d) labs=$1; shift ;; esac

# Two lab boots, each running every module it can (the guide's "boot once"; docs/tests.md):
# lab A, 4 hosts behind the native switch (lab.sh's default), which the BMv2 and fabric tests restart as BMv2
# or as a two-tier fabric; lab C, 6 hosts in 2 racks, for the fabric's shapes a 4-host boot
# cannot make (2 x 3, the uneven 3 + 2) without loss, and the fabric of BMv2 ToRs and spine
# carrying two jobs at once, with and without loss (tests/lab/test_bmv2_fabric.py; the
# software fabric's loss runs and its BMv2 spine run are lab A's, at 2 x 2;
# `scripts/lab.sh --racks 2 --hosts 6 -- python -m pytest -m lab
# tests/lab/test_multirack_lab.py` runs them all at 6 hosts). Both under multi-threaded TCG
# (lab.sh's default): two single-threaded VMs side by side were measured slower, not faster
# (docs/lab.md, "Boot panics"). Lab D: 4 hosts on a plain bridge with two one-armed
# aggregators (--aggregators 2, tests/lab/test_aggregator_lab.py: its single-aggregator
# tests use the first, the others split every call over both).
lab_rc=0
for lab in $labs; do
  case $lab in
    a) stage "test: lab A, 4 hosts (one boot)" "$ROOT/scripts/lab.sh" --hosts 4 \
         -- env COLUMNS=300 python -m pytest -q -rfEs --durations=45 -m lab --ignore=tests/lab/test_bmv2_fabric.py \
         --ignore=tests/lab/test_aggregator_lab.py tests/lab "$@" || lab_rc=1
       boots=.lab/boots ;;
    c) stage "test: lab C, 6 hosts in 2 racks (one boot)" "$ROOT/scripts/lab.sh" --name nrlab6 \
         --racks 2 --hosts 6 -- env COLUMNS=300 python -m pytest -q -rfEs --durations=8 -m lab \
         -k "not one_percent_loss and not a_bmv2_spine" tests/lab/test_multirack_lab.py \
         tests/lab/test_bmv2_fabric.py "$@" || lab_rc=1
       boots=.lab-nrlab6/boots ;;
    d) stage "test: lab D, 4 hosts on a bridge, 2 one-armed aggregators (one boot)" \
         "$ROOT/scripts/lab.sh" --name nrlabagg --aggregators 2 --hosts 4 -- env COLUMNS=300 \
         python -m pytest -q -rfEs --durations=8 -m lab tests/lab/test_aggregator_lab.py "$@" \
         || lab_rc=1
       boots=.lab-nrlabagg/boots ;;
  esac
  # what this lab's boots said (oops/panic lines, kernel code patches during the command:
  # docs/lab.md, "Boot panics"); a boot that died already failed its stage above
  scripts/lab_boots.sh "$boots" || true
done
exit "$lab_rc"
