"""Micro-benchmark of AggregationPipeline.process: packets/s and cost per packet.

    python -m benchmarks.bench_pipeline [--ranks 4] [--packets 4096] [--mtu 4096] [--repeat 3]

Pushes every rank's packet k, k = 0..packets-1, through process() with an emit that
only counts, and compares with frames process() hands to L2 (the pass-through cost).
"""
from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np

from nr_contract.spec import Connection, RingSpec
from switch.dataplane.packets import Op, build_frame
from switch.dataplane.pipeline import AggregationPipeline


def lab_ring(ranks: int, mtu: int) -> RingSpec:
    """A ring on the lab's addresses: host I is 10.77.0.(I+1), sends on QPN 0x100+2I,
    receives on 0x101+2I, starts at PSN 1000*I."""
    ip = [f"10.77.0.{i + 1}" for i in range(ranks)]
    mac = [f"02:4e:52:00:00:{i + 1:02x}" for i in range(ranks)]
    conns = tuple(Connection(r, ip[r], ip[(r + 1) % ranks], mac[r], mac[(r + 1) % ranks],
                             0x100 + 2 * r, 0x101 + 2 * ((r + 1) % ranks), 1000 * r)
                  for r in range(ranks))
    return RingSpec("bench", ranks, mtu, 64 * mtu, 2, conns)


def frames(spec: RingSpec, packets: int, payload: int | None = None
           ) -> list[tuple[int, bytes]]:
    """(in_port, frame) for packet k of every rank, k-major: 64-packet WRITE messages of
    `payload` bytes per packet (default: the path MTU)."""
    rng = np.random.default_rng(7)
    out = []
    for k in range(packets):
        pos = k % 64
        op = Op.WRITE_FIRST if pos == 0 else Op.WRITE_LAST if pos == 63 else Op.WRITE_MIDDLE
        for c in spec.connections:
            words = rng.integers(-2**31, 2**31, (payload or spec.mtu) // 4, dtype=np.int32)
            out.append((c.rank + 1, build_frame(
                dst_mac=c.dst_mac, src_mac=c.src_mac, src_ip=c.src_ip, dst_ip=c.dst_ip,
                dest_qp=c.dst_qpn, psn=c.psn0 + k, opcode=op, ackreq=pos == 63,
                payload=words.astype("<i4").tobytes(),
                reth_fields=(0x7F0000000000, 0x1234, spec.msg_size) if pos == 0 else None)))
    return out


def run(ranks: int, packets: int, mtu: int, registered: bool) -> tuple[float, int]:
    """Seconds to process all frames once (fresh pipeline), and results emitted."""
    spec = lab_ring(ranks, mtu)
    pipe = AggregationPipeline()
    if registered:
        pipe.register_ring(spec, {c.src_ip: c.rank + 1 for c in spec.connections})
    todo = [(port, memoryview(f)) for port, f in frames(spec, packets)]
    sent = [0]

    def emit(port: int, parts: Sequence[bytes | memoryview]) -> None:
        sent[0] += 1

    process = pipe.process
    t0 = time.perf_counter()
    for port, frame in todo:
        process(frame, port, emit)
    return time.perf_counter() - t0, sent[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--packets", type=int, default=4096, help="packets per rank")
    ap.add_argument("--mtu", type=int, default=4096, help="payload bytes per packet")
    ap.add_argument("--repeat", type=int, default=5, help="best of")
    args = ap.parse_args()
    total = args.ranks * args.packets
    for registered, what in ((False, "pass-through (unregistered)"), (True, "aggregation")):
        best, sent = min(run(args.ranks, args.packets, args.mtu, registered)
                         for _ in range(args.repeat))
        print(f"{what:28s} {total} packets of {args.mtu} B in {best * 1e3:7.1f} ms: "
              f"{total / best / 1e3:7.1f} kpkt/s, {best / total * 1e6:5.2f} us/packet, "
              f"{total * args.mtu * 8 / best / 1e9:5.2f} Gbit/s in, {sent} frames out")


if __name__ == "__main__":
    main()
