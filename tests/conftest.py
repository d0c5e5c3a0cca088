"""Test-wide rules: lab tests run only inside the lab, and never skip under CI=true; tests
that need a program of switch/p4 compiled run last, by build (the switch's, the spine's,
the ToR's); every test has a job secret."""
from __future__ import annotations

import os
from typing import Optional

import pytest

IN_LAB = os.environ.get("NR_LAB") == "1"
UNDER_CI = os.environ.get("CI") == "true"


def require_lab() -> None:
    """Outside the lab: skip, or fail under CI=true."""
    if IN_LAB:
        return
    why = ("needs the Soft-RoCE lab: scripts/lab.sh --hosts 4 -- python -m pytest -m lab tests/lab")
    if UNDER_CI:
        pytest.fail(f"lab test outside the lab under CI=true ({why})")
    pytest.skip(why)


@pytest.fixture(autouse=True)
def _lab_guard(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("lab") is not None:
        require_lab()


@pytest.fixture(autouse=True)
def _job_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `netreduce launch` hands every rank: in-process ranks of a test share one."""
    if "NR_JOB_SECRET" not in os.environ:
        monkeypatch.setenv("NR_JOB_SECRET", "secret-of-the-test-job-0123")


#: tests of a build that have no bmv2 parameter: p4c's warnings checks
BUILD_TESTS = {"test_p4c_compiles_without_unreviewed_warnings": "switch",
               "test_p4c_compiles_the_spine_without_unreviewed_warnings": "spine",
               "test_p4c_compiles_the_tor_without_unreviewed_warnings": "tor"}
#: the builds in the order scripts/test.sh has them ready: the switch's, then the spine's
#: (compiled one after the other), the ToR's (the longest, compiled beside them) last
BUILDS = ("switch", "spine", "tor")


def p4_build(item: pytest.Item) -> Optional[str]:
    """Which compiled program the test uses (the BMv2 conformance vectors and BUILD_TESTS
    do): "switch" (build/p4), "spine" (build/p4-spine), "tor" (build/p4-tor); None for
    every other test."""
    if item.name in BUILD_TESTS:
        return BUILD_TESTS[item.name]
    if "[bmv2" not in item.nodeid:
        return None
    if item.path.name == "test_conformance.py":
        return "switch"
    if item.path.name == "test_role_conformance.py":
        vector = getattr(item, "callspec", None) and item.callspec.params.get("vector")
        if vector is not None:
            return str(vector.setup["role"])
        return "spine" if "spine" in item.name else "tor"
    return None


def _order(item: pytest.Item) -> tuple[int, str]:
    """Tests needing no build first; then by build (BUILDS), and within one build the
    vectors that run on the same simple_switch_grpc (conformance.bmv2_harness.switch_key)
    side by side, tests without a vector parameter first."""
    build = p4_build(item)
    if build is None:
        return 0, ""
    vector = getattr(item, "callspec", None) and item.callspec.params.get("vector")
    if vector is None:
        return 1 + BUILDS.index(build), ""
    from tests.conformance.bmv2_harness import switch_key
    return 1 + BUILDS.index(build), repr(switch_key(vector.setup))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need a p4c build go last, in the order scripts/test.sh has the builds
    ready (BUILDS; it starts p4c in the background, the other tests overlap it, and these
    wait for it: compile_program locks the build directory, a second caller waits, then
    finds the build fresh); a BMv2 switch then serves the vectors of one key in a row
    (stable: the order stays the files' otherwise). Under pytest-xdist scripts/test.sh runs
    `--dist loadfile`: each file on one worker, in this order."""
    items.sort(key=_order)
