"""One-armed mode (switch/dataplane/router.py): the real switch process with ONE port in its
namespace, every host's frames sent into that port addressed to the server's MAC, as hosts
that route their rings via the server send them.

Oracles are scapy's: each expected frame is the host's frame built by scapy
(tests.roce_layers.write_frame) with the fields a router changes set by hand (destination
MAC the next hop's, source MAC the server's, TTL one less) and its IPv4 checksum and ICRC
recomputed by scapy; the payload of a result is numpy's wrapping sum.
"""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Iterator

import numpy as np
import pytest
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from nr_contract.client import ControllerClient
from tests.hostile.netns import SWITCH_NS, SwitchRig
from tests.roce_layers import (WRITE_ONLY, icrc_ok, lab_ip, lab_mac, make_ring, write_frame,
                               wrapping_sum)

RING = make_ring(3, ring_id="one-armed", qpn_base=0x700)
ACK = 0x11


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SwitchRig]:
    r = SwitchRig(tmp_path_factory.mktemp("one-armed"), ports=1, static_hosts=(),
                  extra_args=["--one-armed"])
    yield r
    r.close()


@pytest.fixture(scope="module")
def server_mac(rig: SwitchRig) -> str:
    out = subprocess.run(["ip", "-n", SWITCH_NS, "-br", "link", "show", "nrxs1"],
                         capture_output=True, text=True, check=True).stdout.split()
    return out[2]


def via(frame: bytes, server_mac: str) -> bytes:
    """A host's frame as it leaves the host routed via the server: to the server's MAC."""
    pkt = Ether(frame)
    pkt[Ether].dst = server_mac
    return raw(pkt)


def routed(frame: bytes, next_hop: str, server_mac: str) -> bytes:
    """The oracle: `frame` as a router sends it on to `next_hop` (scapy recomputes the IPv4
    checksum; the ICRC masks TTL and checksum, so scapy's ICRC of the original stays)."""
    pkt = Ether(frame)
    pkt[Ether].dst, pkt[Ether].src = next_hop, server_mac
    pkt[IP].ttl -= 1
    del pkt[IP].chksum
    return raw(pkt)


def ip_checksum_ok(frame: bytes) -> bool:
    pkt = Ether(frame)
    wire = pkt[IP].chksum
    del pkt[IP].chksum
    return Ether(raw(pkt))[IP].chksum == wire


def from_server(server_mac: str):
    """Frames the server sent (its MAC as their source)."""
    mac = bytes.fromhex(server_mac.replace(":", ""))
    return lambda f: f[6:12] == mac


