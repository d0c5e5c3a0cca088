"""Registering a communicator's "inc" ring with the switch controller, so that all ranks
agree whether allreduce may aggregate in the network, and fitting that ring to the switch's
target first.

Invariants:
- Only rank 0 talks to the controller (`nr_contract.client.ControllerClient` or anything
  with the same `ping` / `register_ring` / `unregister_ring`). Before any QP exists it asks
  the controller what its target aggregates (`target_limits`) and fits the "inc" ring's
  flow-control knobs to it (`fit_config`): a knob the user did not set is lowered to what
  the target takes (path MTU, then message size and window so that the slots suffice); a
  knob the user set that the target cannot take is an error naming both. Every rank gets
  the same fitted config (or the same error) through the rendezvous (`fit_inc_ring`).
- After every rank's QPs are connected and before anything is posted on "inc", rank 0
  registers the ring and publishes the outcome through the rendezvous store. Every rank
  returns the same `SwitchStatus` or raises the same `SwitchRegistrationError`: a switch
  that was asked for and refused is an error naming the controller and its answer, never a
  silent fallback to the ring.
- A registered ring is unregistered by rank 0 once every rank has left (`unregister`), and
  also when the outcome could not be shared.
- A registration is a lease (nr_contract/control.proto): when the controller grants one
  (`lease_ms` in its reply), a `LeaseKeeper` on each of the ranks `LEASE_RANKS` (0 and 1:
  a rank whose Python thread cannot run for longer than the lease -- a GIL-holding
  import or checkpoint -- does not lose the ring while the other renews; rank 1 renews
  only when it can reach the controller with the job's token) renews it every third of
  the lease on a daemon thread while the ring is registered. A renewal the switch answers
  NOT_FOUND (it restarted, or the lease lapsed) or that fails for a whole lease means the
  switch no longer aggregates the ring; so does a probe (`LeaseKeeper.probe`: a renewal
  at once, asked while "inc" has stalled, and every PROBE_POLL s while the client's
  connection to the controller is down: its process stopped, or restarted) the controller
  answers NOT_FOUND, or that finds nothing listening at its address while "inc" stalls
  (connection refused: the switch's process is gone; a slow answer is not judged): the keeper
  calls `on_lost` with a message naming
  the switch (the communicator falls back to the host ring and registers the ring again
  later: netreduce/away.py). A controller that grants no lease is never renewed.
- The address comes from rank 0's `switch` argument: None -> $NR_CONTROLLER (ADDR_ENV; unset or
  empty: no switch), "" -> no switch. A single rank registers nothing (the switch needs 2+).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from flowctl.plan import FlowConfig, ack_timeout_seconds
from ring_setup.rendezvous import Rendezvous
from nr_contract.spec import RXE_MAX_INFLIGHT, RingSpec
from nr_contract.tokens import ADDR_ENV

logger = logging.getLogger(__name__)

LEASE_RANKS = (0, 1)      # the ranks that renew the lease (see the module doc)
PROBE_TIMEOUT = 2.0       # s a probe waits for the controller's answer (module doc)
PROBE_POLL = 0.1          # s between probes while the connection to the controller is down
# a probe's failure that says: no controller process there (not UNAVAILABLE alone: a slow
# controller's connect timeout is that too, and was once judged so under load)
UNREACHABLE = "connection refused"
FITTED_KNOBS = ("mtu", "msg_size", "window", "ack_timeout")


class SwitchRegistrationError(RuntimeError):
    """The switch asked for did not register the "inc" ring (same message on every rank)."""


class Controller(Protocol):
    """What rank 0 needs of the switch controller (nr_contract.client.ControllerClient, which
    sends the secret of the token file $NR_CONTROLLER_TOKEN names)."""

    addr: str

    def ping(self) -> dict[str, Any]: ...
    def register_ring(self, spec: RingSpec) -> dict[str, Any]: ...
    def renew_lease(self, ring_id: str, timeout: float | None = None) -> dict[str, Any]: ...
    def unregister_ring(self, ring_id: str) -> dict[str, Any]: ...
    def counters(self, ring_id: str | None = None) -> dict[str, Any]: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class SwitchStatus:
    """Whether a communicator's "inc" ring is registered with a switch (alike on every rank)."""

    controller: str | None = None   # the controller's address; None: no switch asked for
    ring_id: str | None = None      # the registered ring; None: not registered
    slots: int = 0                  # the ring's aggregator slots N (when registered)
    lease_ms: int = 0               # the lease granted (0: none, nothing to renew)
    note: str = "no address given (netreduce.init(switch=HOST:PORT) or $NR_CONTROLLER)"
    choice: str = ""                # what init chose for the "inc" ring, and why

    @property
    def registered(self) -> bool:
        return self.ring_id is not None

    def describe(self) -> str:
        if self.registered:
            return (f"'inc' ring {self.ring_id} registered with the switch at "
                    f"{self.controller} ({self.slots} slots{'; ' if self.choice else ''}"
                    f"{self.choice}): algo='auto' aggregates in the network")
        return f"no switch: {self.note}; algo='auto' runs the host ring"


