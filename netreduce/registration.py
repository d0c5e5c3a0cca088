"""Registering a communicator's "inc" ring with the switch controller, so that all ranks
agree whether allreduce may aggregate in the network.

Invariants:
- Only rank 0 talks to the controller (`switch.api.client.ControllerClient` or anything
  with the same `register_ring` / `unregister_ring`); it registers after every rank's QPs
  are connected and before anything is posted on "inc", and publishes the outcome through
  the rendezvous store. Every rank returns the same `SwitchStatus` or raises the same
  `SwitchRegistrationError`: a switch that was asked for and refused is an error naming the
  controller and its answer, never a silent fallback to the ring.
- A registered ring is unregistered by rank 0 once every rank has left (`unregister`), and
  also when the outcome could not be shared.
- The address comes from rank 0's `switch` argument: None -> $NR_CONTROLLER (unset or
  empty: no switch), "" -> no switch. A single rank registers nothing (the switch needs 2+).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from ring_setup.rendezvous import Rendezvous
from ring_setup.spec import RingSpec

SWITCH_ENV = "NR_CONTROLLER"


class SwitchRegistrationError(RuntimeError):
    """The switch asked for did not register the "inc" ring (same message on every rank)."""


class Controller(Protocol):
    """What rank 0 needs of the switch controller (switch.api.client.ControllerClient, which
    sends the secret of the token file $NR_CONTROLLER_TOKEN names)."""

    addr: str

    def register_ring(self, spec: RingSpec) -> dict[str, Any]: ...
    def unregister_ring(self, ring_id: str) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class SwitchStatus:
    """Whether a communicator's "inc" ring is registered with a switch (alike on every rank)."""

    controller: str | None = None   # the controller's address; None: no switch asked for
    ring_id: str | None = None      # the registered ring; None: not registered
    slots: int = 0                  # the ring's aggregator slots N (when registered)
    note: str = "no address given (netreduce.init(switch=HOST:PORT) or $NR_CONTROLLER)"

    @property
    def registered(self) -> bool:
        return self.ring_id is not None

    def describe(self) -> str:
        if self.registered:
            return (f"'inc' ring {self.ring_id} registered with the switch at "
                    f"{self.controller} ({self.slots} slots): algo='auto' aggregates in the "
                    f"network")
        return f"no switch: {self.note}; algo='auto' runs the host ring"


def switch_address(switch: str | None) -> str | None:
    """The controller address `switch` names (see the module doc); None: no switch."""
    if switch is None:
        switch = os.environ.get(SWITCH_ENV, "")
    return switch or None


def register_inc_ring(rendezvous: Rendezvous, spec: RingSpec,
                      controller: Controller | None) -> SwitchStatus:
    """Collective: rank 0 registers `spec` with `controller` (others pass anything, it is
    not used) and every rank learns the outcome (see the module doc)."""
    outcome: dict[str, Any] | None = None
    if rendezvous.rank == 0:
        outcome = _register(spec, controller)
    try:
        shared = rendezvous.all_gather("switch", outcome,
                                       waiting_for="learned whether the switch is used")[0]
    except BaseException:
        if outcome is not None and "ring_id" in outcome:
            unregister(controller, outcome["ring_id"])
        raise
    if "error" in shared:
        raise SwitchRegistrationError(shared["error"])
    return SwitchStatus(**shared)


def _register(spec: RingSpec, controller: Controller | None) -> dict[str, Any]:
    if controller is None:
        return {}
    if spec.world_size < 2:
        return {"controller": controller.addr,
                "note": "a single rank has nothing to aggregate"}
    try:
        reply = controller.register_ring(spec)
    except Exception as exc:        # noqa: BLE001 - every failure is reported to all ranks
        return {"error": f"netreduce: the switch controller at {controller.addr} did not "
                         f"register the 'inc' ring {spec.ring_id} ({spec.world_size} ranks, "
                         f"{spec.window_packets} packets in flight per connection): {exc}"}
    return {"controller": controller.addr, "ring_id": reply["ring_id"], "slots": reply["slots"]}


def unregister(controller: Controller | None, ring_id: str) -> None:
    """Best effort (runs on close and at exit): a failure is reported on stderr."""
    if controller is None:
        return
    try:
        controller.unregister_ring(ring_id)
    except Exception as exc:        # noqa: BLE001 - nothing to raise to at close
        print(f"netreduce: warning: could not unregister ring {ring_id} from the switch "
              f"controller at {controller.addr}: {exc}", file=sys.stderr, flush=True)
