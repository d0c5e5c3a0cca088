#!/usr/bin/env bash
# test.sh — every test: unit tests on this machine, then all lab tests inside ONE lab boot
# (scripts/lab.sh: 4 Soft-RoCE hosts behind the software switch). Extra arguments go to both
# pytest runs (e.g. -k name, -x). Exit code: non-zero when any test failed or none ran.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || { echo "test.sh: no venv: run scripts/install.sh first" >&2; exit 1; }
cd "$ROOT"
echo "==> [test] unit tests (this machine)"
"$PY" -m pytest -q -m "not lab" tests "$@"
echo "==> [test] lab tests (inside the lab, one boot)"
"$ROOT/scripts/lab.sh" --hosts 4 -- python -m pytest -q -rs -m lab tests/lab "$@"
