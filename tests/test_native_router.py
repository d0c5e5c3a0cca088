"""One-armed mode on the native data plane (switch/native/router.h) against the software
one's (switch/dataplane/router.py through DataPlane._handle_routed, on a fake port): the
same frames in, byte for byte the same frames and counters out, and both equal to what
scapy builds as a router would send it (an independent oracle)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from scapy.compat import raw
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from switch.control.native_target import NativeTarget
from switch.control.target import SoftwareTarget
from switch.dataplane.pipeline import AggregationPipeline
from switch.dataplane.ports import DataPlane
from switch.dataplane.router import Router
from switch.native.binding import LIBRARY, NativePipeline, NativeRouter
from tests.roce_layers import WRITE_ONLY, icrc_ok, lab_ip, lab_mac, make_ring, write_frame, \
    wrapping_sum

SERVER = "02:4e:52:00:01:01"
pytestmark = pytest.mark.skipif(not LIBRARY.exists(), reason="make -C switch/native")


class FakeIO:
    """NativeTarget's PortIO for one worker and port 1, without sockets (a fake)."""

    workers = 1

    def port_worker(self, number: int) -> int:
        return 0 if number == 1 else -1

    def port_counters(self) -> dict[int, dict[str, Any]]:
        return {1: {"kind": "af_packet", "fallback": 0}}

    def worker_stats(self) -> list[dict[str, int]]:
        return [{"frames": 0, "outputs": 0, "ownership_errors": 0}]


class Python:
    """The software one-armed path: DataPlane._handle_routed on a fake port."""

    def __init__(self, static: dict[str, str]) -> None:
        self.router = Router(SERVER, static)
        self.target = SoftwareTarget(AggregationPipeline(), lambda mac: None, router=self.router)
        self.sent: list[bytes] = []
        dp = SimpleNamespace(router=self.router, pipeline=self.target.pipeline,
                             emit=lambda port, parts: self.sent.append(b"".join(parts)))
        dp._emit_routed = lambda port, parts: DataPlane._emit_routed(dp, port, parts)
        self.dp = dp
        self.port = SimpleNamespace(number=1, counters=SimpleNamespace(roce_packets=0))

    def send(self, frame: bytes) -> list[bytes]:
        self.sent = []
        DataPlane._handle_routed(self.dp, memoryview(frame), self.port)
        return self.sent

    def counters(self) -> dict[str, int]:
        return dataclasses.asdict(self.router.counters)


class Native:
    """The C one-armed path (nrdp_route) behind NativeTarget, on a fake I/O."""

    def __init__(self, static: dict[str, str]) -> None:
        self.pipe = NativePipeline(max_rings=4, max_conns=64)
        self.router = NativeRouter(self.pipe, Router(SERVER, static))
        self.target = NativeTarget(FakeIO(), [self.pipe], {}, 4, self.router)

    def send(self, frame: bytes) -> list[bytes]:
        out = self.router.process(frame)
        assert all(port == 1 for port, _ in out)
        return [f for _, f in out]

    def counters(self) -> dict[str, int]:
        return self.router.counters()

    def close(self) -> None:
        self.router.close()
        self.pipe.close()


@pytest.fixture
def both() -> Any:
    static = {"10.77.0.9": "02:4e:52:00:00:09"}
    py, c = Python(static), Native(static)
    yield py, c
    c.close()


def routed(frame: bytes, next_hop: str) -> bytes:
    """scapy's oracle: `frame` as a router sends it to `next_hop`."""
    want = Ether(frame)
    want[Ether].dst, want[Ether].src = next_hop, SERVER
    want[IP].ttl -= 1
    del want[IP].chksum
    return raw(want)


def plain(dst_ip: str, ttl: int = 64, dst_mac: str = SERVER, ihl: int = 5) -> bytes:
    opts = b"\x01" * 4 * (ihl - 5)
    return raw(Ether(src=lab_mac(0), dst=dst_mac)
               / IP(src=lab_ip(0), dst=dst_ip, ttl=ttl, ihl=ihl, options=opts, chksum=0x1234)
               / UDP(sport=1, dport=9) / (b"x" * 30))


