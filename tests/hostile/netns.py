"""The hostile-input rig: the real switch process (`python -m switch`) in a network namespace
of its own, its ports cabled by veth pairs to a hosts' namespace where the tests inject and
capture raw frames; the controller on a unix socket (reachable from any namespace).

Names: namespaces nrxswW (switch) and nrxhW (hosts), W the pytest-xdist worker's number
(empty outside xdist: parallel workers' rigs never share a namespace); switch port I is
nrxsI, its host end nrxhI (inside them). Host H (lab numbering: MAC 02:4e:52:00:00:0H+1,
IP 10.77.0.H+1) is on port H+1. With `control_link`, a veth nrxsc (switch side, CONTROL_IP) -
nrxhc (hosts side, CONTROL_PEER) is the control network: the controller may listen on an
address the hosts reach over it, as in the lab.
Invariants: everything the rig creates is removed on close (the namespaces take their veths
with them); the switch process is ended by its own pid; nothing leaves the namespaces (no
addresses, IPv6 off, so the kernel sends nothing of its own).
"""
from __future__ import annotations

import ctypes
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import pytest

from tests.processes import stop_process
from tests.roce_layers import lab_mac

#: this pytest-xdist worker's number ("" outside xdist), in every namespace name of tests/hostile
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
SWITCH_NS = f"nrxsw{WORKER}"
HOSTS_NS = f"nrxh{WORKER}"
ROOT = Path(__file__).resolve().parents[2]
ETH_P_ALL = 0x0003
CLONE_NEWNET = 0x40000000
UNDER_CI = os.environ.get("CI") == "true"
ALICE = "alice-hostile-secret-0001"
BOB = "bob-hostile-secret-000002"
HOSTS_NET = "10.77.0.0/24"         # the lab addresses of the rig's hosts (alice's)
BOBS_NET = "10.77.1.0/24"          # bob's hosts: on no port of the rig
CONTROL_IP, CONTROL_PEER = "10.99.0.254", "10.99.0.1"   # the control link's two ends


def require_netns() -> None:
    """Skip (fail under CI=true) unless this process can make namespaces and veths."""
    why = None
    if os.geteuid() != 0:
        why = "needs root (network namespaces, veth pairs, raw sockets)"
    elif shutil.which("ip") is None:
        why = "needs iproute2's `ip`"
    elif not Path("/proc/self/ns/net").exists():
        why = "needs network namespaces (/proc/self/ns/net)"
    if why:
        if UNDER_CI:
            pytest.fail(f"hostile-input suite under CI=true: {why}")
        pytest.skip(why)


def run_ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")


def _sysctl(ns: str, *settings: str) -> None:
    for s in settings:
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", s], check=True,
                       capture_output=True)


