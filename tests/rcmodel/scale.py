"""The cost curve at scale in the RC model (docs/scale.md): one allreduce call per
configuration -- one switch, two tiers, three tiers; 8 to 1024 ranks; 0 % and 0.1 % loss on
every link; the switch algorithm and the host ring -- with the real host code, the real
switch pipelines and model rxe on the simulated clock.

    nice -n 10 python -m tests.rcmodel.scale --json docs/figures/scale.json \
        --plot docs/figures/scale.png                                            (one line)

Each run checks the result on every rank against numpy (exact int32) and records: the
simulated time of the call (slowest rank; hosts compute in zero simulated time, links are
10 Gbit/s with 5 us each, switches forward in zero time: the network's share of a call),
the bytes per link between tiers and direction, the frames lost, and the real seconds the
model took. `--only` picks configurations by name (`1sw-64-0`, `3t-1024-0.001-ring-4`, or a
prefix); `--skip-ring-above N` leaves out ring runs of more than N ranks at large sizes,
whose cost in the model grows as n^2 (their time follows `formula_ring`, fitted below).
`python -m tests.rcmodel.scale --table docs/figures/scale.json` prints the table again,
`--markdown docs/figures/scale.json` docs/scale.md's tables and the formulas' check.

Topologies (rack size, then racks per pod): one switch of n ports (its per-ring bitmap
widened past nr_contract.spec.MAX_RANKS = 32, a stated generalisation: `World(max_ranks=)`);
two tiers of racks of min(32, n/2) ranks (at 1024: 32 racks x 32, both contract limits);
three tiers of pods of racks (rcmodel.pod), 8 = 2x2x2, 64 = 2x2x16, 256 = 2x4x32,
1024 = 4x8x32.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from flowctl import FlowConfig
from netreduce.algorithms.switch import INLINE_BYTES
from netreduce.meta import RECORD_STRIDE
from nr_contract.spec import DEFAULT_SLOTS
from tests.rcmodel.fabric import LATENCY_S, LINK_BPS, FaultRates, Faults
from tests.rcmodel.tiers import ThreeTierFabric, TwoTierFabric
from tests.rcmodel.world import World

CONFIG = FlowConfig(collective_timeout=600.0)     # the library's defaults: MTU 4096,
SIZES = (4, 256 * 1024)                           # 256 KiB messages, window 2 (W = 128)
RANKS = (8, 64, 256, 1024)
LOSSES = (0.0, 0.001)
ALGOS = ("switch", "ring")
TOPOLOGIES = ("1sw", "2t", "3t")
THREE_TIERS = {8: (2, 2, 2), 64: (2, 2, 16), 256: (2, 4, 32), 1024: (4, 8, 32)}
HEADER = 14 + 20 + 8 + 12          # Ethernet, IPv4, UDP, BTH of every RoCE packet
ICRC = 4
RETH, IMMDT = 16, 4
ACK = HEADER + 4 + ICRC             # an ACK: BTH + AETH (one per message: AckReq on its last
                                    # packet, and messages of at most 65 packets here)
INTERSWITCH = 14 + 20 + 8 + 16 + 4  # a partial's or total's own framing (multirack.md)


@dataclass(frozen=True)
class Case:
    topology: str
    n: int
    loss: float
    algo: str
    size: int

    @property
    def name(self) -> str:
        return f"{self.topology}-{self.n}-{self.loss:g}-{self.algo}-{self.size}"

    def racks(self) -> tuple[Optional[list[int]], Optional[list[int]]]:
        """(rack sizes, racks per pod) of the topology."""
        if self.topology == "1sw":
            return None, None
        if self.topology == "2t":
            size = min(32, self.n // 2)
            return [size] * (self.n // size), None
        pods, racks, size = THREE_TIERS[self.n]
        return [size] * (pods * racks), [racks] * pods


@dataclass
class Run:
    case: Case
    exact: bool
    outcome: str
    sim_us: float
    lost: int
    model_s: float
    links: dict[str, float] = field(default_factory=dict)   # bytes per link per direction


def inputs(rank: int, count: int) -> np.ndarray:
    """Rank's int32 input: distinct per rank and element, small enough never to overflow."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 13) % 1000 - 500).astype(np.int32)


