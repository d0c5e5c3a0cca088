"""Finding this rank's rxe device and RoCEv2 GID, against a fake sysfs tree shaped like rxe's."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ring_setup.device import (DeviceError, RoceGid, find_roce_gid, hw_counters, ipv4_gid,
                               netdev_mac, roce_ipv4_in, source_ipv4_towards)

LINK_LOCAL = "fe80:0000:0000:0000:004e:52ff:fe00:0001"


def add_rxe(sysfs: Path, dev: str, ip: str, netdev: str = "nr0") -> None:
    """An rxe device the way the kernel shows it: link-local and IPv4 GIDs, each as RoCE v1
    and RoCE v2 (index 2 = IPv4 v1, index 3 = IPv4 v2), unused slots unreadable."""
    port = sysfs / "class" / "infiniband" / dev / "ports" / "1"
    entries = [(LINK_LOCAL, "IB/RoCE v1"), (LINK_LOCAL, "RoCE v2"),
               (ipv4_gid(ip), "IB/RoCE v1"), (ipv4_gid(ip), "RoCE v2"), (None, None)]
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs", "hw_counters"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    for i, (gid, kind) in enumerate(entries):
        if gid is None:
            (port / "gids" / str(i)).mkdir()     # reading it fails, like EINVAL on an empty slot
            continue
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
        (port / "gid_attrs" / "ndevs" / str(i)).write_text(netdev + "\n")
    (port / "hw_counters" / "sent_pkts").write_text("12\n")
    (port / "hw_counters" / "rcvd_pkts").write_text("34\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    add_rxe(tmp_path, "rxe0", "10.77.0.1")
    add_rxe(tmp_path, "rxe1", "10.77.0.2")
    net = tmp_path / "class" / "net" / "nr0"
    net.mkdir(parents=True)
    (net / "address").write_text("02:4e:52:00:00:02\n")
    return tmp_path


def test_ipv4_gid_notation() -> None:
    assert ipv4_gid("10.77.0.1") == "0000:0000:0000:0000:0000:ffff:0a4d:0001"
    assert ipv4_gid("192.168.255.3") == "0000:0000:0000:0000:0000:ffff:c0a8:ff03"


def test_the_device_holding_the_address_as_rocev2_gid_is_found(sysfs: Path) -> None:
    assert find_roce_gid("10.77.0.2", sysfs=sysfs) == RoceGid(
        "rxe1", 1, 3, "0000:0000:0000:0000:0000:ffff:0a4d:0002", "nr0")
    assert find_roce_gid("10.77.0.2", device="rxe1", sysfs=sysfs).index == 3


def test_explicit_device_without_the_address_is_an_error(sysfs: Path) -> None:
    with pytest.raises(DeviceError, match="no RoCEv2 GID for 10.77.0.2 on device rxe0"):
        find_roce_gid("10.77.0.2", device="rxe0", sysfs=sysfs)
    with pytest.raises(DeviceError, match=r"'rxe7' not found \(devices: rxe0, rxe1\)"):
        find_roce_gid("10.77.0.2", device="rxe7", sysfs=sysfs)


def test_unknown_address_and_no_devices(sysfs: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(DeviceError, match="no RoCEv2 GID for 10.77.0.9 on devices rxe0, rxe1"):
        find_roce_gid("10.77.0.9", sysfs=sysfs)
    with pytest.raises(DeviceError, match="no RDMA devices .* run inside the lab"):
        find_roce_gid("10.77.0.1", sysfs=tmp_path_factory.mktemp("empty"))


def test_counters_and_mac(sysfs: Path) -> None:
    assert hw_counters("rxe1", sysfs=sysfs) == {"rcvd_pkts": 34, "sent_pkts": 12}
    assert netdev_mac("nr0", sysfs=sysfs) == "02:4e:52:00:00:02"
    with pytest.raises(DeviceError, match="no MAC address for netdev eth9"):
        netdev_mac("eth9", sysfs=sysfs)


def test_counters_in_a_namespace_come_from_rdma_statistic(
        sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside the initial netns sysfs has no hw_counters; `rdma -j statistic` answers."""
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, json.dumps(
            [{"ifname": "rxe9", "port": 1, "sent_pkts": 5, "rcvd_rnr_err": 0}]), "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert hw_counters("rxe9", sysfs=sysfs) == {"sent_pkts": 5, "rcvd_rnr_err": 0}
    assert calls == [["rdma", "-j", "statistic", "show", "link", "rxe9/1"]]
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 255, "", "Failed to open NETLINK_RDMA socket"))
    assert hw_counters("rxe9", sysfs=sysfs) == {}


def test_source_address_towards_localhost() -> None:
    assert source_ipv4_towards("127.0.0.1") == "127.0.0.1"


def test_a_rings_network_names_the_devices_one_address_in_it(sysfs: Path) -> None:
    gids = sysfs / "class" / "infiniband" / "rxe0" / "ports" / "1"
    for i, kind in ((5, "IB/RoCE v1"), (6, "RoCE v2")):      # a second address, 10.78.0.1
        (gids / "gids" / str(i)).write_text(ipv4_gid("10.78.0.1") + "\n")
        (gids / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
    assert roce_ipv4_in("10.78.0.0/24", "rxe0", sysfs) == "10.78.0.1"
    assert roce_ipv4_in("10.77.0.0/16", "rxe0", sysfs) == "10.77.0.1"
    with pytest.raises(DeviceError, match=r"rxe1 holds no RoCEv2 address\(es\) in 10\.78\.0\.0/24"):
        roce_ipv4_in("10.78.0.0/24", "rxe1", sysfs)
    with pytest.raises(DeviceError, match=r"rxe0 holds 2 RoCEv2 address\(es\) in 10\.0\.0\.0/8: "
                                          r"10\.77\.0\.1, 10\.78\.0\.1"):
        roce_ipv4_in("10.0.0.0/8", "rxe0", sysfs)