def test_a_ring_aggregates_and_its_results_leave_routed_to_each_successor(both: Any) -> None:
    """Every rank's WRITE_ONLY addressed to the server: one result per successor, its MAC
    the successor's, source the server's, TTL 63, IPv4 checksum and ICRC right."""
    spec = make_ring(4, mtu=256)
    for side in both:
        side.target.register_ring(spec, 16)
    rng = np.random.default_rng(7)
    data = [rng.integers(-2**31, 2**31, 64, dtype=np.int64).astype(np.int32) for _ in range(4)]
    outs: list[list[bytes]] = [[], []]
    for c, d in zip(spec.connections, data):
        f = write_frame(c, 0, WRITE_ONLY, d)
        f = bytes.fromhex(SERVER.replace(":", "")) + f[6:]     # the host routes via the server
        for i, side in enumerate(both):
            outs[i] += side.send(f)
    assert outs[0] == outs[1] and len(outs[1]) == 4
    for out, c in zip(outs[1], spec.connections):
        pkt = Ether(out)
        assert (pkt.dst, pkt.src, pkt[IP].ttl, pkt[IP].dst) == (c.dst_mac, SERVER, 63, c.dst_ip)
        fixed = IP(raw(pkt[IP]))
        del fixed.chksum
        assert IP(raw(fixed)).chksum == pkt[IP].chksum and icrc_ok(out)
        assert np.array_equal(np.frombuffer(out[-4 - 256:-4], "<i4"), wrapping_sum(data))
    assert both[0].counters() == both[1].counters() == {
        "routed": 4, "ttl_expired": 0, "no_route": 0, "not_routable": 0, "not_for_router": 0}
    for side in both:
        side.target.unregister_ring(spec.ring_id)
        assert side.target.port_of_mac(lab_mac(1)) is None           # its neighbours went


@pytest.mark.parametrize("frame, counter, next_hop", [
    (plain("10.77.0.9"), "routed", "02:4e:52:00:00:09"),
    (plain("10.77.0.9", ihl=7), "routed", "02:4e:52:00:00:09"),       # options: in the checksum
    (plain("10.77.0.9", ttl=2), "routed", "02:4e:52:00:00:09"),
    (plain("10.77.0.9", ttl=1), "ttl_expired", None),
    (plain("10.77.0.9", ttl=0), "ttl_expired", None),
    (plain("10.77.0.8"), "no_route", None),
    (plain("10.77.0.9", dst_mac="02:4e:52:00:00:02"), "not_for_router", None),
    (plain("10.77.0.9", dst_mac="ff:ff:ff:ff:ff:ff"), "not_for_router", None),
    (raw(Ether(src=lab_mac(0), dst=SERVER) / ARP()), "not_routable", None),
    (plain("10.77.0.9")[:33], "not_routable", None),
    (plain("10.77.0.9")[:5], "not_for_router", None),
    (plain("10.77.0.9", ihl=7)[:40], "not_routable", None),          # shorter than its IHL
])
def test_frames_no_ring_takes_are_routed_or_dropped_alike(both: Any, frame: bytes, counter: str,
                                                         next_hop: str | None) -> None:
    outs = [side.send(frame) for side in both]
    assert outs[0] == outs[1] == ([routed(frame, next_hop)] if next_hop else [])
    assert both[0].counters() == both[1].counters()
    assert both[1].counters()[counter] == 1 and sum(both[1].counters().values()) == 1


def test_a_table_beyond_the_native_limit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="300 addresses; the native router holds 256"):
        Native({f"10.1.{i // 256}.{i % 256}": "02:00:00:00:00:01" for i in range(300)})


def test_one_armed_through_libnrio_on_a_veth_root() -> None:
    """The I/O layer's one-armed path (main.c -> nrdp_route) on a veth in a namespace of its
    own, AF_PACKET as netreduce-switch runs it: what leaves the port is what the Python
    path sends, frame for frame."""
    import os
    import subprocess

    from switch.dataplane.ports import open_port
    from switch.native.nrio import NativeIO
    from tests.native_rig import collect, in_netns, veths

    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace, a veth pair)")
    static = {"10.77.0.9": "02:4e:52:00:00:09"}
    spec = make_ring(3, mtu=4096)
    rng = np.random.default_rng(9)
    frames = [bytes.fromhex(SERVER.replace(":", "")) + write_frame(
        c, k, WRITE_ONLY, rng.integers(-2**31, 2**31, 1024, dtype=np.int64).astype(np.int32))[6:]
        for k in range(3) for c in spec.connections] + [plain("10.77.0.9"), plain("10.77.0.8")]
    py = Python(static)
    py.target.register_ring(spec, 16)
    gen = in_netns("nrxonat0")
    next(gen)
    try:
        sw, drv = veths([1], 9000, prefix="nrxonat")[1]
        subprocess.run(["ip", "link", "set", sw, "address", SERVER], check=True)
        driver = open_port(1, drv)
        native = Native(static)
        with NativeIO({1: sw}, mode="af_packet", ring_size=512, idle_poll_us=100) as io:
            native.target.register_ring(spec, 16)
            io.start([native.pipe.address])
            for frame in frames:
                want = py.send(frame)
                driver.sock.send(frame)
                assert [f for _, f in collect({1: driver.sock}, len(want))] == want
            io.stop()
            roce = io.port_counters()[1]["roce_packets"]
        assert native.counters() == py.counters()
        assert roce == py.port.counters.roce_packets == 9        # the ring's, for the server
        assert native.counters()["routed"] == 3 * 3 + 1 and native.counters()["no_route"] == 1
        driver.sock.close()
        native.close()
    finally:
        next(gen, None)