def in_netns(ns: str, fn):
    """Run fn() on a thread that entered namespace `ns` (a socket it opens stays there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, object] = {}

    def work() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({ns})")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e
    t = threading.Thread(target=work)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


class HostPort:
    """A raw socket on host end nrxhI: send frames into switch port I, capture what it emits."""

    def __init__(self, port: int):
        self.port = port
        self.ifname = f"nrxh{port}"

        def open_sock() -> socket.socket:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)   # receives once bound
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.bind((self.ifname, ETH_P_ALL))
            s.setblocking(False)
            return s
        self.sock: socket.socket = in_netns(HOSTS_NS, open_sock)

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def drain(self) -> int:
        n = 0
        while True:
            try:
                self.sock.recv(65536)
                n += 1
            except BlockingIOError:
                return n

    def receive(self, count: int, timeout: float = 5.0, match=lambda f: True) -> list[bytes]:
        """The next `count` frames that satisfy `match`, or fewer when `timeout` s pass."""
        got: list[bytes] = []
        end = time.monotonic() + timeout
        while len(got) < count:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                break
            try:
                frame = self.sock.recv(65536)
            except BlockingIOError:
                continue
            if match(frame):
                got.append(frame)
        return got

    def close(self) -> None:
        self.sock.close()


class SwitchRig:
    """The namespaces, the veths and one switch process (see the module doc)."""

    def __init__(self, tmp: Path, ports: int = 4, static_hosts: Sequence[int] = (0, 1, 2),
                 extra_args: Sequence[str] = (), module: str = "switch",
                 controller_args: Optional[Sequence[str]] = None, control_link: bool = False):
        """`controller_args`: instead of the rig's token file, hosts policy and unix socket
        (`--controller ADDR ...`, the switch's defaults otherwise)."""
        require_netns()
        self.control_link = control_link
        self.tmp = tmp
        self.ports = ports
        self.socket_path = tmp / "ctl.sock"
        self.addr = f"unix:{self.socket_path}"
        self.token_file = tmp / "switch.tokens"
        self.token_file.write_text(f"alice {ALICE}\nbob {BOB}\n")
        self.alice_tokens = tmp / "alice.tokens"
        self.alice_tokens.write_text(f"alice {ALICE}\n")
        self.bob_tokens = tmp / "bob.tokens"
        self.bob_tokens.write_text(f"bob {BOB}\n")
        for f in (self.token_file, self.alice_tokens, self.bob_tokens):
            f.chmod(0o600)
        self.hosts_policy = tmp / "hosts.policy"     # alice: the rig's hosts; bob: none of them
        self.hosts_policy.write_text(f"alice {HOSTS_NET}\nbob {BOBS_NET}\n")
        self.controller_args = (["--controller", self.addr, "--token-file", str(self.token_file),
                                 "--hosts-policy", str(self.hosts_policy)]
                                if controller_args is None else list(controller_args))
        self.log_path = tmp / "switch.log"
        self.proc: Optional[subprocess.Popen] = None
        self.hosts: dict[int, HostPort] = {}
        self._teardown_netns()
        try:
            try:
                self._make_netns()
            except AssertionError:          # a namespace of the previous rig still going away
                self._teardown_netns()
                time.sleep(1.0)
                self._make_netns()
            self._start(static_hosts, extra_args, module)
            self.hosts = {p: HostPort(p) for p in range(1, ports + 1)}
        except BaseException:
            self.close()
            raise

    def _make_netns(self) -> None:
        for ns in (SWITCH_NS, HOSTS_NS):
            run_ip("netns", "add", ns)
            _sysctl(ns, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
        for p in range(1, self.ports + 1):
            run_ip("link", "add", f"nrxs{p}", "netns", SWITCH_NS, "type", "veth", "peer", "name",
                f"nrxh{p}", "netns", HOSTS_NS)
            run_ip("-n", SWITCH_NS, "link", "set", f"nrxs{p}", "up")
            run_ip("-n", HOSTS_NS, "link", "set", f"nrxh{p}", "up")
        if self.control_link:
            run_ip("link", "add", "nrxsc", "netns", SWITCH_NS, "type", "veth", "peer", "name",
                   "nrxhc", "netns", HOSTS_NS)
            for ns, dev, ip in ((SWITCH_NS, "nrxsc", CONTROL_IP),
                                (HOSTS_NS, "nrxhc", CONTROL_PEER)):
                run_ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
                run_ip("-n", ns, "link", "set", dev, "up")
                run_ip("-n", ns, "link", "set", "lo", "up")

    def _start(self, static_hosts: Sequence[int], extra_args: Sequence[str], module: str) -> None:
        ready = self.tmp / "switch.ready"
        cmd = ["ip", "netns", "exec", SWITCH_NS, sys.executable, "-m", module]
        for p in range(1, self.ports + 1):
            cmd += ["--port", f"{p}=nrxs{p}"]
        for h in static_hosts:
            cmd += ["--mac", f"{lab_mac(h)}={h + 1}"]
        # the fuzzers call far faster than any job: the rate limit is tested on its own
        # (tests/test_controller.py), so it is off here
        cmd += [*self.controller_args, "--calls-per-second", "0", "--ready-file", str(ready),
                *extra_args]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=ROOT)
        end = time.monotonic() + 30
        while not ready.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the switch exited at start ({self.proc.returncode}):\n"
                                     + self.log())
            if time.monotonic() > end:
                raise AssertionError("the switch did not become ready in 30 s:\n" + self.log())
            time.sleep(0.05)
        self.pid = int(ready.read_text())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def drain(self) -> None:
        for h in self.hosts.values():
            h.drain()

    def settle(self, quiet: float = 0.3, timeout: float = 10.0) -> None:
        """Drain until no host port received anything for `quiet` s (the switch is idle)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            time.sleep(quiet)
            if not sum(h.drain() for h in self.hosts.values()):
                return
        raise AssertionError(f"the switch kept sending for {timeout} s")

    def close(self) -> None:
        for h in self.hosts.values():
            h.close()
        if self.proc is not None:
            stop_process(self.proc)
        self._teardown_netns()

    @staticmethod
    def _teardown_netns() -> None:
        for ns in (SWITCH_NS, HOSTS_NS):
            if Path(f"/run/netns/{ns}").exists():
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
