"""DataPlane's MAC-table and fault rules, frame by frame (`_handle` called directly on a
DataPlane whose ports are a veth pair in namespace nrxdpW; its loop does not run)."""
from __future__ import annotations

import logging
import subprocess
from typing import Iterator

import pytest

from switch.dataplane.ports import DataPlane
from tests.hostile.netns import WORKER, in_netns, require_netns, run_ip
from tests.roce_layers import WRITE_ONLY, lab_mac, make_ring, write_frame

NS = f"nrxdp{WORKER}"


@pytest.fixture
def dataplane() -> Iterator[DataPlane]:
    require_netns()
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    run_ip("netns", "add", NS)
    try:
        run_ip("-n", NS, "link", "add", "nrxd1", "type", "veth", "peer", "name", "nrxd2")
        for dev in ("nrxd1", "nrxd2"):
            run_ip("-n", NS, "link", "set", dev, "up")
        dp = in_netns(NS, lambda: DataPlane({1: "nrxd1", 2: "nrxd2"},
                                             static_macs={lab_mac(0): 1},
                                             mac_table_size=2, mac_ageing=10.0))
        try:
            yield dp
        finally:
            dp.close()
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def frame_from(mac: str) -> memoryview:
    return memoryview(bytes.fromhex("ffffffffffff" + mac.replace(":", "")) + b"\x88\xb5"
                      + bytes(46))


def handle(dp: DataPlane, frame: memoryview, port: int) -> None:
    dp._handle(frame, dp.ports[port])


def test_static_entries_never_move(dataplane: DataPlane) -> None:
    handle(dataplane, frame_from(lab_mac(0)), 2)
    assert dataplane.mac_table_view()[lab_mac(0)] == 1
    assert dataplane.static_port_of_mac(lab_mac(0)) == 1
    assert dataplane.switch_counters()["mac_learn_refused"] == 1
    handle(dataplane, frame_from(lab_mac(0)), 1)                # on its own port: fine
    assert dataplane.switch_counters()["mac_learn_refused"] == 1


def test_learning_is_capped_and_ages(dataplane: DataPlane) -> None:
    for h in (1, 2, 3):
        handle(dataplane, frame_from(lab_mac(h)), 2)
    assert dataplane.switch_counters() == {"mac_learn_refused": 1, "mac_aged_out": 0,
                                           "pipeline_errors": 0, "mac_table_learned": 2}
    assert lab_mac(3) not in dataplane.mac_table_view()
    assert dataplane.static_port_of_mac(lab_mac(1)) is None     # learned is not static
    handle(dataplane, frame_from(lab_mac(1)), 1)                # a learned MAC may move
    assert dataplane.mac_table_view()[lab_mac(1)] == 1
    dataplane._tick += 5.0
    handle(dataplane, frame_from(lab_mac(1)), 1)                # seen again: stays young
    dataplane._tick += 6.0
    dataplane._age()
    view = dataplane.mac_table_view()
    assert lab_mac(1) in view and lab_mac(2) not in view and lab_mac(0) in view
    assert dataplane.switch_counters()["mac_aged_out"] == 1
    handle(dataplane, frame_from(lab_mac(3)), 2)                # room again
    assert dataplane.mac_table_view()[lab_mac(3)] == 2


class Raising:
    def process(self, frame: memoryview, in_port: int, emit: object) -> bool:
        raise ZeroDivisionError("boom")


def test_a_raising_pipeline_drops_counts_and_logs_once(dataplane: DataPlane,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    spec = make_ring(2)
    dataplane.pipeline = Raising()
    dataplane.describe_connection = lambda key: "ring 'r' rank 0"
    frame = memoryview(write_frame(spec.connections[0], 0, WRITE_ONLY, bytes(256)))
    with caplog.at_level(logging.ERROR, logger="switch.dataplane.ports"):
        for _ in range(3):
            handle(dataplane, frame, 1)
    assert dataplane.switch_counters()["pipeline_errors"] == 3
    assert dataplane.ports[1].counters.roce_packets == 3
    assert dataplane.ports[2].counters.tx_packets == 0              # dropped, not forwarded
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        f"pipeline error on connection 10.77.0.1 -> 10.77.0.2 DestQP "
        f"{spec.connections[0].dst_qpn} (ring 'r' rank 0) from port 1: ZeroDivisionError: boom"]
    handle(dataplane, frame_from(lab_mac(1)), 1)                    # plain frames still go
    assert dataplane.ports[2].counters.tx_packets == 1


def test_ip_options_are_not_rocev2(dataplane: DataPlane) -> None:
    frame = bytearray(write_frame(make_ring(2).connections[0], 0, WRITE_ONLY, bytes(256)))
    frame[14] = 0x46                                                # IHL 6
    handle(dataplane, memoryview(bytes(frame)), 1)
    assert dataplane.ports[1].counters.roce_packets == 0
