"""Finding this rank's rxe device and RoCEv2 GID from sysfs (no verbs needed, so tested
against a fake sysfs tree).

RDMA devices are visible from every network namespace, so "my device" is the one whose GID
table holds my netdev's IPv4 address as a RoCEv2 GID (::ffff:a.b.c.d, type "RoCE v2").
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYSFS = Path("/sys")
ROCE_V2 = "RoCE v2"


class DeviceError(RuntimeError):
    """No usable RDMA device / GID / netdev for this rank."""


@dataclass(frozen=True)
class RoceGid:
    """A RoCEv2 GID of an rxe device that maps an IPv4 address of `netdev`."""

    device: str
    port: int
    index: int
    gid: str       # sysfs notation, e.g. 0000:0000:0000:0000:0000:ffff:0a4d:0001
    netdev: str


IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"     # an IPv4-mapped GID's first 96 bits


def ipv4_gid(ip: str) -> str:
    """The IPv4-mapped GID of `ip` in sysfs notation."""
    b = ipaddress.IPv4Address(ip).packed
    return f"{IPV4_MAPPED}{b[0]:02x}{b[1]:02x}:{b[2]:02x}{b[3]:02x}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:          # empty GID slots answer EINVAL
        return None


def rdma_devices(sysfs: Path = SYSFS) -> list[str]:
    base = sysfs / "class" / "infiniband"
    return sorted(p.name for p in base.iterdir()) if base.is_dir() else []


def find_roce_gid(ip: str, device: str | None = None, sysfs: Path = SYSFS) -> RoceGid:
    """The RoCEv2 GID mapping `ip`, on `device` if given, else on whichever device has it."""
    devices = rdma_devices(sysfs)
    if not devices:
        raise DeviceError(f"no RDMA devices under {sysfs}/class/infiniband: is rdma_rxe loaded "
                          f"and an rxe device added (scripts/setup_rxe.sh)? This machine's own "
                          f"kernel has none: run inside the lab (scripts/lab.sh)")
    if device is not None and device not in devices:
        raise DeviceError(f"RDMA device {device!r} not found (devices: {', '.join(devices)})")
    want = ipv4_gid(ip)
    for dev in [device] if device is not None else devices:
        ports = sysfs / "class" / "infiniband" / dev / "ports"
        for port_dir in sorted(ports.iterdir(), key=lambda p: int(p.name)):
            gids = port_dir / "gids"
            for gid_file in sorted(gids.iterdir(), key=lambda p: int(p.name)):
                if _read(gid_file) != want:
                    continue
                idx = gid_file.name
                if _read(port_dir / "gid_attrs" / "types" / idx) != ROCE_V2:
                    continue
                netdev = _read(port_dir / "gid_attrs" / "ndevs" / idx) or netdev_of_ipv4(ip)
                return RoceGid(dev, int(port_dir.name), int(idx), want, netdev)
    where = f"device {device}" if device is not None else f"devices {', '.join(devices)}"
    raise DeviceError(f"no RoCEv2 GID for {ip} on {where}: is the rxe device bound to the "
                      f"netdev holding {ip}?")


def roce_ipv4_in(network: str, device: str, sysfs: Path = SYSFS) -> str:
    """The one IPv4 address in `network` (e.g. '10.78.0.0/24') that `device` holds as a
    RoCEv2 GID: how every rank names its own address of a ring with one setting.
    DeviceError if it holds none or several (named)."""
    net = ipaddress.IPv4Network(network, strict=False)
    found = set()
    for port_dir in (sysfs / "class" / "infiniband" / device / "ports").iterdir():
        for gid_file in (port_dir / "gids").iterdir():
            gid = _read(gid_file)
            if gid is None or not gid.startswith(IPV4_MAPPED) or \
                    _read(port_dir / "gid_attrs" / "types" / gid_file.name) != ROCE_V2:
                continue
            ip = ipaddress.IPv4Address(bytes.fromhex(gid[len(IPV4_MAPPED):].replace(":", "")))
            if ip in net:
                found.add(str(ip))
    if len(found) != 1:
        raise DeviceError(f"{device} holds {'no' if not found else len(found)} RoCEv2 "
                          f"address(es) in {net}{': ' + ', '.join(sorted(found)) if found else ''}"
                          " (give the ring's address itself)")
    return found.pop()


def netdev_of_ipv4(ip: str) -> str:
    """The network interface (in this namespace) holding IPv4 address `ip`."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                res = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(res[20:24]) == ip:
                return name
    raise DeviceError(f"no network interface in this namespace holds {ip}")


def netdev_mac(netdev: str, sysfs: Path = SYSFS) -> str:
    mac = _read(sysfs / "class" / "net" / netdev / "address")
    if mac is None:
        raise DeviceError(f"no MAC address for netdev {netdev} ({sysfs}/class/net/{netdev})")
    return mac


def netdev_mtu(netdev: str, sysfs: Path = SYSFS) -> int | None:
    mtu = _read(sysfs / "class" / "net" / netdev / "mtu")
    return int(mtu) if mtu is not None else None


def source_ipv4_towards(addr: str) -> str:
    """The IPv4 address this host would send from to reach `addr` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((addr, 9))
        except OSError as exc:
            raise DeviceError(f"no route from this host to {addr}: {exc}") from exc
        return str(s.getsockname()[0])


def hw_counters(device: str, port: int = 1, sysfs: Path = SYSFS) -> dict[str, int]:
    """The device port's hw_counters (sent_pkts, rcvd_pkts, retry_exceeded_err, ...): from
    sysfs, or, in a network namespace other than the initial one (where the kernel leaves
    hw_counters out of sysfs), from `rdma statistic` over netlink. {} if neither answers."""
    base = sysfs / "class" / "infiniband" / device / "ports" / str(port) / "hw_counters"
    if not base.is_dir():
        return _rdma_statistic(device, port)
    counters: dict[str, int] = {}
    for f in sorted(base.iterdir()):
        value = _read(f)
        if value is not None and value.lstrip("-").isdigit():
            counters[f.name] = int(value)
    return counters


def _rdma_statistic(device: str, port: int) -> dict[str, int]:
    try:
        done = subprocess.run(["rdma", "-j", "statistic", "show", "link", f"{device}/{port}"],
                              capture_output=True, text=True, timeout=5)
        rows = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}
    counters: dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, int) and key not in ("port", "ifindex"):
                counters[key] = value
    return counters
