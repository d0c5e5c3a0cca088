"""Test-wide rules: lab tests run only inside the lab, and never skip under CI=true; tests
that need switch/p4 compiled into build/p4 run last; every test has a job secret."""
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


@pytest.fixture(autouse=True)
def _job_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `netreduce launch` hands every rank: in-process ranks of a test share one."""
    if "NR_JOB_SECRET" not in os.environ:
        monkeypatch.setenv("NR_JOB_SECRET", "secret-of-the-test-job-0123")


def _needs_p4_build(item: pytest.Item) -> bool:
    """Whether the test uses a compiled program in build/p4, build/p4-spine or build/p4-tor
    (the BMv2 conformance vectors, p4c's own warnings checks)."""
    return (item.path.name in ("test_conformance.py", "test_role_conformance.py")
            and "[bmv2" in item.nodeid
            or item.name in ("test_p4c_compiles_without_unreviewed_warnings",
                             "test_p4c_compiles_the_spine_without_unreviewed_warnings",
                             "test_p4c_compiles_the_tor_without_unreviewed_warnings"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need build/p4 go last, in their order: scripts/test.sh starts p4c in the
    background, the other tests overlap it, and these wait for it (compile_program locks
    the build directory: a second caller waits, then finds the build fresh)."""
    items.sort(key=_needs_p4_build)
