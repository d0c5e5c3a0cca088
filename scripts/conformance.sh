#!/usr/bin/env bash
# conformance.sh — run the conformance vectors (tests/conformance) against one switch target.
#
#   scripts/conformance.sh [--target software|bmv2] [PYTEST ARGS...]
#
# software (default): the Python pipeline, runs anywhere.
# bmv2: switch/p4 compiled by p4c, run by simple_switch_grpc on veth pairs, programmed over
#   P4Runtime (p4runtime-shell, the `bmv2` extra). Needs root, p4c and simple_switch_grpc on
#   PATH and p4runtime-shell in the venv; fails saying which is missing (it never skips).
#   About 2 min on a 2-core machine, plus about 2 min of p4c when build/p4 is stale.
# Exit code: pytest's, non-zero when a vector failed or none ran.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${NR_VENV:-$ROOT/.venv}/bin/python
target=software
die() { echo "conformance.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --target) target=${2:-}; shift 2 ;;
    --target=*) target=${1#*=}; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
[ -x "$PY" ] || die "no venv at $PY: run scripts/install.sh first"
case $target in
  software) ;;
  bmv2)
    missing=()
    for tool in p4c simple_switch_grpc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    [ ${#missing[@]} -eq 0 ] || die "--target bmv2: ${missing[*]} not on PATH (p4lang/p4c and \
p4lang/behavioral-model are packaged neither for Debian nor PyPI: see switch/p4/README.md)"
    "$PY" -c 'import p4runtime_sh' 2>/dev/null \
      || die "--target bmv2: p4runtime-shell missing: $PY -m pip install -e '$ROOT[bmv2]'"
    [ "$(id -u)" = 0 ] || die "--target bmv2: must run as root (veth pairs to simple_switch_grpc)" ;;
  *) die "--target must be software or bmv2, not '$target'" ;;
esac

cd "$ROOT"
# -k picks the target's parametrisation of test_vector and of the every-opcode-and-length
# burst test; skips are listed (-rs), and a run in which no vector passed for the target
# counts as a failure.
out=$(mktemp); trap 'rm -f "$out"' EXIT
set +e
"$PY" -m pytest -q -rs tests/test_conformance.py -k "(test_vector or test_every_opcode_and_length_in_bursts) and $target" "$@" | tee "$out"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || exit "$rc"
grep -Eq '[0-9]+ passed' "$out" || die "no vector passed against $target (all skipped?)"
