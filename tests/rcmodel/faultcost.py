"""Time lost per recovered transport fault in the RC model (issue 40, docs/reliability.md):
one clean call, then the same call with a fault, on the simulated clock (the real host code:
detection, the settle protocol of netreduce/away.py and netreduce/transport_fault.py, the
rebuild, the redo). Three kinds, injected into rank 1 at `FRACTION` of the clean call:

- "inc": its "inc" QPs moved to ERROR during a switch call (algo auto): rank 0's controller
  (`World(controller=True)`) registers the "inc" ring built again at once, the call is
  redone through the switch (or, when some rank had its sum, handed over the host ring);
- "ring": its host-ring QPs moved to ERROR during a ring call (no switch);
- "dark": its link drops every frame (both ways) for 1.5 retry budgets during a ring call
  (no switch): its QP fails RETRY_EXC_ERR, the ring is rebuilt and the call redone once
  the link is back (the back-off takes simulated time only when asked: `World.run`).

The closed forms (`bounds`) the model's figures are checked against (tests/test_rc_fault_cost.py):
- detection: the failed completion at once for a QP moved to ERROR, on "inc" after
  NOTICE_GRACE (0.5 s: whether another rank's switch-away notice explains it,
  netreduce/away.py; on the simulated clock here); a link dark for D:
  the QP fails after its retry budget, (retry_cnt + 1) x 4.096 us x 2^ack_timeout
  (`FlowConfig.dark_budget`); the other ranks, waiting on the host ring, see the notice at
  their next liveness check (flowctl.stream.LIVENESS_POLL, 0.25 s: at most two polls, the
  faulted rank's own wait and theirs), ranks waiting on "inc" at once;
- rebuild and re-register: the store's gathers and QP creation take no simulated time here
  (the lab's figures: docs/transport-faults.md); the switch's return after its back-off
  is not on the faulted call's path;
- redo: "inc" the clean switch call; else one host-ring call without the switch
  (`ring_alone_s`: `formula_ring_time_us` of tests/rcmodel/scale.py, checked against the
  model in tests/test_rc_scale.py, with its metadata exchanged around the host ring
  instead of through the switch).

    python -m tests.rcmodel.faultcost       # the table of docs/reliability.md
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np

import netreduce.away as away_module
from flowctl import FlowConfig
from flowctl.stream import LIVENESS_POLL
from tests.rcmodel.fabric import Faults
from tests.rcmodel.rxe import QPAttr
from netreduce.away import INC_POLL, NOTICE_GRACE
from netreduce.errors import CommunicatorError
from netreduce.meta import RECORD_STRIDE
from tests.rcmodel.fabric import LATENCY_S
from tests.rcmodel.scale import (CONFIG, _stream, _us, formula_ring_time_us,
                                 formula_switch_time_us, inputs)
from tests.rcmodel.world import World, host_ip

KINDS = ("inc", "ring", "dark")
#: also measurable, not in the table: "dark" during a switch call (algo auto): the settle's
#: host-ring sum is redone until the link is back (tests/test_rc_fault_cost.py)
DARK_SWITCH = "dark-switch"
FRACTION = 0.3          # the fault comes this far into the clean call's time
DARK = 1.5              # "dark": the link is dark for this many retry budgets
VICTIM = 1
GRACE_POLL = 0.05       # s: the step of AwayProtocol._notice_within's wait (netreduce/away.py)


@dataclass(frozen=True)
class FaultCost:
    """One measurement: the clean and the faulted call's simulated seconds (slowest rank),
    and every rank's `comm.stats()["transport"]` after them (`transport`: rank 0's)."""
    kind: str
    n: int
    size: int
    clean_s: float
    faulted_s: float
    ranks: tuple[dict[str, int], ...]

    @property
    def transport(self) -> dict[str, int]:
        return self.ranks[0]

    @property
    def lost_s(self) -> float:
        return self.faulted_s - self.clean_s


@dataclass(frozen=True)
class Failed:
    """A rank's faulted call failed: its error, `after` s from the link going dark."""
    error: BaseException
    after: float


