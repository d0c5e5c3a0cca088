"""NativeTarget (switch/control/native_target.py).

Rings registered through the target aggregate scapy-built WRITEs to numpy's wrapping sums
(with scapy's ICRC on every result); its counters are the software target's for the same
frames. Without root the frames go through the worker's NativePipeline directly behind a
fake I/O (tests named `fake_io`).

"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from switch.control.native_target import NativeTarget
from switch.control.target import SoftwareTarget
from switch.dataplane.pipeline import AggregationPipeline
from switch.native.binding import NativePipeline
from tests.roce_layers import (WRITE_FIRST, WRITE_MIDDLE, icrc_ok, ip_ports, lab_mac,
                               mac_ports, make_ring, wrapping_sum, write_frame)



class FakeIO:
    """A fake of NativeIO's control side: ports on given workers, fixed counters."""

    def __init__(self, worker_of: dict[int, int], workers: int = 1) -> None:
        self.worker_of = worker_of
        self.workers = workers

    def port_worker(self, number: int) -> int:
        return self.worker_of.get(number, -1)

    def port_counters(self) -> dict[int, dict[str, int | str]]:
        return {n: {"ifname": f"veth{n}", "rx_packets": 7, "fallback": int(n == 2),
                    "kind": "af_packet" if n == 2 else "af_xdp-generic"}
                for n in self.worker_of}

    def worker_stats(self) -> list[dict[str, int]]:
        return [{"frames": 10 + w, "outputs": 3, "ownership_errors": 0}
                for w in range(self.workers)]


def _writes(spec: Any, messages: int, seed: int) -> tuple[list[list[tuple[int, bytes]]],
                                                           list[np.ndarray]]:
    """Per packet index k: every rank's frame (its switch port, bytes), and numpy's sum."""
    rng = np.random.default_rng(seed)
    per_packet = spec.mtu // 4
    rounds, sums = [], []
    for k in range(messages * spec.msg_size // spec.mtu):
        data = [rng.integers(-2**31, 2**31, per_packet, dtype=np.int32)
                for _ in spec.connections]
        op = WRITE_FIRST if k % (spec.msg_size // spec.mtu) == 0 else WRITE_MIDDLE
        rounds.append([(c.rank + 1, write_frame(c, k, op, d))
                       for c, d in zip(spec.connections, data)])
        sums.append(wrapping_sum(data))
    return rounds, sums


def _payload(frame: bytes) -> np.ndarray:
    return np.frombuffer(Ether(frame)[Raw].load, dtype="<i4")


def test_native_target_aggregates_as_numpy_and_counts_as_software_fake_io() -> None:
    spec = make_ring(3, mtu=256)
    target = NativeTarget(FakeIO({1: 0, 2: 0, 3: 0, 4: 0}), [NativePipeline()],
                          mac_ports(4), max_rings=4)
    oracle = SoftwareTarget(AggregationPipeline(), mac_ports(4).get)
    assert target.register_ring(spec, 16) == {"ring_id": "ring", "slots": 16,
                                             "ports": ip_ports(spec)}
    oracle.register_ring(spec, 16)
    rounds, sums = _writes(spec, messages=2, seed=38)
    for frames, want in zip(rounds, sums):
        out: list[tuple[int, bytes]] = []
        for port, frame in frames:
            out += target.pipes[0].process(frame, port) or []
            oracle.pipeline.process(memoryview(bytearray(frame)), port, lambda p, parts: None)
        assert sorted(p for p, _ in out) == [1, 2, 3]      # one result per rank's port
        for port, frame in out:
            assert icrc_ok(frame)
            assert Ether(frame).dst == lab_mac(port - 1)
            np.testing.assert_array_equal(_payload(frame), want)
    counters = target.counters()
    assert counters["rings"] == oracle.counters()["rings"]
    assert counters["rings"]["ring"]["counters"]["aggregated"] == 3 * len(rounds)
    assert counters["target"] == "native"
    assert counters["ports"]["2"]["kind"] == "af_packet"
    assert counters["switch"] == {"workers": 1, "frames": 10, "outputs": 3,
                                  "ownership_errors": 0, "fallback_ports": 1}
    target.unregister_ring("ring")
    assert target.counters()["rings"] == {}
    with pytest.raises(KeyError, match="ring is not registered"):
        target.unregister_ring("ring")


def test_a_ring_over_two_workers_is_refused_and_others_go_to_their_worker_fake_io() -> None:
    io = FakeIO({1: 0, 2: 0, 3: 1, 4: 1}, workers=2)
    target = NativeTarget(io, [NativePipeline(), NativePipeline()], mac_ports(4), max_rings=4)
    with pytest.raises(ValueError, match=r"10\.77\.0\.3 port 3 on worker 1.*one worker"):
        target.register_ring(make_ring(3), 16)
    assert target.counters()["rings"] == {}
    target.register_ring(make_ring(2, ring_id="back", hosts=[2, 3]), 16)
    assert list(target.pipes[1].counters()) == ["back"] and target.pipes[0].counters() == {}


def test_unknown_macs_ports_and_the_ring_limit_are_refused_fake_io() -> None:
    target = NativeTarget(FakeIO({1: 0, 2: 0}), [NativePipeline()], mac_ports(2), max_rings=1)
    with pytest.raises(ValueError, match="02:4e:52:00:00:03 is not in the switch's static"):
        target.register_ring(make_ring(3), 16)
    target.register_ring(make_ring(2, ring_id="a"), 16)
    target.register_ring(make_ring(2, ring_id="a"), 16)           # the same again: a no-op
    with pytest.raises(ValueError, match="holds 1 rings at most"):
        target.register_ring(make_ring(2, ring_id="b", qpn_base=0x40), 16)
    assert target.limits()["max_rings"] == 1
    assert target.port_of_mac("02:4E:52:0:0:2") == 2
    missing = NativeTarget(FakeIO({1: 0}), [NativePipeline()], mac_ports(2), max_rings=1)
    with pytest.raises(ValueError, match="not ports of this switch's I/O"):
        missing.register_ring(make_ring(2), 16)
