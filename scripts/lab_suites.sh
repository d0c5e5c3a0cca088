#!/usr/bin/env bash
# lab_suites.sh [PYTEST ARGS...] — every lab test, as CI runs them (scripts/test.sh's last
# stage): three lab boots, two at a time, each recorded as a stage (scripts/stages.sh; the
# table is printed at the end when no caller prints it). Extra arguments go to each lab's
# pytest (e.g. -x; a -k that selects nothing in a lab fails it). Needs scripts/install.sh
# done, and build/p4* fresh for the BMv2 tests (test.sh compiles them first; else the tests
# compile them on demand, slowly). Exit code: non-zero when any lab failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. "$ROOT/scripts/stages.sh"
if [ -z "${NR_STAGES:-}" ]; then
  export NR_STAGES; NR_STAGES=$(mktemp)
  trap 'stages_table; rm -f "$NR_STAGES"' EXIT
fi

# The lab: three boots on the two cores, two at a time. Each VM runs on one host thread
# (lab.sh's default --tcg single: no boot can hit the int3 race of docs/lab.md, "Boot
# panics"), so two labs of different names (--name) side by side use both cores:
#  - lab A (nrlab, 4 hosts): the BMv2 switch, PyTorch and README modules (its fork servers
#    import torch once: its modules launch torch ranks four times), then
#  - lab C (nrlab6, 6 hosts in 2 racks): the fabric's shapes a 4-host boot cannot make
#    (2 x 3, the uneven 3 + 2) without loss: the loss runs and the BMv2 fabric runs of the
#    multirack module are lab B's (2 x 2); `scripts/lab.sh --racks 2 --hosts 6 -- python -m
#    pytest -m lab tests/lab/test_multirack_lab.py` runs them all at 6 hosts;
#  - beside them, lab B (nrlab2, 4 hosts): every other lab module (a new one lands there).
# Each lab's output goes to the log with its name in front of every line.
LAB_A="tests/lab/test_bmv2_allreduce.py tests/lab/test_torch.py tests/lab/test_readme.py"
LAB_B=$(ls tests/lab/test_*.py | grep -vxF -f <(tr ' ' '\n' <<< "$LAB_A"))
lab_a_then_c() {
  local rc=0
  # shellcheck disable=SC2086 # LAB_A: one path per word
  stage "test: lab A, 4 hosts (BMv2, torch, README)" "$ROOT/scripts/lab.sh" --name nrlab --hosts 4 \
    --preload torch,torch.distributed,netreduce.torch -- python -m pytest -q -rs --durations=10 -m lab $LAB_A "$@" || rc=1
  stage "test: lab C, 6 hosts in 2 racks" "$ROOT/scripts/lab.sh" --name nrlab6 --racks 2 --hosts 6 \
    -- python -m pytest -q -rs --durations=8 -m lab \
    -k "not one_percent_loss and not bmv2" tests/lab/test_multirack_lab.py "$@" || rc=1
  return $rc
}
lab_b() {
  # shellcheck disable=SC2086 # LAB_B: one path per word
  stage "test: lab B, 4 hosts (every other lab module)" "$ROOT/scripts/lab.sh" --name nrlab2 --hosts 4 \
    -- python -m pytest -q -rs --durations=15 -m lab $LAB_B "$@"
}
lab_a_then_c "$@" 2>&1 | sed -u 's/^/[lab A|C] /' &
lab_ac_pid=$!
lab_b "$@" 2>&1 | sed -u 's/^/[lab B] /' &
lab_b_pid=$!
lab_rc=0
wait "$lab_ac_pid" || lab_rc=1
wait "$lab_b_pid" || lab_rc=1

# What the lab's boots of this run said (oops/panic lines, kernel code patches during the
# command: docs/lab.md, "Boot panics"); a boot that died already failed its stage above.
scripts/lab_boots.sh .lab/boots .lab-nrlab2/boots .lab-nrlab6/boots || true
exit "$lab_rc"
