"""What the tests that run p4c or BMv2 need, and how they say it is missing.

Outside CI a missing tool skips such a test with the reason; under CI=true it fails with
the reason (CI installs the toolchain, so a missing tool there is a broken CI).
"""
from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

P4_TOOLS = ("p4c", "simple_switch_grpc")
UNDER_CI = os.environ.get("CI") == "true"


def unavailable(why: str) -> NoReturn:
    """Skip the test saying why, or fail it saying why under CI=true."""
    if UNDER_CI:
        pytest.fail(f"{why} (CI=true: tests needing p4c/BMv2 never skip)")
    pytest.skip(why)


def require_tools(*tools: str) -> None:
    """unavailable() naming the tools of `tools` that are not on PATH, if any."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not on PATH (switch/p4/README.md: Build and run)")
