"""Fixtures every hostile-input module shares; each module defines its own `rig`."""
from __future__ import annotations

from typing import Iterator

import pytest

from nr_contract.client import ControllerClient
from tests.hostile.netns import SwitchRig


@pytest.fixture(scope="module")
def alice(rig: SwitchRig) -> Iterator[ControllerClient]:
    """A client of the module's switch with principal alice's credentials."""
    with ControllerClient(rig.addr, timeout=10, token_file=rig.alice_tokens) as c:
        yield c
