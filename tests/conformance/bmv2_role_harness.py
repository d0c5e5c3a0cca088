"""The Harness of the BMv2 fabric roles (switch/p4/spine.p4, switch/p4/tor.p4) for the role
vectors (conformance/roles.py).

Every `setup` has a simple_switch_grpc running the vector's role's program
(labswitches.bmv2_lab.Bmv2Switch with a SpineConfig or a TorConfig: a Bmv2SpineTarget or a
Bmv2TorTarget) in the state of a fresh one, cabled, driven and reset between vectors of
the same program, ports, MACs and config as the single switch's BMv2 harness does
(conformance/bmv2_harness.py), and registers the setup's rings with exactly the arguments
the software role gets (role_harness.spine_args / tor_args). `counters()` has
role_harness's shape for the role, read from BMv2's counters and, for next_total /
next_emit and slots_skipped, its registers over Thrift: everything the software harness
reports is compared. Vectors tagged many_carried are beyond both programs
(one carried header per message): `supports` leaves them out.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from switch.control.bmv2_spine import Bmv2SpineTarget
from switch.control.bmv2_tor import Bmv2TorTarget
from switch.p4.program import DEFAULT_SPINE_BUILD, DEFAULT_TOR_BUILD
from tests.conformance.bmv2_harness import Bmv2Harness, create_harness
from tests.conformance.format import ANY_PAYLOAD_LENGTH
from tests.conformance.role_harness import spine_args, spine_counters, tor_args, tor_counters

LOGS = {"spine": Path(DEFAULT_SPINE_BUILD) / "simple_switch_grpc.log",
        "tor": Path(DEFAULT_TOR_BUILD) / "simple_switch_grpc.log"}


class Bmv2RoleHarness(Bmv2Harness):
    """Both roles of the BMv2 target (payloads up to 256 B, one carried header)."""

    supports = frozenset({ANY_PAYLOAD_LENGTH})
    roles = frozenset({"spine", "tor"})

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        role = vectors_setup["role"]
        if role == "spine":
            config, rings = spine_args(vectors_setup)
            self.switch = self.start(vectors_setup, spine=config, log=LOGS[role])
            spine = self.switch.target
            assert isinstance(spine, Bmv2SpineTarget)
            for args in rings:
                spine.register_ring(*args)
        elif role == "tor":
            tor_config, tor_rings = tor_args(vectors_setup)
            self.switch = self.start(vectors_setup, tor=tor_config, log=LOGS[role])
            tor = self.switch.target
            assert isinstance(tor, Bmv2TorTarget)
            for spec, local_ports, slots in tor_rings:
                tor.register_ring(spec, local_ports, slots)
        else:
            raise ValueError(f"role {role!r}: not 'tor' or 'spine'")

    def counters(self) -> dict[str, Any]:
        self.check_quiet()
        assert self.switch is not None
        if isinstance(self.switch.target, Bmv2TorTarget):
            return tor_counters(self.switch.target)
        return spine_counters(self.switch.target)


def create_role_harness() -> Bmv2RoleHarness:
    """A harness, or unavailable() saying what is missing (p4tools: fails under CI)."""
    create_harness()        # checks root and p4runtime-shell
    return Bmv2RoleHarness()