def switch_address(switch: str | None) -> str | None:
    """The controller address `switch` names (see the module doc); None: no switch."""
    if switch is None:
        switch = os.environ.get(ADDR_ENV, "")
    return switch or None


def controller_client(addr: str, timeout: float, program_timeout: float,
                      rank: int) -> Controller | None:
    """The switch controller's client for rank 0 (fits, registers, renews) or another of
    `LEASE_RANKS` (renews only: None when it cannot make one, e.g. no token here)."""
    from nr_contract.client import ControllerClient  # grpc: only where it is used
    if rank == 0:
        return ControllerClient(addr, timeout=timeout, program_timeout=program_timeout)
    try:
        return ControllerClient(addr, timeout=timeout, program_timeout=program_timeout)
    except Exception as exc:        # noqa: BLE001 - rank 0 renews alone then
        logger.info("netreduce: rank %d does not renew the switch lease (rank 0 does): %s",
                    rank, exc)
        return None


@dataclass(frozen=True)
class RingFit:
    """The "inc" ring's flow-control knobs fitted to the switch (alike on every rank)."""

    config: FlowConfig
    choice: str = ""                # what was chosen and why ("" without a switch)


def target_limits(controller: Controller) -> tuple[str, dict[str, Any] | None]:
    """(target name, its limits as the fields of TargetLimits in nr_contract/control.proto,
    or None when the controller publishes none), from the controller's Ping."""
    reply = controller.ping()
    return reply["target"], reply.get("limits")


