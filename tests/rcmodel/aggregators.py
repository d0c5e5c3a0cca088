"""k one-armed aggregators on a shared network in the RC model (docs/scale.md, "k
aggregators"): the hosts and the aggregators each have one link at LINK_BPS into one
non-blocking L2 network (the lab's bridge, docs/lab.md "Aggregators"); a host sends the
"inc" ring's frames (requests and ACKs, both ways) to an aggregator, everything else
straight to its destination host.

`rcmodel.fabric.OneArmedFabric` (World(aggregator_bps=)) is the model of it: a host-to-aggregator frame crosses the host's link and
the aggregator's (LATENCY_S each), the aggregator's pipeline (the real one) sends its
outputs back over its link and the destination host's. k aggregators that share a call's
bytes evenly (issue 42: shard j through aggregator j) are modelled as one aggregator whose
link runs at k x LINK_BPS: the bytes each link carries and the pace they set are the same,
what differs is each shard's last packet (n/k of them per aggregator instead of n through
one): a stated approximation, within a packet's time per transfer.

    python -m tests.rcmodel.aggregators          prints docs/scale.md's k-aggregator table

`formula_time_us` is the closed form the test (tests/test_rcmodel_aggregators.py) checks
the model against at 8 and 16 ranks; the table applies it at 8 to 1024 ranks.
"""
from __future__ import annotations

import sys

from tests.rcmodel.fabric import LATENCY_S
from tests.rcmodel.scale import (CONFIG, _stream, _us, formula_ring_time_us,
                                 formula_switch_time_us, switch_transfers)
RANKS = (8, 64, 256, 1024)
AGGREGATORS = (1, 2, 4, "n")
SIZE = 4 * 1024 * 1024                # per rank, int32: the lab's measured size (docs/hardware.md)


def formula_time_us(size: int, n: int, k: int) -> float:
    """A switch call through k one-armed aggregators, no loss: each transfer's stream sets
    the pace on the slower of the host's link (its own stream) and the aggregators' (n
    streams in, n out, over k links), then its tail: four links to an aggregator and back
    (LATENCY_S each), the last packet stored and forwarded at the network on the way in,
    the aggregator's n/k results of it, the network's store and forward on the way out;
    the last transfer then waits for its ACK, which takes the same four links."""
    lat, total = LATENCY_S * 1e6, 4 * LATENCY_S * 1e6
    for nbytes in switch_transfers(size, n):
        wire, last = _stream(nbytes, CONFIG)
        total += (max(_us(wire), n * _us(wire) / k) + 4 * lat + _us(last)
                  + n * _us(last) / k + _us(last))
    return total


def table(size: int = SIZE) -> list[str]:
    """docs/scale.md's k-aggregator table (markdown rows), from the closed forms."""
    head = ["ranks", "in-path switch", "host ring"] + [f"k = {k}" for k in AGGREGATORS]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in RANKS:
        cells = [formula_switch_time_us("1sw", size, n), formula_ring_time_us("1sw", size, n)]
        cells += [formula_time_us(size, n, n if k == "n" else int(k)) for k in AGGREGATORS]
        rows.append(f"| {n} | " + " | ".join(f"{c / 1000:,.1f} ms" for c in cells) + " |")
    return rows


if __name__ == "__main__":
    print("\n".join(table(int(sys.argv[1]) if len(sys.argv) > 1 else SIZE)))
