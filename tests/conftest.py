"""Test-wide rules: lab tests run only inside the lab, and never skip under CI=true."""
from __future__ import annotations

import os

import pytest

IN_LAB = os.environ.get("NR_LAB") == "1"
UNDER_CI = os.environ.get("CI") == "true"


@pytest.fixture(autouse=True)
def _lab_guard(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("lab") is None or IN_LAB:
        return
    why = ("needs the Soft-RoCE lab: scripts/lab.sh --hosts 4 -- python -m pytest -m lab tests/lab")
    if UNDER_CI:
        pytest.fail(f"lab test outside the lab under CI=true ({why})")
    pytest.skip(why)
