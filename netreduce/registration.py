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
- A registration is a lease (switch/api/control.proto): when the controller grants one
  (`lease_ms` in its reply), rank 0's `LeaseKeeper` renews it every third of the lease on a
  daemon thread while the communicator lives. A renewal the switch answers NOT_FOUND (it
  restarted, or the lease lapsed) or that fails for a whole lease means the switch no
  longer aggregates the ring: the keeper calls `on_lost` with a message naming the switch
  (the communicator aborts with it). A controller that grants no lease is never renewed.
- The address comes from rank 0's `switch` argument: None -> $NR_CONTROLLER (unset or
  empty: no switch), "" -> no switch. A single rank registers nothing (the switch needs 2+).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

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
    def renew_lease(self, ring_id: str) -> dict[str, Any]: ...
    def unregister_ring(self, ring_id: str) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class SwitchStatus:
    """Whether a communicator's "inc" ring is registered with a switch (alike on every rank)."""

    controller: str | None = None   # the controller's address; None: no switch asked for
    ring_id: str | None = None      # the registered ring; None: not registered
    slots: int = 0                  # the ring's aggregator slots N (when registered)
    lease_ms: int = 0               # the lease granted (0: none, nothing to renew)
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
    return {"controller": controller.addr, "ring_id": reply["ring_id"], "slots": reply["slots"],
            "lease_ms": int(reply.get("lease_ms") or 0)}


def unregister(controller: Controller | None, ring_id: str) -> None:
    """Best effort (runs on close and at exit): a failure is reported on stderr."""
    if controller is None:
        return
    try:
        controller.unregister_ring(ring_id)
    except Exception as exc:        # noqa: BLE001 - nothing to raise to at close
        print(f"netreduce: warning: could not unregister ring {ring_id} from the switch "
              f"controller at {controller.addr}: {exc}", file=sys.stderr, flush=True)


def _switch_lost_ring(exc: Exception) -> bool:
    """Whether a controller error says the ring is unknown (gRPC NOT_FOUND, whatever the
    client's exception type carries it as: a `code` attribute or its message)."""
    return "NOT_FOUND" in f"{getattr(exc, 'code', '')} {exc}"


class LeaseKeeper:
    """Renews ring `status.ring_id`'s lease every third of `status.lease_ms` (see the module
    doc) until `stop()`; reports the switch's loss of the ring once through `on_lost`."""

    def __init__(self, controller: Controller, status: SwitchStatus,
                 on_lost: Callable[[str], None]) -> None:
        assert status.ring_id is not None and status.lease_ms > 0
        self._controller, self._status, self._on_lost = controller, status, on_lost
        self._stop = threading.Event()
        self.renewals = 0
        self._thread = threading.Thread(target=self._run, name="nr-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ring, lease = self._status.ring_id, self._status.lease_ms / 1000
        assert ring is not None
        renewed = time.monotonic()
        while not self._stop.wait(lease / 3):
            try:
                granted = self._controller.renew_lease(ring).get("lease_ms") or 0
            except Exception as exc:        # noqa: BLE001 - every failure is judged below
                if _switch_lost_ring(exc) or time.monotonic() - renewed > lease:
                    self._on_lost(f"the switch at {self._status.controller} no longer "
                                  f"aggregates ring {ring} (restarted, or its lease lapsed): "
                                  f"RenewLease: {exc}")
                    return
                continue
            renewed = time.monotonic()
            self.renewals += 1
            lease = (granted or self._status.lease_ms) / 1000

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
