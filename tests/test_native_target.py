"""NativeTarget (switch/control/native_target.py) and `python -m switch --target native`.

Rings registered through the target aggregate scapy-built WRITEs to numpy's wrapping sums
(with scapy's ICRC on every result); its counters are the software target's for the same
frames. Without root the frames go through the worker's NativePipeline directly behind a
fake I/O (tests named `fake_io`); as root, through libnrio on veth pairs in namespace nrxnl0
and through the switch process itself.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
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

ROOT = Path(__file__).resolve().parents[1]
NETNS = "nrxnl0"


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
    assert counters["ports"]["2"]["kind"] == 3 and counters["ports"]["1"]["kind"] == 2
    assert counters["switch"] == {"workers": 1, "frames": 10, "outputs": 3,
                                  "ownership_errors": 0, "fallback_ports": 1}
    target.unregister_ring("ring")
    assert target.counters()["rings"] == {}
    with pytest.raises(KeyError, match="ring is not registered"):
        target.unregister_ring("ring")


def test_the_counters_rpc_carries_the_native_counters_fake_io() -> None:
    """The controller's Counters reply (protobuf: integer port counters) of a native
    target, as a client reads it."""
    from nr_contract import control_pb2 as pb
    from switch.control.service import ControllerConfig, ControllerService
    target = NativeTarget(FakeIO({1: 0, 2: 0}), [NativePipeline()], mac_ports(2), max_rings=4)
    service = ControllerService(target, ControllerConfig(insecure=True))
    reply = service.counters(pb.CountersRequest(), "anyone")
    assert reply.target == "native"
    assert {p.port: (p.ifname, dict(p.counters)) for p in reply.ports} == {
        1: ("veth1", {"rx_packets": 7, "fallback": 0, "kind": 2}),
        2: ("veth2", {"rx_packets": 7, "fallback": 1, "kind": 3})}
    assert reply.switch["fallback_ports"] == 1 and reply.switch["frames"] == 10


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


def _switch(*args: str, netns: str | None = None, **kw: Any) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "switch", "--target", "native", *args]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("args,rc,why", [
    (["--port", "1=nrxnl-nosuch"], 1, "no such interface: 1=nrxnl-nosuch"),
    (["--port", "1=lo", "--one-armed"], 1, "a loopback interface is not a switch port: 1=lo"),
    (["--port", "1=lo", "--tx-loss", "1=5"], 2, "emulate loss with tc netem"),
    (["--port", "1=lo", "--role", "tor", "--controller", "127.0.0.1:1", "--insecure"], 2,
     "--role switch only"),
    (["--port", "1=lo", "--port-worker", "2=0"], 2, r"port\(s\) \[2\] not a --port"),
    (["--port", "1=lo", "--workers", "0"], 2, "at least 1"),
    (["--port", "1=lo", "--one-armed", "--workers", "2"], 2, "one port, one worker"),
    (["--port", "2=lo", "--one-armed"], 2, "exactly one port, --port 1=IFNAME"),
    (["--port", "1=lo", "--one-armed", "--xdp-mode", "generic"], 2, "--xdp-mode af_packet")])
def test_the_native_switch_refuses_bad_command_lines(args: list[str], rc: int, why: str) -> None:
    p = _switch(*args)
    _, err = p.communicate(timeout=60)
    assert p.returncode == rc, err
    assert re.search(why, err), err


@pytest.fixture
def netns() -> Any:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root (a network namespace, veth pairs, AF_XDP sockets)")
        pytest.skip("needs root (a network namespace, veth pairs, AF_XDP sockets)")
    from tests.native_rig import in_netns
    gen = in_netns(NETNS)
    next(gen)
    yield
    next(gen, None)


@pytest.mark.parametrize("mode", ["generic", "af_packet"])
def test_the_native_switch_aggregates_and_reports_on_veth_root_afxdp(
        netns: None, mode: str, tmp_path: Path) -> None:
    from switch.dataplane.ports import open_port
    from tests.native_rig import collect, veths
    links = veths([1, 2, 3], 9000, prefix="nrxnl")
    drivers = {p: open_port(p, drv) for p, (_, drv) in links.items()}
    stats, ready = tmp_path / "stats.json", tmp_path / "ready"
    tmp_path.chmod(0o700)
    ports = [a for p, (sw, _) in links.items() for a in ("--port", f"{p}={sw}")]
    macs = [a for m, p in mac_ports(3).items() for a in ("--mac", f"{m}={p}")]
    # the controller is served in-process by the test below: here the switch forwards only
    p = _switch(*ports, *macs, "--xdp-mode", mode, "--stats-file", str(stats),
                "--ready-file", str(ready))
    try:
        for _ in range(200):
            if ready.exists() or p.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), p.communicate(timeout=10)
        spec = make_ring(3, mtu=1024)
        frame = write_frame(spec.connections[0], 0, WRITE_FIRST, np.arange(256, dtype=np.int32))
        drivers[1].sock.send(frame)
        got = collect({n: d.sock for n, d in drivers.items()}, 1)
        assert got == [(2, frame)]                     # by the static MAC table, unchanged
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        for d in drivers.values():
            d.sock.close()
    assert p.returncode == 0, err
    doc = json.loads(stats.read_text())
    assert doc["target"] == "native" and doc["rings"] == {}
    assert doc["ports"]["1"]["rx_packets"] >= 1 and doc["ports"]["2"]["tx_packets"] >= 1
    assert doc["ports"]["1"]["roce_packets"] == 1 and doc["ports"]["2"]["roce_packets"] == 0
    want = "af_packet" if mode == "af_packet" else "af_xdp-generic"
    assert {c["kind"] for c in doc["ports"].values()} == {3 if mode == "af_packet" else 2}
    assert doc["switch"]["fallback_ports"] == 0        # chosen by --xdp-mode: no fallback
    assert f"1=nrxnl1s ({want}, worker 0)" in err


def test_a_ring_registered_through_the_target_aggregates_on_veth_root_afxdp(
        netns: None) -> None:
    from switch.dataplane.ports import open_port
    from switch.native.nrio import NativeIO
    from tests.native_rig import collect, veths
    links = veths([1, 2, 3], 9000, prefix="nrxnl")
    drivers = {p: open_port(p, drv) for p, (_, drv) in links.items()}
    spec = make_ring(3, mtu=4096)
    rounds, sums = _writes(spec, messages=2, seed=6)
    pipes = [NativePipeline()]
    try:
        with NativeIO({p: sw for p, (sw, _) in links.items()}, mode="generic",
                      ring_size=512, idle_poll_us=100) as io:
            target = NativeTarget(io, pipes, mac_ports(3), max_rings=4)
            pipes[0].set_l2(mac_ports(3), [1, 2, 3])
            io.start([pipes[0].address])
            target.register_ring(spec, 16)
            for frames, want in zip(rounds, sums):
                for port, frame in frames:
                    drivers[port].sock.send(frame)
                got = collect({n: d.sock for n, d in drivers.items()}, 3)
                assert sorted(p for p, _ in got) == [1, 2, 3]
                for port, frame in got:
                    assert icrc_ok(frame) and Ether(frame).dst == lab_mac(port - 1)
                    np.testing.assert_array_equal(_payload(frame), want)
            io.stop()
            counters = target.counters()
    finally:
        for d in drivers.values():
            d.sock.close()
        pipes[0].close()
    ring = counters["rings"]["ring"]["counters"]
    assert ring["aggregated"] == 3 * len(rounds) and ring["completed"] == len(rounds)
    assert counters["switch"]["ownership_errors"] == 0
    for port in (1, 2, 3):                 # every frame in was RoCE (scapy's IPv4/UDP 4791)
        assert counters["ports"][str(port)]["roce_packets"] == len(rounds)
    assert sum(int(c["rx_gathered"]) for c in counters["ports"].values()) == 3 * len(rounds)
