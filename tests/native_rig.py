"""Veth pairs in a namespace of its own, as the native data plane's root tests use them: this
thread moved into a fresh namespace (`in_netns`), a veth pair per port (`veths`), and what
the driver sides' sockets receive within a bounded wait (`collect`)."""
from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

NETNS = "nrxnat0"
STEP_WAIT = 1.0                  # s for a step's frames to come out
EXTRA_WAIT = 0.02                # s more, for frames that should not come
CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def in_netns(netns: str = NETNS) -> Iterator[None]:
    """This thread in a fresh namespace `netns` (removed afterwards); threads it starts
    meanwhile (the workers) are born in it."""
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    subprocess.run(["ip", "netns", "add", netns], check=True)
    old = os.open("/proc/self/ns/net", os.O_RDONLY)
    new = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(new)
        yield
    finally:
        _setns(old)
        os.close(old)
        os.close(new)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def veths(ports: list[int], mtu: int, prefix: str = NETNS[:-1]) -> dict[int, tuple[str, str]]:
    """Port -> (switch side, driver side): a veth pair per port, up, no IPv6."""
    out = {}
    for p in ports:
        sw, drv = f"{prefix}{p}s", f"{prefix}{p}h"
        subprocess.run(["ip", "link", "add", sw, "type", "veth", "peer", "name", drv],
                       check=True)
        for dev in (sw, drv):
            Path(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6").write_text("1\n")
            subprocess.run(["ip", "link", "set", dev, "mtu", str(mtu), "up"], check=True)
        out[p] = (sw, drv)
    return out


def collect(socks: dict, want: int) -> list[tuple[int, bytes]]:
    """(port, frame) read from `socks` until `want` came (and EXTRA_WAIT more), or STEP_WAIT."""
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + STEP_WAIT
    extra_until = None
    while True:
        now = time.monotonic()
        if len(got) >= want and extra_until is None:
            extra_until = now + EXTRA_WAIT
        if now > (extra_until or deadline):
            return got
        for port, sock in socks.items():
            try:
                while True:
                    got.append((port, sock.recv(65536)))
            except BlockingIOError:
                pass
        time.sleep(0.0005)
