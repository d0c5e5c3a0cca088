"""The benchmarks' veth pairs: port p is (switch side <prefix>s<p>, driver side <prefix>h<p>),
both up, IPv6 off (no frames of the kernel's own), TX offloads off; what each benchmark sets
beyond that is an argument. Run inside the benchmark's own namespace."""
from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def run_ip(*args: str) -> None:
    """`ip ARGS`; RuntimeError with its stderr when it fails."""
    run = subprocess.run(["ip", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {run.stderr.strip()}")


def make_veths(prefix: str, count: int, mtu: int = 9000, *, gro: bool = False,
               threaded_napi: bool = False) -> dict[int, tuple[str, str]]:
    """Ports 1..count as veth pairs (module doc); `gro`: receive offload on (veth's NAPI),
    `threaded_napi`: each device's NAPI in a kernel thread of its own (its CPU measurable)."""
    out = {}
    for p in range(1, count + 1):
        sw, drv = f"{prefix}s{p}", f"{prefix}h{p}"
        run_ip("link", "add", sw, "type", "veth", "peer", "name", drv)
        for dev in (sw, drv):
            Path(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6").write_text("1\n")
            run_ip("link", "set", dev, "mtu", str(mtu), "up")
            subprocess.run(["ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off",
                            "gro", "on" if gro else "off"], capture_output=True,
                           check=threaded_napi)
            if threaded_napi:
                Path(f"/sys/class/net/{dev}/threaded").write_text("1\n")
        out[p] = (sw, drv)
    return out


def remove_veths(links: dict[int, tuple[str, str]]) -> None:
    for sw, _ in links.values():
        subprocess.run(["ip", "link", "del", sw], capture_output=True)


@contextmanager
def veths(prefix: str, count: int, mtu: int = 9000) -> Iterator[dict[int, tuple[str, str]]]:
    """`make_veths` for a `with` block, removed afterwards."""
    links: dict[int, tuple[str, str]] = {}
    try:
        links = make_veths(prefix, count, mtu)
        yield links
    finally:
        remove_veths(links)
