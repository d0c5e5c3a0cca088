"""The cost curve at scale in the RC model (docs/scale.md): one allreduce call per
configuration -- one switch, two tiers, three tiers; 8 to 1024 ranks; 0 % and 0.1 % loss on
every link; the switch algorithm and the host ring -- with the real host code, the real
switch pipelines and model rxe on the simulated clock.

    PYTHONPATH=.:tests nice -n 10 python -m rcmodel.scale --json docs/figures/scale.json \
        --plot docs/figures/scale.png                                            (one line)

Each run checks the result on every rank against numpy (exact int32) and records: the
simulated time of the call (slowest rank; hosts compute in zero simulated time, links are
10 Gbit/s with 5 us each, switches forward in zero time: the network's share of a call),
the bytes per link between tiers and direction, the frames lost, and the real seconds the
model took. `--only` picks configurations by name (`1sw-64-0`, `3t-1024-0.001-ring-4`, or a
prefix); `--skip-ring-above N` leaves out ring runs of more than N ranks at large sizes,
whose cost in the model grows as n^2 (their time follows `formula_ring`, fitted below).
`python -m rcmodel.scale --table docs/figures/scale.json` prints the table again.

Topologies (rack size, then racks per pod): one switch of n ports (its per-ring bitmap
widened past switch.contract.MAX_RANKS = 32, a stated generalisation: `World(max_ranks=)`);
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
from netreduce.meta import RECORD_STRIDE
from rcmodel.fabric import LATENCY_S, LINK_BPS, FaultRates, Faults
from rcmodel.tiers import ThreeTierFabric, TwoTierFabric
from rcmodel.world import World
from switch.contract import DEFAULT_SLOTS

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
    RECORD_STRIDE bytes), then the data and the seal (n int32 words), each transfer cut
    into `msg_size` messages (flowctl.plan)."""
    return _cut(n * RECORD_STRIDE, config.msg_size) + _cut(size + 4 * n, config.msg_size)


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
    message of each such connection (the responder's ACK crosses back)."""
    msgs = message_sizes(size, n, config)
    payload, pkts = wire_bytes(size, n, config)
    head = HEADER + 4          # BTH-level header carried, + its (rank, hlen) entry
    return (payload + pkts * (INTERSWITCH + carried * head)
            + len(msgs) * carried * (RETH + IMMDT + ACK))


def formula_ring_spine_link(size: int, n: int) -> float:
    """Payload bytes per direction the host ring puts on the link out of a rack (the one
    connection that leaves it carries every step): 2(n-1)/n * M."""
    return 2 * (n - 1) / n * size


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


def formula_ring_time_us(size: int, n: int, per_hop_us: float,
                         config: FlowConfig = CONFIG) -> float:
    """The host ring's time: its metadata exchange through the switch (one round trip of a
    bank), then 2(n-1) steps, each a hop of one chunk (M/n) through the switch: per step
    `per_hop_us` (fitted) plus the chunk's serialisation at LINK_BPS."""
    chunk = -(-size // n)
    serial = (chunk + packets(chunk, config.mtu) * (HEADER + ICRC)) * 8 / LINK_BPS * 1e6
    return 2 * (n - 1) * (per_hop_us + serial)


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


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Per size, simulated time per call against ranks (switch and ring, each topology,
    0 % solid and 0.1 % dashed); then bytes per link between tiers per call and switch
    memory per ring against ranks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"1sw": "tab:blue", "2t": "tab:orange", "3t": "tab:green"}
    names = {"1sw": "one switch", "2t": "two tiers", "3t": "three tiers"}
    fig, axes = plt.subplots(1, len(SIZES) + 1, figsize=(6 * (len(SIZES) + 1), 5))
    by = {Case(**r["case"]): r for r in runs if r["exact"]}
    for ax, size in zip(axes, SIZES):
        for t in TOPOLOGIES:
            for algo, marker in (("switch", "o"), ("ring", "s")):
                for loss, style in ((0.0, "-"), (0.001, "--")):
                    pts = sorted((c.n, r["sim_us"]) for c, r in by.items()
                                 if (c.topology, c.algo, c.loss, c.size) == (t, algo, loss, size))
                    if pts:
                        ax.plot(*zip(*pts), style, marker=marker, color=colors[t],
                                label=f"{algo}, {names[t]}, {loss:.1%} loss")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(RANKS, [str(n) for n in RANKS])
        ax.set_xlabel("ranks")
        ax.set_ylabel("simulated time per call (us)")
        ax.set_title(f"allreduce of {size:,} B per rank (RC model)")
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize="x-small", ncol=2)
    ax = axes[-1]
    ns = list(RANKS)
    for size, style in zip(SIZES, ("-", "--")):
        ax.plot(ns, [formula_spine_link(size, n) for n in ns], style, color="tab:orange",
                label=f"switch: bytes per tier link and direction, M = {size:,} B")
        ax.plot(ns, [formula_ring_spine_link(size, n) for n in ns], style, color="tab:red",
                label=f"ring: 2(n-1)/n M per rack link and direction, M = {size:,} B")
        for t in ("2t", "3t"):
            pts = sorted((c.n, max(r["links"].values())) for c, r in by.items()
                         if (c.topology, c.algo, c.loss, c.size) == (t, "switch", 0.0, size))
            if pts:
                ax.plot(*zip(*pts), "x", color=colors[t], label=f"measured, {names[t]}")
    for role, color in (("switch", "tab:blue"), ("tor", "tab:purple")):
        ax.plot(ns, [switch_memory("1sw" if role == "switch" else "2t", n)[f"{role} layout"]
                     for n in ns], ":", color=color,
                label=f"memory per ring, {'one switch' if role == 'switch' else 'a ToR'} "
                      f"(256 slots, software layout)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(RANKS, [str(n) for n in RANKS])
    ax.set_xlabel("ranks")
    ax.set_ylabel("bytes")
    ax.set_title("traffic per link between tiers, and switch memory")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write (and extend: runs already there are kept)")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--only", default="", help="comma-separated case names or prefixes")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)))
    ap.add_argument("--skip-ring-above", type=int, default=256)
    ap.add_argument("--table", type=Path, help="print the table of a JSON file and exit")
    args = ap.parse_args(argv)
    if args.table:
        for line in table(json.loads(args.table.read_text())["runs"]):
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
