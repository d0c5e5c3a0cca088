"""benchmarks.bench_targets without a switch: the replay loop's counting and its window, against
an in-process stand-in that forwards every frame back after a delay (socket pairs)."""
from __future__ import annotations

import socket
import threading

from switch.dataplane.ports import Port
from benchmarks.bench_pipeline import frames, lab_ring
from benchmarks.bench_targets import Result, replay


def test_replay_counts_what_comes_back_and_keeps_the_window() -> None:
    """The stand-in takes everything the driver sends until it goes quiet, then sends it
    all back: the driver never has more than `window` slots (x ranks frames) out."""
    ranks, packets, window = 3, 40, 4
    todo = frames(lab_ring(ranks, 256), packets)
    pairs = {n: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for n in range(1, ranks + 1)}
    ports = {n: Port(n, f"drv{n}", a) for n, (a, _) in pairs.items()}
    for a, b in pairs.values():
        a.setblocking(False)
        b.settimeout(0.05)
    batches: list[int] = []

    def switch() -> None:
        while sum(batches) < len(todo):
            held = []
            for n, (_, b) in pairs.items():
                try:
                    while True:
                        held.append((n, b.recv(65536)))
                except TimeoutError:
                    pass
            if held:
                batches.append(len(held))
            for n, frame in held:                  # to the next rank's port, like a result
                pairs[n % ranks + 1][1].send(frame)

    t = threading.Thread(target=switch, daemon=True)
    t.start()
    back, seconds = replay(todo, ports, ranks, window)
    t.join(5)
    assert back == len(todo) == ranks * packets and seconds > 0
    assert sum(batches) == len(todo) and max(batches) == window * ranks, batches


def test_result_line_names_the_rates_and_the_ring_counters() -> None:
    r = Result("bmv2", "aggregate", 400, 400, 2.0, {"aggregated": 400, "completed": 100,
                                                     "results_sent": 400, "drop_overrun": 0})
    assert (r.in_per_s, r.out_per_s) == (200.0, 200.0)
    assert r.line() == ("bmv2  aggregate 400 frames in, 400 out in 2.00 s:    0.20 kframes/s "
                        "in,    0.20 kframes/s out; ring: aggregated 400 (0.20 k/s), "
                        "completed 100, results_sent 400, drops 0")


def test_replay_answers_a_tors_partials_with_their_totals() -> None:
    """bench_bmv2's ToR mode against the software ToR 0 as stand-in (socket pairs): the
    driver sends a slot's two contributions, answers the partial that comes up with the
    spine's total, and counts the two results; the window holds."""
    from switch.control.fabric import TorTarget
    from switch.dataplane.tor import TorPipeline
    from benchmarks.bench_bmv2 import SLOTS, UPLINK, placement, role_traffic, tor_config
    traffic = role_traffic(300)
    tor = TorPipeline(tor_config(0))
    TorTarget(tor, lambda mac: None).register_ring(traffic.spec, SLOTS,
                                                   placement(traffic.spec))
    pairs = {n: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for n in (1, 2, UPLINK)}
    ports = {n: Port(n, f"drv{n}", a) for n, (a, _) in pairs.items()}
    for a, b in pairs.values():
        a.setblocking(False)
        b.settimeout(0.05)
    done = threading.Event()

    def switch() -> None:
        while not done.is_set():
            for n, (_, b) in pairs.items():
                try:
                    frame = b.recv(65536)
                except TimeoutError:
                    continue
                tor.process(memoryview(bytearray(frame)), n,
                            lambda p, parts: pairs[p][1].send(b"".join(parts)))

    t = threading.Thread(target=switch, daemon=True)
    t.start()
    totals = iter(traffic.totals)
    back, _ = replay(traffic.contributions, ports, 2, 8, 2,
                     lambda port, frame: [(UPLINK, next(totals))] if port == UPLINK else None)
    done.set()
    t.join(5)
    ring = tor.counters()[traffic.spec.ring_id]
    assert back == 600 and ring["counters"]["results_sent"] == 600, ring
    assert ring["tor"]["partials_sent"] == ring["tor"]["totals"] == 300, ring
