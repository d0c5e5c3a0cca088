"""The Harness for the BMv2 target: switch/p4 run by simple_switch_grpc, driven over veths.

One simple_switch_grpc serves, one after the other, the vectors of a test module that have
the same program, ports, MAC table and role config (`switch_key`; tests/conftest.py runs
them in a row). `setup` starts one (labswitches.bmv2_lab.Bmv2Switch: p4c output, P4Runtime via
p4runtime-shell) when the key changes or the last vector did not end cleanly; otherwise
it resets the running one (Bmv2Switch.reset: its multicast groups deleted, the program
pushed again, which starts every table, register and counter over, and a new target), so
that every vector starts from the state of a fresh switch (tests/test_role_conformance.py,
test_a_reset_bmv2_switch_is_a_fresh_one, compares them). Switch port N is the veth
`nr<pid><g>sN` (the test process's pid and a letter per switch started: two suites
running at once do not collide, nor a switch with its predecessor's veths; at most 15
characters); the harness sends and captures on the peer `nr<pid><g>hN`. Needs root (veth
pairs in the current namespace, IPv6 off on them so the kernel adds no frames of its own),
p4c, simple_switch_grpc and p4runtime-shell.

A step (`send`, `send_burst`) given `expect`, the number of frames the vector expects,
waits for them (at most MAX_WAIT), then GRACE for an extra one; a step expecting none
waits for EMPTY_WAIT of silence; one not saying waits for QUIET of silence. No frame is
dropped unseen: one that comes after its step ended is returned first by the next step
(whose comparison then fails), and `counters()`, which a vector calls after its last step,
first waits EMPTY_WAIT of silence and fails naming any frame (docs/tests.md, "BMv2
vectors").
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import select
import string
import subprocess
import time
from pathlib import Path
from typing import Any, Hashable, Optional

from labswitches.bmv2_lab import Bmv2Switch
from nr_contract.spec import RingSpec
from switch.control.bmv2 import Bmv2Target
from switch.dataplane.ports import Port, open_port
from switch.dataplane.spine import SpineConfig
from switch.dataplane.tor import TorConfig
from switch.p4.program import DEFAULT_BUILD
from tests.conformance.format import ANY_PAYLOAD_LENGTH, Frames
from tests.p4tools import unavailable
from tests.processes import free_port

QUIET = 0.3          # s of silence that ends a step whose expected frames are not given
GRACE = 0.05         # s after the expected frames for an extra one (docs/tests.md)
EMPTY_WAIT = 0.15    # s of silence that ends a step expecting no frame (docs/tests.md)
MAX_WAIT = 5.0       # s a step may take at most
ETHERTYPE_IPV6 = b"\x86\xdd"
LOG = DEFAULT_BUILD / "simple_switch_grpc.log"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def veth_names(num: int, group: str = "") -> tuple[str, str]:
    """(switch side, host side) names of port `num`'s veth pair of switch `group` (a letter),
    unique to this process."""
    return f"nr{os.getpid()}{group}s{num}", f"nr{os.getpid()}{group}h{num}"


def _veth_pair(num: int, group: str) -> tuple[str, str]:
    """(switch side, host side) of port `num`, created up, IPv6 off, offloads off."""
    sw, host = veth_names(num, group)
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


def _describe(frames: list[tuple[int, bytes]]) -> str:
    return f"{len(frames)}: " + "; ".join(f"port {p}: {f.hex()}" for p, f in frames)


def switch_key(vectors_setup: dict[str, Any]) -> Hashable:
    """What a vector needs of a running switch: its program (role), ports, static MAC table
    and role config. Vectors with the same key run on one simple_switch_grpc."""
    return (vectors_setup.get("role", "switch"), tuple(sorted(vectors_setup["ports"])),
            json.dumps(sorted(vectors_setup["macs"].items())),
            json.dumps(vectors_setup.get("config"), sort_keys=True))


class Bmv2Harness:
    supports = frozenset({ANY_PAYLOAD_LENGTH})   # any payload up to 64 int32
    # the veths' letter of each switch started, shared by the harnesses of this process
    _groups = itertools.cycle(string.ascii_lowercase)

    def __init__(self) -> None:
        self.switch: Bmv2Switch | None = None
        self.ports: dict[int, Port] = {}
        self.starts = 0                    # simple_switch_grpc processes started
        self.resets = 0                    # times a running one was reset for a setup
        self._key: Hashable = None
        self._ended = False                # the last vector reached check_quiet, passing
        self._group = ""

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        target = self.start(vectors_setup).target
        assert isinstance(target, Bmv2Target)
        for ring in vectors_setup["rings"]:
            target.register_ring(RingSpec.from_dict(ring["spec"]), ring["slots"])

    def start(self, vectors_setup: dict[str, Any], spine: Optional[SpineConfig] = None,
              tor: Optional[TorConfig] = None, log: Path = LOG) -> Bmv2Switch:
        """A switch (the spine program with `spine`, the ToR's with `tor`) in the state a
        fresh one has, cabled to this harness's ports: the running one, reset
        (Bmv2Switch.reset), when it has the setup's key
        (switch_key) and the last vector ended cleanly (check_quiet passed: nothing of it
        is still on its way); else a new one."""
        key = switch_key(vectors_setup)
        ended, self._ended = self._ended, False
        if self.switch is not None and key == self._key and ended:
            try:
                self.switch.reset()
            except BaseException:
                self.close()
                raise
            late = self._pending()
            assert not late, ("BMv2 harness: frames after the last vector's end and its "
                              "check_quiet: " + _describe(late))
            self.resets += 1
            return self.switch
        self.close()
        self._group = next(self._groups)
        links = {num: _veth_pair(num, self._group) for num in vectors_setup["ports"]}
        self.ports = {num: open_port(num, host) for num, (_, host) in links.items()}
        log.parent.mkdir(parents=True, exist_ok=True)
        self.switch = Bmv2Switch({num: sw for num, (sw, _) in links.items()},
                                 dict(vectors_setup["macs"]), grpc_port=free_port(),
                                 thrift_port=free_port(), log=log, spine=spine, tor=tor)
        self._key = key
        self.starts += 1
        return self.switch

    def _pending(self) -> list[tuple[int, bytes]]:
        """Every frame already captured on the ports (IPv6 ones, the kernel's, left out)."""
        out = []
        for port in self.ports.values():
            while True:
                try:
                    got = port.sock.recv(65536)
                except BlockingIOError:
                    break
                if got[12:14] != ETHERTYPE_IPV6:
                    out.append((port.number, got))
        return out

    def send(self, in_port: int, frame: bytes,
             expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        return self.send_burst([(in_port, frame)], expect)

    def send_burst(self, frames: Frames,
                   expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        """Send `frames`; every frame captured meanwhile, those still on their way from
        earlier steps first (see the module's docstring for how long it waits)."""
        out = self._pending()
        for in_port, frame in frames:
            self.ports[in_port].sock.send(frame)
        by_fd = {p.sock.fileno(): p for p in self.ports.values()}
        deadline = time.monotonic() + MAX_WAIT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if expect is None:
                wait = QUIET
            elif expect == 0:
                wait = EMPTY_WAIT
            else:
                wait = GRACE if len(out) >= expect else left
            ready, _, _ = select.select(list(by_fd), [], [], min(wait, left))
            if not ready:
                break
            for fd in ready:
                got = by_fd[fd].sock.recv(65536)
                if got[12:14] != ETHERTYPE_IPV6:
                    out.append((by_fd[fd].number, got))
        return out

    def check_quiet(self) -> None:
        """AssertionError naming every frame the switch sends within EMPTY_WAIT of silence
        after the last step (an extra that came later than its step's GRACE)."""
        late = self.send_burst([], 0)
        assert not late, "frames after the last step: " + _describe(late)
        self._ended = True

    def counters(self) -> dict[str, Any]:
        """The rings' counters (the vector's last step done: check_quiet first)."""
        self.check_quiet()
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
            subprocess.run(["ip", "link", "del", veth_names(num, self._group)[0]],
                           capture_output=True)
        self.ports = {}
        self._key = None


def create_harness() -> Bmv2Harness:
    """A harness, or unavailable() saying what is missing (p4tools: fails under CI)."""
    if os.geteuid() != 0:
        unavailable("bmv2 target: needs root (it cables simple_switch_grpc with veth pairs)")
    if importlib.util.find_spec("p4runtime_sh") is None:
        unavailable("bmv2 target: p4runtime-shell missing (pip install 'netreduce[bmv2]')")
    return Bmv2Harness()