def measure(kind: str, n: int, size: int, config: FlowConfig = CONFIG,
            budgets: float = DARK, backoff: bool = False) -> FaultCost:
    """Run the clean and the faulted call of int32[size / 4] on n ranks (a dark link: for
    `budgets` retry budgets; `backoff`: the back-offs take simulated time); every result
    is checked exactly against numpy (AssertionError otherwise)."""
    results, starts = _run(kind, n, size, config, budgets, backoff)
    for r, got in enumerate(results):
        if isinstance(got, (BaseException, Failed)):
            err = got.error if isinstance(got, Failed) else got
            raise AssertionError(f"{kind}, {n} ranks, {size} B: rank {r}: {err!r}") from err
    clean = max(ends[0] for ends, _ in results) - starts[0]
    faulted = max(ends[1] for ends, _ in results) - starts[1]
    return FaultCost(kind, n, size, clean, faulted, tuple(t for _, t in results))


def unhealed(n: int, size: int, config: FlowConfig = CONFIG) -> list[Any]:
    """Every rank's outcome of a switch call (algo auto) during which rank VICTIM's link
    goes dark for good, the back-offs on the simulated clock: `Failed`, or what else it
    returned or raised."""
    return _run(DARK_SWITCH, n, size, config, float("inf"), True)[0]


def _run(kind: str, n: int, size: int, config: FlowConfig, budgets: float,
         backoff: bool) -> tuple[list[Any], list[float]]:
    """Every rank's (call ends, transport counts), `Failed` or exception; rank 0's call
    starts."""
    if kind not in (*KINDS, DARK_SWITCH):
        raise ValueError(f"fault kind {kind!r} is not one of {KINDS + (DARK_SWITCH,)}")
    dark: dict[str, float] = {}
    world = dark_world(n, dark, config, switch=kind in ("inc", DARK_SWITCH),
                       controller=kind == "inc")
    count = size // 4
    want = sum(inputs(r, count).astype(np.int64) for r in range(n)).astype(np.int32)
    algo = "auto" if kind in ("inc", DARK_SWITCH) else "ring"
    starts: list[float] = []

    def body(comm: Any) -> Any:
        ends = []
        for i in range(2):
            if comm.rank == 0:
                starts.append(world.sim.now)
            if i == 1 and comm.rank == VICTIM:
                at = FRACTION * (ends[0] - starts[0])
                if kind in ("dark", DARK_SWITCH):
                    t = world.sim.now + at
                    dark.update({"from": t, "to": t + budgets * config.dark_budget})
                else:
                    qps = comm._faults._qps if kind == "ring" else comm._away._inc
                    world.sim.at(at, qps.to_error)
            try:
                y = comm.allreduce(inputs(comm.rank, count), algo=algo)
            except CommunicatorError as exc:
                failed = Failed(exc, world.sim.now - dark.get("from", world.sim.now))
                comm.close()
                return failed
            assert np.array_equal(y, want), f"rank {comm.rank}, call {i}: not exact"
            ends.append(world.sim.now)
        comm.close()
        return ends, comm.stats()["transport"]
    return run_dark(world, body, backoff), starts


def dark_world(n: int, dark: dict[str, float], config: FlowConfig = CONFIG,
               switch: bool = True, in_flight: int = 1, controller: bool = False) -> World:
    """A model world whose rank VICTIM's link drops every frame (both ways) from
    dark["from"] to dark["to"] (simulated s; set them when the outage begins), its QPs on
    `config`'s finite retry budget; `controller`: rank 0 registers an "inc" ring built
    again (`World`)."""
    victim = bytes(map(int, host_ip(VICTIM).split(".")))

    def drop(_kind: str, frame: bytes) -> bool:       # IPv4 source or destination
        return bool(dark) and dark["from"] <= world.sim.now < dark["to"] and \
            victim in (frame[26:30], frame[30:34])
    world = World(n, config, faults=Faults(drop=drop), switch=switch,
                  attr=QPAttr(mtu=config.mtu, timeout=config.ack_timeout,
                              retry_cnt=config.retry_cnt),
                  max_time=3600.0, max_events=200_000_000, in_flight=in_flight,
                  controller=controller)
    return world