def run(case: Case) -> Run:
    racks, pods = case.racks()
    faults = Faults.everywhere(loss=case.loss, seed=case.n + 1)
    world = World(case.n, CONFIG, faults=faults, racks=racks, pods=pods,
                  uplink_faults=FaultRates(loss=case.loss), seed=case.n,
                  max_ranks=case.n if racks is None else None, max_time=3600.0,
                  max_events=200_000_000)
    count = case.size // 4
    want = sum(inputs(r, count).astype(np.int64) for r in range(case.n)).astype(np.int32)

    def body(comm: Any) -> Any:
        out = comm.allreduce(inputs(comm.rank, count), algo=case.algo)
        return out, world.sim.now

    t0 = time.monotonic()
    results = world.run(body)
    model_s = time.monotonic() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    exact = not errors and all(np.array_equal(out, want) for out, _ in results)
    outcome = "exact" if exact else (f"{type(errors[0]).__name__}: {errors[0]}"[:200]
                                     if errors else "WRONG SUM")
    sim_us = max((t for _, t in results), default=0.0) * 1e6 if not errors else 0.0
    fabric = world.fabric
    links: dict[str, float] = {}
    if isinstance(fabric, ThreeTierFabric):
        tors, pods_n = len(racks or ()), len(pods or ())
        for name, total in fabric.uplink_bytes().items():
            links[name] = total / (tors if name.startswith("tor") else pods_n)
    elif isinstance(fabric, TwoTierFabric):
        per = fabric.spine_link_bytes().values()
        links["tor-spine up"] = sum(u for u, _ in per) / len(per)
        links["tor-spine down"] = sum(d for _, d in per) / len(per)
    lost = sum(fabric.lost.values())
    return Run(case, exact, outcome, sim_us, lost, model_s, links)


# ---- the formulas ------------------------------------------------------------------------

