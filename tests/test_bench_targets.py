"""tools.bench_targets without a switch: the replay loop's counting and its window, against
an in-process stand-in that forwards every frame back after a delay (socket pairs)."""
from __future__ import annotations

import socket
import threading

from switch.dataplane.ports import Port
from tools.bench_pipeline import frames, lab_ring
from tools.bench_targets import Result, replay


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