def run_dark(world: World, body: Any, backoff: bool = True) -> list[Any]:
    """world.run(body), the switch-away protocol's waits (NOTICE_GRACE) on the simulated
    clock too."""
    clock = SimpleNamespace(monotonic=world.sim.monotonic, sleep=world.turns.sleep)
    with mock.patch.object(away_module, "time", clock):
        return world.run(body, backoff)


def ring_alone_s(n: int, size: int, config: FlowConfig = CONFIG) -> float:
    """A host-ring call without a switch: `formula_ring_time_us` on one switch's ports, its
    metadata exchange through the switch replaced by the host ring's: n - 1 hops, each one
    record's message and its ACK (4 links)."""
    wire, last = _stream(n * RECORD_STRIDE, config)
    via_switch = _us(wire) + 4 * LATENCY_S * 1e6 + _us(last)
    around = (n - 1) * (4 * LATENCY_S * 1e6 + _us(_stream(RECORD_STRIDE, config)[0]))
    return (formula_ring_time_us("1sw", size, n, config) - via_switch + around) * 1e-6


def clean_s(kind: str, n: int, size: int, config: FlowConfig = CONFIG) -> float:
    """The clean call: a switch call ("inc"), else a host-ring call without a switch."""
    if kind == "inc":
        return formula_switch_time_us("1sw", size, n, config) * 1e-6
    return ring_alone_s(n, size, config)


def bounds(kind: str, n: int, size: int, config: FlowConfig = CONFIG) -> tuple[float, float]:
    """(least, most) seconds a fault of `kind` costs by the closed form (module doc), the
    clean call subtracted. Least: the call's part before the fault (FRACTION of it), the
    outage ("dark": DARK retry budgets), the redo ("inc": through the switch). Most: "inc"
    a step of the grace's wait, an "inc" liveness poll (the other ranks see the notice)
    and a host-ring pass (some rank had the sum: it is handed over there instead);
    "ring" the clean call, two liveness polls (the waits began within it) and the redo;
    "dark" the least, two polls and one ACK timeout (the retransmit timer's phase)."""
    clean, redo = clean_s(kind, n, size, config), ring_alone_s(n, size, config)
    before, polls = FRACTION * clean, 2 * LIVENESS_POLL
    if kind == "inc":
        least = before + NOTICE_GRACE + clean
        most = least + GRACE_POLL + INC_POLL + redo
    elif kind == "ring":
        least, most = before + redo, clean + polls + redo
    else:
        least = before + DARK * config.dark_budget + redo
        most = least + polls + 4.096e-6 * 2 ** config.ack_timeout
    return least - clean, most - clean


def table(ranks: tuple[int, ...] = (8, 64, 256), sizes: tuple[int, ...] = (1 << 20, 1 << 24),
          config: FlowConfig = CONFIG) -> list[str]:
    """docs/reliability.md's table: per kind, its detection and the closed-form time lost
    (least-most, ms) at each size and number of ranks."""
    detect = {"inc": f"{NOTICE_GRACE:g} s notice grace; rebuild, switch redo (or hand-over)",
              "ring": f"≤ {2 * LIVENESS_POLL:g} s (polls); rebuild, redo",
              "dark": f"{DARK:g} budgets dark ({DARK * config.dark_budget:.2f} s); "
                      f"as ring"}
    head = " | ".join(f"{size >> 20} MiB, {'/'.join(map(str, ranks))} ranks" for size in sizes)
    rows = [f"| fault | detection, recovery | {head} |", "|---|---|" + "---|" * len(sizes)]
    for kind in KINDS:
        cells = [" / ".join("{:.0f}–{:.0f}".format(*(1e3 * b for b in bounds(kind, n, size,
                                                                             config)))
                            for n in ranks) for size in sizes]
        rows.append(f"| {kind} | {detect[kind]} | {' | '.join(cells)} |")
    return rows


if __name__ == "__main__":
    print("\n".join(table()))