def fit_config(config: FlowConfig, pinned: frozenset[str], world_size: int, target: str,
               limits: dict[str, Any] | None) -> RingFit:
    """`config` fitted to `limits`: the largest path MTU the target takes that is not above
    `config.mtu`; then, if 2 x packets in flight (capped at rxe's 128) exceed the target's
    slots, a smaller message, then a smaller window. Knobs in `pinned` (set by the user)
    are never changed: one the target cannot take is a ValueError naming both."""
    if limits is None:
        return RingFit(config, f"{target} publishes no limits: path MTU {config.mtu} as asked")
    mtus = sorted(limits["path_mtus"])
    if world_size > limits["max_ranks"]:
        raise ValueError(f"{world_size} ranks; the {target} target aggregates at most "
                         f"{limits['max_ranks']}")
    why = []
    mtu = config.mtu
    if mtu not in mtus:
        lower = [m for m in mtus if m < mtu]
        if "mtu" in pinned or not lower:
            asked = f"netreduce.init(mtu={mtu})" if "mtu" in pinned else f"path MTU {mtu}"
            raise ValueError(f"{asked}: the {target} target aggregates path MTU "
                             f"{' or '.join(map(str, mtus))} only")
        mtu = lower[-1]
        why.append(f"path MTU {mtu} (the largest it aggregates; {config.mtu} by default)")
    else:
        why.append(f"path MTU {mtu}")
    msg_size, window = config.msg_size, config.window
    most = limits["max_slots"] // 2           # packets in flight per connection the slots hold
    holds = f"its slots hold {most} packets in flight"
    limit = f"'s {limits['max_slots']} slots hold {most}"
    pace = limits.get("max_in_flight", 0)
    if 0 < pace < most:
        most, holds = pace, f"it takes {pace} packets in flight per connection"
        limit = f" takes {pace} packets in flight per connection"

    def in_flight() -> int:
        return min(window * (msg_size // mtu), RXE_MAX_INFLIGHT)

    if in_flight() > most and "msg_size" not in pinned:
        msg_size = max(1, most // window) * mtu
        why.append(f"message {msg_size} B ({holds}; {config.msg_size} by default)")
    if in_flight() > most and "window" not in pinned:
        window = max(1, most // (msg_size // mtu))
        why.append(f"window {window} ({holds}; {config.window} by default)")
    if in_flight() > most:
        raise ValueError(f"{in_flight()} packets in flight per connection (window {window} x "
                         f"{msg_size // mtu} packets of {mtu} B); the {target} target{limit}")
    ack_timeout = config.ack_timeout
    slowest = limits.get("ack_timeout", 0)
    if slowest > ack_timeout:
        if "ack_timeout" in pinned:
            raise ValueError(f"netreduce.init(ack_timeout={ack_timeout}): the {target} target "
                             f"asks for at least {slowest} ({ack_time(slowest)})")
        ack_timeout = slowest
        why.append(f"ACK timeout {ack_time(slowest)} (its pace; {ack_time(config.ack_timeout)} "
                   f"by default)")
    return RingFit(replace(config, mtu=mtu, msg_size=msg_size, window=window,
                           ack_timeout=ack_timeout),
                   f"{target} target: " + ", ".join(why))


def ack_time(exponent: int) -> str:
    """A QP local ACK timeout exponent as the time it stands for."""
    seconds = ack_timeout_seconds(exponent)
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def published_capacity(controller: Controller) -> int:
    """The share of a sharded call the controller's aggregator publishes
    (TargetLimits.capacity, netreduce/shards.py); 0 when it publishes none or does not
    answer (the caller counts that as an equal share)."""
    try:
        _, limits = target_limits(controller)
    except Exception as exc:        # noqa: BLE001 - an equal share then
        logger.info("netreduce: the controller at %s did not say its capacity: %s",
                    controller.addr, exc)
        return 0
    return int((limits or {}).get("capacity", 0))


def fit_inc_ring(rendezvous: Rendezvous, config: FlowConfig, pinned: frozenset[str],
                 controller: Controller | None) -> RingFit:
    """Collective: rank 0 fits `config` to its controller's target (others pass anything,
    it is not used); every rank returns the same RingFit or raises the same
    SwitchRegistrationError. Without a controller or alone: `config` unchanged."""
    outcome: dict[str, Any] | None = None
    if rendezvous.rank == 0:
        outcome = _fit(config, pinned, rendezvous.world_size, controller)
    # the communicator's first collective: a rank missing from it never joined at all
    shared = rendezvous.all_gather("fit", outcome, waiting_for="joined")[0]
    if "error" in shared:
        raise SwitchRegistrationError(shared["error"])
    return RingFit(replace(config, **{k: shared[k] for k in FITTED_KNOBS}), shared["choice"])


def _fit(config: FlowConfig, pinned: frozenset[str], world_size: int,
         controller: Controller | None) -> dict[str, Any]:
    keep = {k: getattr(config, k) for k in FITTED_KNOBS}
    if controller is None or world_size < 2:
        return {**keep, "choice": ""}
    try:
        target, limits = target_limits(controller)
    except Exception as exc:        # noqa: BLE001 - every failure is reported to all ranks
        return {"error": f"netreduce: the switch controller at {controller.addr} did not say "
                         f"what it aggregates (Ping): {exc}"}
    try:
        fit = fit_config(config, pinned, world_size, target, limits)
    except ValueError as exc:
        return {"error": f"netreduce: the 'inc' ring cannot go through the switch at "
                         f"{controller.addr}: {exc}"}
    return {**{k: getattr(fit.config, k) for k in FITTED_KNOBS}, "choice": fit.choice}


def register_inc_ring(rendezvous: Rendezvous, spec: RingSpec,
                      controller: Controller | None, choice: str = "",
                      key: str = "switch") -> SwitchStatus:
    """Collective: rank 0 registers `spec` with `controller` (others pass anything, it is
    not used) and every rank learns the outcome through the store key `key` (see the
    module doc); `choice` (what fitting chose) goes into the status of a registered ring."""
    outcome: dict[str, Any] | None = None
    if rendezvous.rank == 0:
        outcome = _register(spec, controller)
        if "ring_id" in outcome:
            outcome["choice"] = choice
    try:
        shared = rendezvous.all_gather(key, outcome,
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


def switch_view(controller: Controller | None, ring_id: str | None) -> str:
    """What the switch counted for ring `ring_id`, for a stall on "inc": its next_emit and
    the nonzero counters of the ring and of each connection. A connection whose packets the
    switch keeps dropping names the stall's cause (a BMv2 ToR's drop_mismatch on one
    connection did, docs/reliability.md). Rank 0 holds the controller client and asks
    (`controller`: None elsewhere); the other ranks' errors point to its."""
    if controller is None or ring_id is None:
        return "what the switch counted: in rank 0's error"
    try:
        ring = controller.counters(ring_id)["rings"][ring_id]
    except Exception as e:  # noqa: BLE001 - a diagnostic of the stall, never its error
        return f"what the switch counted for ring {ring_id}: unavailable ({e})"

    def nonzero(counters: dict[str, int]) -> dict[str, int]:
        return {k: v for k, v in sorted(counters.items()) if v}
    conns = "; ".join(f"rank {c['rank']}'s connection {nonzero(c['counters'])}"
                      for c in ring.get("connections", []))
    return (f"what the switch counted for ring {ring_id}: next_emit {ring['next_emit']}, "
            f"{nonzero(ring['counters'])}; {conns}")


def unregister(controller: Controller | None, ring_id: str, quiet: bool = False) -> None:
    """Best effort (runs on close and at exit): a failure is logged as a warning (`quiet`:
    at debug level, for a ring the switch has most likely forgotten already)."""
    if controller is None:
        return
    try:
        controller.unregister_ring(ring_id)
    except Exception as exc:        # noqa: BLE001 - nothing to raise to at close
        (logger.debug if quiet else logger.warning)("netreduce: warning: could not unregister ring %s from the switch "
                       "controller at %s: %s", ring_id, controller.addr, exc)


def _switch_lost_ring(exc: Exception) -> bool:
    """Whether a controller error says the ring is unknown (gRPC NOT_FOUND, whatever the
    client's exception type carries it as: a `code` attribute or its message)."""
    return "NOT_FOUND" in f"{getattr(exc, 'code', '')} {exc}"


class LeaseKeeper:
    """Renews ring `status.ring_id`'s lease every third of `status.lease_ms` (see the module
    doc) until `stop()`; reports the switch's loss of the ring once through `on_lost`: a
    NOT_FOUND, or (`judge_silence`: the registering rank's keeper) no successful renewal
    for a whole lease; a renewal at once when "inc" stalls (`probe()`: one that finds no
    controller there, `UNREACHABLE`, is the loss too) and every PROBE_POLL s while the
    connection to the controller is down (`watch_connection`, if the client has it). A
    backup keeper (`judge_silence=False`) only renews: its own failures, e.g. a token the
    controller refuses, are not the ring's loss. It renews only
    while `job_alive()`: once a rank of the job is known dead the ring can never sum again,
    so the lease is left to lapse (the switch frees the ring) whichever rank keeps it."""

    def __init__(self, controller: Controller, status: SwitchStatus,
                 on_lost: Callable[[str], None], judge_silence: bool = True,
                 job_alive: Callable[[], bool] = lambda: True) -> None:
        assert status.ring_id is not None and status.lease_ms > 0
        self._controller, self._status, self._on_lost = controller, status, on_lost
        self._judge_silence, self._job_alive = judge_silence, job_alive
        self._stop = threading.Event()
        self._wake = threading.Event()      # stop(), probe() or the connection dropped
        self._probing = self._dropped = False
        self.renewals = 0
        watch = getattr(controller, "watch_connection", None)
        self._unwatch = watch(self._connection_dropped) if watch else None
        self._thread = threading.Thread(target=self._run, name="nr-lease", daemon=True)
        self._thread.start()

    def _connection_dropped(self) -> None:
        self._dropped = True
        self._wake.set()

    def _run(self) -> None:
        ring, lease = self._status.ring_id, self._status.lease_ms / 1000
        assert ring is not None
        renewed = time.monotonic()
        while True:
            self._wake.wait(PROBE_POLL if self._dropped else lease / 3)
            self._wake.clear()
            probing, self._probing = self._probing, False
            if self._stop.is_set():
                return
            if not self._job_alive():
                logger.info("netreduce: a rank of the job failed: ring %s's lease is left to "
                            "lapse", ring)
                return
            try:
                granted = self._controller.renew_lease(
                    ring, *((PROBE_TIMEOUT,) if probing or self._dropped else ())
                ).get("lease_ms") or 0
            except Exception as exc:        # noqa: BLE001 - every failure is judged below
                gone = probing and UNREACHABLE in str(exc).lower()
                if _switch_lost_ring(exc) or gone or (self._judge_silence
                                                      and time.monotonic() - renewed > lease):
                    why = "its controller is unreachable while the ring stalls" if gone \
                        else "restarted, or its lease lapsed"
                    self._on_lost(f"the switch at {self._status.controller} no longer "
                                  f"aggregates ring {ring} ({why}): RenewLease: {exc}")
                    return
                continue
            renewed, self._dropped = time.monotonic(), False
            self.renewals += 1
            lease = (granted or self._status.lease_ms) / 1000

    def probe(self) -> None:
        """Renew at once, judging the answer as a probe (class doc): "inc" has stalled."""
        self._probing = True
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
