"""Helpers for tests that run inside the lab (scripts/lab.sh): hosts, rxe counters, the switch.

Host I is network namespace hI, address 10.77.0.(I+1), rxe device rxeI; the switch's
controller answers at $NR_CONTROLLER from the hosts' namespaces (docs/pipeline.md).
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from netreduce.tools.forkserver import NETNS_DIR, Refused, WarmProcess

log = logging.getLogger(__name__)

# (the first of a list: lab.sh --aggregators K lists K controllers)
CONTROLLER = os.environ.get("NR_CONTROLLER", "10.77.0.254:50051").split(",")[0]
HOSTS = int(os.environ.get("NR_LAB_HOSTS", "0"))
ROOT = Path(__file__).resolve().parents[2]


def host_ip(i: int) -> str:
    return f"10.77.0.{i + 1}"


def in_host(i: int, *cmd: str) -> list[str]:
    """argv running `cmd` in host hI's namespace."""
    return ["ip", "netns", "exec", f"h{i}", *cmd]


def run_in_host(i: int, *cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(in_host(i, *cmd), capture_output=True, text=True, timeout=timeout)
    return _checked(i, cmd, p, check)


def _checked(i: int, words: tuple[str, ...], p: subprocess.CompletedProcess[str],
             check: bool) -> subprocess.CompletedProcess[str]:
    """`p`, or AssertionError naming host hI, `words` and all `p` said when `check` and it
    failed."""
    if check and p.returncode != 0:
        raise AssertionError(f"h{i}: {' '.join(words)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def python_in_host(i: int, *args: str, timeout: float = 120,
                   check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in host hI, forked by that host's fork server ($NR_FORKSERVERS/hI.sock,
    scripts/lab_forkservers.sh), whose imports (grpc and switch.ctl among them) are paid once
    per boot: a cold `python -m switch.ctl` costs 10-17 s of the lab's emulated CPU, a fork
    well under one. Without a server (or refused by it: logged) it starts cold. Its stdout
    and stderr come apart, as with run_in_host; past `timeout` its process group is killed
    and subprocess.TimeoutExpired raised."""
    cmd = [sys.executable, *args]
    servers = os.environ.get("NR_FORKSERVERS", "")
    sock = os.path.join(servers, f"h{i}.sock")
    if not servers or not os.path.exists(sock):
        log.warning("h%d: no fork server at %r: %s starts cold", i, sock, " ".join(args))
        return run_in_host(i, *cmd, timeout=timeout, check=check)
    with tempfile.TemporaryFile() as err:
        try:
            proc = WarmProcess(sock, cmd, dict(os.environ), netns=os.path.join(NETNS_DIR, f"h{i}"),
                               stderr=err.fileno())
        except (Refused, OSError) as e:
            log.warning("h%d: the fork server %s cannot run %s (%s): it starts cold", i, sock,
                        " ".join(args), e)
            return run_in_host(i, *cmd, timeout=timeout, check=check)
        out = _read_until_eof(proc, timeout, cmd)
        code = proc.wait(timeout=10)
        err.seek(0)
        p = subprocess.CompletedProcess(cmd, code, out.decode(errors="replace"),
                                        err.read().decode(errors="replace"))
    return _checked(i, args, p, check)


def _read_until_eof(proc: WarmProcess, timeout: float, cmd: list[str]) -> bytes:
    """All of `proc`'s stdout; its process group killed past `timeout`."""
    end = time.monotonic() + timeout
    chunks = []
    with proc.stdout:
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                raise subprocess.TimeoutExpired(cmd, timeout)
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def rxe_counter(i: int, name: str) -> int:
    return int(Path(f"/sys/class/infiniband/rxe{i}/ports/1/hw_counters/{name}").read_text())


def switch_counters() -> dict:
    """The switch's counters, asked from h0 over the lab network through the switch itself."""
    p = python_in_host(0, "-m", "switch.ctl", "--addr", CONTROLLER, "counters")
    return json.loads(p.stdout)


def port_counter(counters: dict, port: int, name: str) -> int:
    return int(counters["ports"][str(port)][name])


def wait_for(pred, timeout: float, what: str, interval: float = 0.2) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@contextmanager
def host_loss(loss: str) -> Iterator[None]:
    """`loss` (tc netem, e.g. "1%") on every host's lab link, removed afterwards whatever
    happens; "0%" changes nothing."""
    if loss == "0%":
        yield
        return
    try:
        for i in range(HOSTS):
            run_in_host(i, "tc", "qdisc", "add", "dev", "nr0", "root", "netem", "loss", loss)
        yield
    finally:
        for i in range(HOSTS):
            run_in_host(i, "tc", "qdisc", "del", "dev", "nr0", "root", check=False)


@contextmanager
def netem_links(hosts: Iterable[int], netem: list[str]) -> Iterator[None]:
    """tc netem `netem` (e.g. loss, duplicate, delay, reorder) on each of `hosts`' lab links
    in both directions: egress on nr0, ingress through an ifb device nr0 redirects to.
    Removed afterwards whatever happens."""
    hosts = list(hosts)
    try:
        for i in hosts:
            run_in_host(i, "tc", "qdisc", "add", "dev", "nr0", "root", "netem", *netem)
            run_in_host(i, "ip", "link", "add", "nrifb0", "type", "ifb")
            run_in_host(i, "ip", "link", "set", "nrifb0", "mtu", "9000", "up")
            run_in_host(i, "tc", "qdisc", "add", "dev", "nr0", "handle", "ffff:", "ingress")
            run_in_host(i, "tc", "filter", "add", "dev", "nr0", "parent", "ffff:", "matchall",
                        "action", "mirred", "egress", "redirect", "dev", "nrifb0")
            run_in_host(i, "tc", "qdisc", "add", "dev", "nrifb0", "root", "netem", *netem)
        yield
    finally:
        for i in hosts:
            run_in_host(i, "tc", "qdisc", "del", "dev", "nr0", "root", check=False)
            run_in_host(i, "tc", "qdisc", "del", "dev", "nr0", "ingress", check=False)
            run_in_host(i, "ip", "link", "del", "nrifb0", check=False)