def test_a_ring_aggregates_through_one_arm(rig: SwitchRig, alice: ControllerClient,
                                           server_mac: str) -> None:
    rig.hosts[1].drain()
    reply = alice.register_ring(RING)
    try:
        assert sorted(reply["ports"].values()) == [2, 3, 4]    # a neighbour port a host
        rng = np.random.default_rng(7)
        payloads = [rng.integers(-2**31, 2**31, RING.mtu // 4, dtype=np.int64)
                    .astype(np.int32) for _ in RING.connections]
        for c, p in zip(RING.connections, payloads):
            rig.hosts[1].send(via(write_frame(c, 0, WRITE_ONLY, p), server_mac))
        got = rig.hosts[1].receive(3, 5.0, from_server(server_mac))
        total = wrapping_sum(payloads)
        want = {routed(write_frame(c, 0, WRITE_ONLY, total), c.dst_mac, server_mac)
                for c in RING.connections}
        assert set(got) == want
        for frame in got:
            assert Ether(frame)[IP].ttl == 63 and icrc_ok(frame) and ip_checksum_ok(frame)
        # the successor's ACK goes back to the requester, routed like any frame
        c = RING.connections[0]
        ack = raw(Ether(src=c.dst_mac, dst=server_mac)
                  / IP(src=c.dst_ip, dst=c.src_ip, flags="DF", ttl=64)
                  / UDP(sport=0xC000, dport=4791, chksum=0)
                  / BTH(opcode=ACK, pkey=0xFFFF, dqpn=c.src_qpn, psn=c.psn0)
                  / AETH(syndrome=0x1F, msn=1))
        rig.hosts[1].send(ack)
        back = rig.hosts[1].receive(1, 5.0, from_server(server_mac))
        assert back == [routed(ack, c.src_mac, server_mac)] and icrc_ok(back[0])
        counters = alice.counters(connections=False)
        assert counters["rings"]["one-armed"]["counters"]["aggregated"] == 3
        assert counters["switch"]["routed"] == 4
    finally:
        alice.unregister_ring("one-armed")


def test_what_a_router_drops_it_drops_and_counts(rig: SwitchRig, alice: ControllerClient,
                                                 server_mac: str) -> None:
    before = alice.counters(connections=False)["switch"]
    c = RING.connections[1]
    frame = Ether(via(write_frame(c, 0, WRITE_ONLY, np.ones(64, np.int32)), server_mac))
    rig.hosts[1].drain()
    rig.hosts[1].send(raw(frame))                  # no ring names its hosts yet: no route
    # its drop counted before the ring (and with it the route) exists: else a busy machine's
    # server may take it from its socket after the registration and route it
    deadline = time.monotonic() + 10
    while alice.counters(connections=False)["switch"]["no_route"] == before["no_route"]:
        assert time.monotonic() < deadline, "the server never counted the unroutable frame"
        time.sleep(0.05)
    alice.register_ring(RING)
    try:
        other = make_ring(3, ring_id="unregistered", qpn_base=0x900).connections[1]
        plain = write_frame(other, 0, WRITE_ONLY, np.ones(64, np.int32))
        rig.hosts[1].send(plain)                   # to the successor's MAC, not the server's
        expired = Ether(via(plain, server_mac))
        expired[IP].ttl = 1                        # routable (a neighbour), but its TTL ends
        del expired[IP].chksum
        rig.hosts[1].send(raw(expired))
        stranger = frame.copy()
        stranger[IP].dst = "10.77.9.9"             # no neighbour has it
        del stranger[IP].chksum
        rig.hosts[1].send(raw(stranger))
        assert rig.hosts[1].receive(1, 1.5, from_server(server_mac)) == []
        after = alice.counters(connections=False)["switch"]
    finally:
        alice.unregister_ring("one-armed")
    assert after["no_route"] - before["no_route"] == 2
    assert after["ttl_expired"] - before["ttl_expired"] == 1
    assert after["not_for_router"] - before["not_for_router"] >= 1
    assert after["routed"] == before["routed"]


def test_a_spoofed_source_mac_is_the_wrong_port(rig: SwitchRig, alice: ControllerClient,
                                                server_mac: str) -> None:
    alice.register_ring(RING)
    try:
        c = RING.connections[0]
        spoofed = Ether(via(write_frame(c, 0, WRITE_ONLY, np.ones(64, np.int32)), server_mac))
        spoofed[Ether].src = lab_mac(2)            # rank 2's MAC on rank 0's frame
        rig.hosts[1].drain()
        rig.hosts[1].send(raw(spoofed))
        assert rig.hosts[1].receive(1, 1.0, from_server(server_mac)) == []
        ring = alice.counters("one-armed")["rings"]["one-armed"]
        assert ring["counters"]["drop_wrong_port"] == 1
    finally:
        alice.unregister_ring("one-armed")


@pytest.mark.parametrize("args, message", [
    (["--port", "1=a", "--port", "2=b"], "exactly one port"),
    (["--port", "2=a"], "exactly one port"),
    (["--port", "1=nrx-no-such-if"], "one-armed port nrx-no-such-if"),
])
def test_one_armed_command_line_errors(args: list[str], message: str) -> None:
    p = subprocess.run([sys.executable, "-m", "switch", "--one-armed", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_neighbor_needs_one_armed() -> None:
    p = subprocess.run([sys.executable, "-m", "switch", "--port", "1=lo", "--neighbor",
                        f"{lab_ip(0)}={lab_mac(0)}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--neighbor needs --one-armed" in p.stderr, p.stderr
