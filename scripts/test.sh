#!/usr/bin/env bash
# test.sh — every test: unit tests on this machine; with p4c and BMv2 (always under CI=true):
# switch/p4 compiled by p4c and the conformance vectors run on BMv2, none skipped; then all
# lab tests inside ONE lab boot (scripts/lab.sh: 4 Soft-RoCE hosts behind the software switch;
# tests/lab/test_bmv2_allreduce.py restarts it as BMv2 and back), and a second boot of 6
# hosts in 2 racks for the multi-rack tests that need more than 4 ranks (2 x 3, uneven
# 3 + 2). Extra arguments go to the
# unit and lab pytest runs (e.g. -k name, -x). Exit code: non-zero when any test failed or
# none ran.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "test.sh: no venv: run scripts/install.sh first" >&2; exit 1; }
cd "$ROOT"
with_p4=false
if [ "${CI:-}" = true ] || { command -v p4c && command -v simple_switch_grpc; } >/dev/null; then
  with_p4=true
  # Fresh, into build/p4: the unit tests, the conformance run and the lab's BMv2 then reuse
  # it (p4c takes 2-3 min here; a BMv2 start that had to compile would wait that long).
  echo "==> [test] p4c compiles switch/p4 (fresh build into build/p4)"
  rm -rf "$ROOT/build/p4"
  "$PY" -m switch.p4program >/dev/null
fi

echo "==> [test] unit tests (this machine)"
"$PY" -m pytest -q -m "not lab" tests "$@"

if $with_p4; then
  echo "==> [test] conformance vectors on BMv2 (scripts/conformance.sh --target bmv2; no skips)"
  out=$(mktemp); trap 'rm -f "$out"' EXIT
  "$ROOT/scripts/conformance.sh" --target bmv2 2>&1 | tee "$out"    # pipefail: its exit code
  if grep -Eq '[0-9]+ skipped' "$out"; then
    echo "test.sh: conformance vectors were skipped on BMv2 (see SKIPPED above): none may be" >&2
    exit 1
  fi
else
  echo "==> [test] p4c / BMv2 not installed: switch/p4 compile and BMv2 conformance not run (scripts/install.sh --p4 ...; CI never passes without them)"
fi

echo "==> [test] lab tests (inside the lab, one boot)"
"$ROOT/scripts/lab.sh" --hosts 4 -- python -m pytest -q -rs --durations=12 -m lab tests/lab "$@"

echo "==> [test] multi-rack lab tests with 6 hosts in 2 racks (a second boot: 2 x 3, uneven 3 + 2)"
"$ROOT/scripts/lab.sh" --racks 2 --hosts 6 -- python -m pytest -q -rs --durations=8 -m lab \
  tests/lab/test_multirack_lab.py "$@"
