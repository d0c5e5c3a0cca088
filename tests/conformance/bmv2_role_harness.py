"""The Harness of the BMv2 spine (switch/p4/spine.p4) for the role vectors (conformance/roles.py).

Every `setup` of a spine vector starts a fresh simple_switch_grpc running the spine program
(tools.bmv2_lab.Bmv2Switch with a SpineConfig: a Bmv2SpineTarget), cabled and driven as
the single switch's BMv2 harness does (conformance/bmv2_harness.py: veths named by this
process's pid), and registers the setup's rings with exactly the arguments the software
spine gets (role_harness.spine_args). `counters()` has role_harness's spine shape, read
from BMv2's counters and, for next_total, its `ring_next` register over Thrift: everything
the software harness reports is compared. ToR vectors: the ToR role is not built in P4
(`roles` says which roles this harness runs).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.bmv2_harness import Bmv2Harness, create_harness
from conformance.format import ANY_PAYLOAD_LENGTH
from conformance.role_harness import spine_args, spine_counters
from switch.control.bmv2_spine import Bmv2SpineTarget
from switch.p4.program import DEFAULT_SPINE_BUILD

LOG = Path(DEFAULT_SPINE_BUILD) / "simple_switch_grpc.log"


class Bmv2SpineHarness(Bmv2Harness):
    """The spine role of the BMv2 target (payloads up to 256 B, one carried header)."""

    supports = frozenset({ANY_PAYLOAD_LENGTH})
    roles = frozenset({"spine"})

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        if vectors_setup["role"] != "spine":
            raise ValueError(f"role {vectors_setup['role']!r}: the BMv2 target has the spine only")
        config, rings = spine_args(vectors_setup)
        self.switch = self.start(vectors_setup, spine=config, log=LOG)
        target = self.switch.target
        assert isinstance(target, Bmv2SpineTarget)
        for args in rings:
            target.register_ring(*args)

    def counters(self) -> dict[str, Any]:
        assert self.switch is not None
        return spine_counters(self.switch.target)


def create_role_harness() -> Bmv2SpineHarness:
    """A harness, or unavailable() saying what is missing (p4tools: fails under CI)."""
    create_harness()        # checks root and p4runtime-shell
    return Bmv2SpineHarness()