def packets(nbytes: int, mtu: int) -> int:
    return max(1, -(-nbytes // mtu))


def _cut(nbytes: int, msg_size: int) -> list[int]:
    full, rest = divmod(nbytes, msg_size)
    return [msg_size] * full + ([rest] if rest else [])


def message_sizes(size: int, n: int, config: FlowConfig = CONFIG) -> list[int]:
    """The messages one rank sends per switch call: the metadata bank (n records of
    RECORD_STRIDE bytes), then the data and the seal (n int32 words) unless the call
    travels in its records (`switch_transfers`), each transfer cut into `msg_size`
    messages (flowctl.plan)."""
    return [m for nbytes in switch_transfers(size, n) for m in _cut(nbytes, config.msg_size)]


def wire_bytes(size: int, n: int, config: FlowConfig = CONFIG) -> tuple[int, int]:
    """(payload bytes, packets) one rank sends per switch call, every message counted."""
    msgs = message_sizes(size, n, config)
    return sum(msgs), sum(packets(m, config.mtu) for m in msgs)


def formula_host_link(size: int, n: int, config: FlowConfig = CONFIG) -> int:
    """Bytes one rank puts on its host link per switch call (and gets back): payload plus
    per packet Ethernet/IPv4/UDP/BTH/ICRC, a RETH per message start, an ImmDt per end."""
    msgs = message_sizes(size, n, config)
    payload, pkts = wire_bytes(size, n, config)
    return payload + pkts * (HEADER + ICRC) + len(msgs) * (RETH + IMMDT)


def formula_spine_link(size: int, n: int, carried: int = 1,
                       config: FlowConfig = CONFIG) -> int:
    """Bytes per direction on a link between tiers per switch call: one partial (up) or
    one total (down) per packet position, each its payload plus the inter-switch framing
    and `carried` RoCE headers (contiguous racks: one connection leaves each rack) of
    HEADER + RETH or ImmDt bytes with a 4-byte entry header each; and the ACK of every
    message of each such connection (the responder's ACK crosses back), for each of
    `switch_transfers`."""
    return sum(_link_bytes(nbytes, config, carried) for nbytes in switch_transfers(size, n))


def _link_bytes(nbytes: int, config: FlowConfig, carried: int = 1) -> int:
    """Bytes per direction one transfer of `nbytes` per rank puts on a link between tiers
    through the switch: its partials or totals (payload, framing, carried headers), per
    message a carried RETH and ImmDt and the ACK that crosses back."""
    msgs = _cut(nbytes, config.msg_size)
    pkts = sum(packets(m, config.mtu) for m in msgs)
    return (nbytes + pkts * (INTERSWITCH + carried * (HEADER + 4))
            + len(msgs) * carried * (RETH + IMMDT + ACK))


def formula_ring_spine_link(size: int, n: int, config: FlowConfig = CONFIG) -> float:
    """Bytes per direction on the link out of a rack per host-ring call: the metadata
    exchange through the switch (as a switch call's), then 2(n-1) chunk messages of M/n
    on the one connection that leaves the rack, each with its packets' headers, a RETH,
    an ImmDt and the ACK that crosses back (none when the chunk is empty: M < 4n)."""
    meta = _link_bytes(n * RECORD_STRIDE, config)
    chunk = -(-size // n) if size >= 4 * n else 0
    steps = 2 * (n - 1) if chunk else 2       # M < 4n: the one chunk crosses twice
    chunk = chunk or size
    return meta + steps * (chunk + packets(chunk, config.mtu) * (HEADER + ICRC)
                           + RETH + IMMDT + ACK)


def switch_memory(topology: str, n: int, slots: int = DEFAULT_SLOTS,
                  mtu: int = CONFIG.mtu) -> dict[str, int]:
    """Bytes a ring holds, per switch role, in the software target's layout (each rank's
    payload kept per slot, as AggregatorPool does: slots x lanes x MTU, plus the sum row) and
    at the least any design needs (a running sum and a bitmap per slot: slots x (MTU +
    lanes/8)). Lanes: the ranks of the rack (ToR), the ToRs (pod, spine), n (one switch)."""
    if topology == "1sw":
        lanes = {"switch": n}
    elif topology == "2t":
        size = min(32, n // 2)
        lanes = {"tor": size, "spine": n // size}
    else:
        pods, racks, size = THREE_TIERS[n]
        lanes = {"tor": size, "pod": racks, "spine": pods}
    out = {}
    for role, k in lanes.items():
        layout = slots * mtu * (k + 1) if role in ("switch", "tor") else slots * mtu
        out[f"{role} layout"] = layout
        out[f"{role} least"] = slots * (mtu + -(-k // 8))
    return out


def tiers(topology: str) -> int:
    return {"1sw": 1, "2t": 2, "3t": 3}[topology]


def _us(nbytes: float) -> float:
    """Serialisation of `nbytes` at LINK_BPS, in us."""
    return nbytes * 8 / LINK_BPS * 1e6


def _stream(nbytes: int, config: FlowConfig) -> tuple[int, int]:
    """(bytes on the host link, bytes of the largest packet) of one transfer of `nbytes`:
    the last packet leaves each switch behind the largest one before it, so that one's
    store-and-forward is what every hop adds to the transfer's tail."""
    msgs = _cut(nbytes, config.msg_size) or [0]
    wire = (sum(msgs) + sum(packets(m, config.mtu) for m in msgs) * (HEADER + ICRC)
            + len(msgs) * (RETH + IMMDT))
    return wire, min(nbytes, config.mtu) + HEADER + ICRC + IMMDT


def switch_transfers(size: int, n: int) -> tuple[int, ...]:
    """Bytes per rank of a switch call's transfers on "inc", one after the other: the
    metadata bank, then data and seal -- unless the call is small enough to travel in its
    records (netreduce/algorithms/switch.py: at most INLINE_BYTES)."""
    if size <= INLINE_BYTES:
        return (n * RECORD_STRIDE,)
    return (n * RECORD_STRIDE, size + 4 * n)


def formula_switch_time_us(topology: str, size: int, n: int,
                           config: FlowConfig = CONFIG) -> float:
    """A switch call without loss: its transfers one after the other (`switch_transfers`:
    the metadata bank, then data and seal; a small call only the bank); each is its stream
    serialised on the host link, then its tail's way through h tiers and back (2h links of
    LATENCY_S; at each of the 2h - 1 switches the largest packet is stored and forwarded,
    as an inter-switch partial/total between tiers); the last one then waits for the
    responder's ACK back (2h links): the data follow the bank as soon as it arrived, its
    ACK still on its way (netreduce/comm.py). Between tiers the stream is the partials' or
    totals' (each packet's payload with the inter-switch framing and one carried header):
    the slower link sets the pace. Hosts and switches compute in zero time."""
    h, lat = tiers(topology), LATENCY_S * 1e6
    total = 2 * h * lat                   # the last transfer's ACK
    for nbytes in switch_transfers(size, n):
        wire, last = _stream(nbytes, config)
        pkts = sum(packets(m, config.mtu) for m in _cut(nbytes, config.msg_size) or [0])
        tier_wire = wire + pkts * (INTERSWITCH + 4) if h > 1 else wire
        tier_pkt = last + INTERSWITCH + HEADER + 4
        total += (_us(tier_wire) + 2 * h * lat + _us(last) + (2 * h - 2) * _us(tier_pkt))
    return total


def formula_ring_time_us(topology: str, size: int, n: int,
                         config: FlowConfig = CONFIG) -> float:
    """The host ring without loss: its metadata exchange through the switch (as a switch
    call's first transfer), then 2(n-1) steps. With fewer elements than ranks (M < 4n) one
    chunk carries everything and the others are empty: the call is that chunk's 2(n-1)
    hops, each one way (2 links of a rack; `formula` counts the hops that cross racks and
    pods with their 2h links). Otherwise every step waits for the slowest rank's chunk to
    arrive and be acknowledged: a round trip over the longest hop of the ring (4h links)
    plus the chunk's serialisation, stored and forwarded at each switch."""
    h, lat = tiers(topology), LATENCY_S * 1e6
    wire, last = _stream(n * RECORD_STRIDE, config)
    meta = _us(wire) + 4 * h * lat + _us(last) + (2 * h - 2) * _us(last + INTERSWITCH)
    chunk = -(-size // n) * 4 // 4 if size >= 4 * n else size
    cwire, clast = _stream(chunk, config)
    if size < 4 * n:
        racks, pods = Case(topology, n, 0.0, "ring", size).racks()
        links = [2] * (2 * (n - 1))
        if racks:
            rack_of = [j for j, k in enumerate(racks) for _ in range(k)]
            pod_of_rack = ([p for p, k in enumerate(pods) for _ in range(k)] if pods
                           else [0] * len(racks))
            hops = [(s, s + 1) for s in range(n - 1)] + [((t - 1) % n, t) for t in range(n - 1)]
            links = [2 if rack_of[a] == rack_of[b] else
                     4 if pod_of_rack[rack_of[a]] == pod_of_rack[rack_of[b]] else 6
                     for a, b in hops]
        return meta + sum(k * lat + _us(cwire) + (k // 2 - 1) * 2 * _us(clast)
                          for k in links)
    return meta + 2 * (n - 1) * (4 * h * lat + _us(cwire) + (2 * h - 1) * _us(clast))


# ---- the study ---------------------------------------------------------------------------

def cases(ranks: tuple[int, ...], sizes: tuple[int, ...], losses: tuple[float, ...],
          skip_ring_above: int) -> list[Case]:
    return [Case(t, n, loss, algo, size) for size in sizes for n in ranks for t in TOPOLOGIES
            for loss in losses for algo in ALGOS
            if not (algo == "ring" and size > 4 and n > skip_ring_above)]


def table(runs: list[dict[str, Any]]) -> list[str]:
    """One line per run: the measured figures beside what the formulas say."""
    lines = [f"{'case':<30}{'outcome':>8}{'sim us':>11}{'lost':>6}{'model s':>9}"
             f"{'link bytes/dir (model)':>26}{'formula':>12}"]
    for r in runs:
        c = Case(**r["case"])
        link = next(iter(r["links"].values()), None) if r["links"] else None
        formula = (formula_spine_link(c.size, c.n) if c.algo == "switch" and link is not None
                   else None)
        lines.append(f"{c.name:<30}{'exact' if r['exact'] else 'FAIL':>8}"
                     f"{r['sim_us']:>11,.1f}{r['lost']:>6}{r['model_s']:>9.1f}"
                     f"{'-' if link is None else f'{link:,.0f}':>26}"
                     f"{'-' if formula is None else f'{formula:,}':>12}")
    return lines


def _fmt_us(us: Optional[float]) -> str:
    if us is None:
        return "–"
    return f"{us / 1e3:,.1f} ms" if us >= 10_000 else f"{us:,.0f} µs"


def _fmt_bytes(b: Optional[float]) -> str:
    if b is None:
        return "–"
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:,.1f} {unit}"
    return f"{b:,.0f} B"


def markdown(runs: list[dict[str, Any]]) -> list[str]:
    """docs/scale.md's tables: per size, one row per ranks and topology."""
    by = {Case(**r["case"]).name: r for r in runs}

    def get(t: str, n: int, loss: float, algo: str, size: int) -> Optional[dict[str, Any]]:
        return by.get(Case(t, n, loss, algo, size).name)

    names = {"1sw": "one switch", "2t": "two tiers", "3t": "three tiers"}
    out = []
    for size in SIZES:
        label = f"{size >> 10} KiB" if size >= 1024 else f"{size} B"
        out += [f"**{label} per rank** "
                f"(simulated time per call; a ring time in *italics* is the formula's, "
                f"not run):", "",
                "| ranks | fabric | switch, 0 % | ring, 0 % | ring / switch | "
                "switch, 0.1 % (frames lost) | ring, 0.1 % (frames lost) | "
                "bytes per tier link and direction, switch / ring (0 %) |",
                "|---|---|---|---|---|---|---|---|"]
        for n in RANKS:
            for t in TOPOLOGIES:
                sw0, ri0 = get(t, n, 0.0, "switch", size), get(t, n, 0.0, "ring", size)
                sw1, ri1 = get(t, n, 0.001, "switch", size), get(t, n, 0.001, "ring", size)
                if sw0 is None:
                    continue
                for r in (sw0, ri0, sw1, ri1):
                    if r is not None and not r["exact"]:
                        raise ValueError(f"{Case(**r['case']).name}: {r['outcome']}")
                ring_us = (ri0["sim_us"] if ri0 else formula_ring_time_us(t, size, n))
                ring_txt = _fmt_us(ring_us) if ri0 else f"*{_fmt_us(ring_us)}*"
                lossy = (lambda r: "not run" if r is None
                         else f"{_fmt_us(r['sim_us'])} ({r['lost']})")
                ring_link = (_fmt_bytes(max(ri0["links"].values())) if ri0 and ri0["links"]
                             else f"*{_fmt_bytes(formula_ring_spine_link(size, n))}*")
                links = ("–" if not sw0["links"] else
                         f"{_fmt_bytes(max(sw0['links'].values()))} / {ring_link}")
                out.append(f"| {n} | {names[t]} | {_fmt_us(sw0['sim_us'])} | {ring_txt} | "
                           f"{ring_us / sw0['sim_us']:.1f} | {lossy(sw1)} | {lossy(ri1)} | "
                           f"{links} |")
        out.append("")
    return out


def memory_rows() -> list[str]:
    """docs/scale.md's memory table: bytes per ring per switch role, 256 slots, MTU 4096."""
    mib = lambda b: f"{b / (1 << 20):,.1f} MiB"          # noqa: E731
    out = []
    for n in RANKS:
        one, tor = switch_memory("1sw", n), switch_memory("2t", n)
        headers = DEFAULT_SLOTS * n * 45
        out.append(f"| {n} | {mib(one['switch layout'])} | {mib(one['switch least'])} "
                   f"(+ {mib(headers)}) | {mib(tor['tor layout'])} | "
                   f"{mib(tor['spine layout'])} |")
    return out


def formula_check(runs: list[dict[str, Any]]) -> list[str]:
    """Every lossless run against its time formula, and the tier-link bytes against theirs."""
    out = ["| run | simulated | formula | formula / model |", "|---|---|---|---|"]
    worst = link_worst = 1.0
    for r in runs:
        c = Case(**r["case"])
        if c.loss:
            continue
        f = (formula_switch_time_us if c.algo == "switch" else formula_ring_time_us)(
            c.topology, c.size, c.n)
        worst = min(worst, f / r["sim_us"], r["sim_us"] / f)
        out.append(f"| {c.name} | {_fmt_us(r['sim_us'])} | {_fmt_us(f)} | "
                   f"{f / r['sim_us']:.3f} |")
        if c.algo == "switch" and r["links"]:
            want = formula_spine_link(c.size, c.n)
            if any(v != want for v in r["links"].values()):
                raise ValueError(f"{c.name}: links {r['links']} != formula {want}")
        elif r["links"]:
            got = max(r["links"].values()) / formula_ring_spine_link(c.size, c.n)
            link_worst = min(link_worst, got, 1 / got)
    return out + ["", f"(worst time ratio {worst:.3f}; every switch run's bytes per tier "
                      f"link equal `formula_spine_link` exactly; the ring's are within "
                      f"{1 - link_worst:.1%} of `formula_ring_spine_link`)"]


def _size_label(size: int) -> str:
    return f"{size >> 10} KiB" if size >= 1024 else f"{size} B"


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Per size, simulated time per call against ranks (switch and ring, each topology,
    0 % solid and 0.1 % dashed; the formula's time, hollow, where a ring was not run);
    then bytes per link between tiers per call (formulas as lines, runs as marks) and
    switch memory per ring against ranks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"1sw": "tab:blue", "2t": "tab:orange", "3t": "tab:green"}
    names = {"1sw": "one switch", "2t": "two tiers", "3t": "three tiers"}
    fig, axes = plt.subplots(1, len(SIZES) + 1, figsize=(6.5 * (len(SIZES) + 1), 5.5))
    by = {Case(**r["case"]): r for r in runs if r["exact"]}

    def log_axes(ax: Any, ylabel: str, title: str) -> None:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(RANKS, [str(n) for n in RANKS])
        ax.set_xlabel("ranks")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize="x-small", ncol=2)

    for ax, size in zip(axes, SIZES):
        for t in TOPOLOGIES:
            for algo, marker in (("switch", "o"), ("ring", "s")):
                for loss, style in ((0.0, "-"), (0.001, "--")):
                    pts = sorted((c.n, r["sim_us"]) for c, r in by.items()
                                 if (c.topology, c.algo, c.loss, c.size) == (t, algo, loss, size))
                    if pts:
                        ax.plot(*zip(*pts), style, marker=marker, color=colors[t],
                                label=f"{algo}, {names[t]}, {loss:.1%} loss")
                    missing = [n for n in RANKS if loss == 0.0 and n not in dict(pts)]
                    if missing and pts:
                        f = formula_switch_time_us if algo == "switch" else formula_ring_time_us
                        ax.plot([pts[-1][0], *missing],
                                [pts[-1][1], *(f(t, size, n) for n in missing)], ":",
                                marker=marker, mfc="none", color=colors[t])
        log_axes(ax, "simulated time per call (µs)",
                 f"allreduce of {_size_label(size)} per rank (RC model; hollow: formula)")
    ax = axes[-1]
    ns = list(RANKS)
    for size, style in zip(SIZES, ("-", "--")):
        ax.plot(ns, [formula_spine_link(size, n) for n in ns], style, color="tab:orange",
                label=f"switch, {_size_label(size)} (formula)")
        ax.plot(ns, [formula_ring_spine_link(size, n) for n in ns], style, color="tab:red",
                label=f"ring, {_size_label(size)} (formula)")
        for algo, color in (("switch", "tab:orange"), ("ring", "tab:red")):
            pts = sorted((c.n, max(r["links"].values())) for c, r in by.items()
                         if c.topology != "1sw" and c.loss == 0.0
                         and (c.algo, c.size) == (algo, size) and r["links"])
            if pts:
                ax.plot(*zip(*pts), "x", color=color, ms=9)
    for role, color in (("switch", "tab:blue"), ("tor", "tab:purple")):
        ax.plot(ns, [switch_memory("1sw" if role == "switch" else "2t", n)[f"{role} layout"]
                     for n in ns], ":", color=color,
                label=f"memory per ring, {'one switch' if role == 'switch' else 'a ToR'} "
                      f"(256 slots, software layout)")
    ax.plot(ns, [switch_memory("1sw", n)["switch least"] + DEFAULT_SLOTS * n * 45 for n in ns],
            "-.", color="tab:blue", label="memory per ring, one switch, least + 45 B headers")
    log_axes(ax, "bytes", "per link between tiers and direction (x: runs); switch memory")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write (and extend: runs already there are kept)")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--only", default="", help="comma-separated case names or prefixes")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)))
    ap.add_argument("--skip-ring-above", type=int, default=256)
    ap.add_argument("--table", type=Path, help="print the table of a JSON file and exit")
    ap.add_argument("--markdown", type=Path,
                    help="print docs/scale.md's tables (and the formula check) of a JSON "
                         "file and exit")
    args = ap.parse_args(argv)
    if args.table:
        for line in table(json.loads(args.table.read_text())["runs"]):
            print(line)
        return 0
    if args.markdown:
        runs = json.loads(args.markdown.read_text())["runs"]
        for line in markdown(runs) + memory_rows() + [""] + formula_check(runs):
            print(line)
        return 0
    done: dict[str, dict[str, Any]] = {}
    if args.json and args.json.exists():
        done = {Case(**r["case"]).name: r for r in json.loads(args.json.read_text())["runs"]}
    wanted = [p for p in args.only.split(",") if p]
    todo = [c for c in cases(tuple(int(x) for x in args.ranks.split(",")), SIZES, LOSSES,
                             args.skip_ring_above)
            if (not wanted or any(c.name.startswith(p) for p in wanted)) and c.name not in done]
    for c in todo:
        r = run(c)
        d = asdict(r)
        done[c.name] = d
        print(table([d])[1], flush=True)
        if args.json:
            args.json.write_text(json.dumps({"config": asdict(CONFIG), "link_bps": LINK_BPS,
                                             "latency_s": LATENCY_S,
                                             "runs": list(done.values())}, indent=1) + "\n")
    if args.plot and args.json:
        plot(json.loads(args.json.read_text())["runs"], args.plot)
    return 0 if all(r["exact"] for r in done.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
