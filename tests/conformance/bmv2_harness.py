"""The Harness for the BMv2 target: switch/p4 run by simple_switch_grpc, driven over veths.

Every `setup` starts a fresh simple_switch_grpc (tools.bmv2_lab.Bmv2Switch: p4c output,
P4Runtime via p4runtime-shell) whose port N is the veth `nr<pid>sN`; the harness sends and
captures on the peer `nr<pid>hN` (the test process's pid: two suites running at once do
not collide; at most 15 characters). `send` (`send_burst`) returns every frame captured until the ports stay
quiet for QUIET seconds (a result emitted by a recirculated continuation arrives within
that too). Needs root (veth pairs in the current namespace, IPv6 off on them so the
kernel adds no frames of its own), p4c, simple_switch_grpc and p4runtime-shell.
"""
from __future__ import annotations

import importlib.util
import os
import select
import socket
import subprocess
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Optional

from switch.contract import RingSpec
from switch.control.bmv2 import Bmv2Target
from switch.dataplane.spine import SpineConfig
from switch.dataplane.tor import TorConfig
from tools.bmv2_lab import Bmv2Switch
from switch.dataplane.ports import Port, open_port
from switch.p4.program import DEFAULT_BUILD

from conformance.format import ANY_PAYLOAD_LENGTH, Frames
from p4tools import unavailable

QUIET = 0.3          # s without a frame that ends a step
MAX_WAIT = 5.0       # s a step may take at most
ETHERTYPE_IPV6 = b"\x86\xdd"
LOG = DEFAULT_BUILD / "simple_switch_grpc.log"


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def veth_names(num: int) -> tuple[str, str]:
    """(switch side, host side) names of port `num`'s veth pair, unique to this process."""
    return f"nr{os.getpid()}s{num}", f"nr{os.getpid()}h{num}"


def _veth_pair(num: int) -> tuple[str, str]:
    """(switch side, host side) of port `num`, created up, IPv6 off, offloads off."""
    sw, host = veth_names(num)
    subprocess.run(["ip", "link", "del", sw], capture_output=True)     # left by a crash
    _ip("link", "add", sw, "type", "veth", "peer", "name", host)
    for dev in (sw, host):
        ipv6 = Path(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6")
        if ipv6.exists():                  # absent when IPv6 is off altogether
            ipv6.write_text("1\n")
        _ip("link", "set", dev, "mtu", "9000", "up")
        subprocess.run(["ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off"],
                       capture_output=True)
    return sw, host


class Bmv2Harness:
    supports = frozenset({ANY_PAYLOAD_LENGTH})   # any payload up to 64 int32

    def __init__(self) -> None:
        self.switch: Bmv2Switch | None = None
        self.ports: dict[int, Port] = {}

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        self.switch = self.start(vectors_setup)
        target = self.switch.target
        assert isinstance(target, Bmv2Target)
        for ring in vectors_setup["rings"]:
            target.register_ring(RingSpec.from_dict(ring["spec"]), ring["slots"])

    def start(self, vectors_setup: dict[str, Any], spine: Optional[SpineConfig] = None,
              tor: Optional[TorConfig] = None, log: Path = LOG) -> Bmv2Switch:
        """Forget the last setup; a fresh switch (the spine program with `spine`, the ToR's
        with `tor`) cabled to this harness's ports."""
        self.close()
        links = {num: _veth_pair(num) for num in vectors_setup["ports"]}
        self.ports = {num: open_port(num, host) for num, (_, host) in links.items()}
        log.parent.mkdir(parents=True, exist_ok=True)
        return Bmv2Switch({num: sw for num, (sw, _) in links.items()},
                          dict(vectors_setup["macs"]), grpc_port=_free_port(),
                          thrift_port=_free_port(), log=log, spine=spine, tor=tor)

    def _drain(self) -> None:
        for port in self.ports.values():
            while True:
                try:
                    port.sock.recv(65536)
                except BlockingIOError:
                    break

    def send(self, in_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return self.send_burst([(in_port, frame)])

    def send_burst(self, frames: Frames) -> list[tuple[int, bytes]]:
        self._drain()
        for in_port, frame in frames:
            self.ports[in_port].sock.send(frame)
        by_fd = {p.sock.fileno(): p for p in self.ports.values()}
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + MAX_WAIT
        while time.monotonic() < deadline:
            ready, _, _ = select.select(list(by_fd), [], [], QUIET)
            if not ready:
                break
            for fd in ready:
                got = by_fd[fd].sock.recv(65536)
                if got[12:14] != ETHERTYPE_IPV6:
                    out.append((by_fd[fd].number, got))
        return out

    def counters(self) -> dict[str, Any]:
        assert self.switch is not None and isinstance(self.switch.target, Bmv2Target)
        rings = self.switch.target.counters()["rings"]
        return {rid: {"counters": r["counters"],
                      "connections": [c["counters"] for c in r["connections"]]}
                for rid, r in rings.items()}

    def close(self) -> None:
        for port in self.ports.values():
            port.sock.close()
        if self.switch is not None:
            self.switch.close()
            self.switch = None
        for num in self.ports:
            subprocess.run(["ip", "link", "del", veth_names(num)[0]], capture_output=True)
        self.ports = {}


def create_harness() -> Bmv2Harness:
    """A harness, or unavailable() saying what is missing (p4tools: fails under CI)."""
    if os.geteuid() != 0:
        unavailable("bmv2 target: needs root (it cables simple_switch_grpc with veth pairs)")
    if importlib.util.find_spec("p4runtime_sh") is None:
        unavailable("bmv2 target: p4runtime-shell missing (pip install 'netreduce[bmv2]')")
    return Bmv2Harness()
