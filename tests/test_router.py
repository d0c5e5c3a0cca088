"""switch/dataplane/router.py without sockets: the neighbour table a one-armed server keeps
and the rewrite of a frame it routes (scapy builds and checks every frame)."""
from __future__ import annotations

import pytest
from scapy.compat import raw
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from switch.dataplane.router import Router
from tests.roce_layers import lab_ip, lab_mac, make_ring

SERVER = "02:4e:52:aa:00:01"


def test_each_host_mac_gets_a_neighbour_port_that_outlives_other_rings() -> None:
    router = Router(SERVER)
    assert router.add_ring(make_ring(3, ring_id="a")) is True
    ports = {h: router.port_of_mac(lab_mac(h)) for h in range(3)}
    assert sorted(ports.values()) == [2, 3, 4]
    assert router.add_ring(make_ring(3, ring_id="a")) is False       # known: nothing changes
    router.add_ring(make_ring(2, ring_id="b", hosts=[2, 5]))
    router.remove_ring("a")
    assert router.port_of_mac(lab_mac(2)) == ports[2]                # still b's host
    assert router.port_of_mac(lab_mac(0)) is None                    # gone with ring a
    assert router.port_of_mac(lab_mac(5)) not in (None, ports[2])


def test_a_host_with_another_mac_is_refused_and_nothing_is_learned() -> None:
    router = Router(SERVER, static={lab_ip(1): "02:00:00:00:00:99"})
    with pytest.raises(ValueError, match=r"ring a: host\(s\) 10\.77\.0\.2 already have another "
                                         "MAC"):
        router.add_ring(make_ring(3, ring_id="a"))
    assert router.port_of_mac(lab_mac(0)) is None


def frame(ttl: int = 64, dst_ip: str = "10.77.0.2") -> bytes:
    return raw(Ether(src=lab_mac(0), dst=SERVER) / IP(src=lab_ip(0), dst=dst_ip, ttl=ttl)
               / UDP(sport=1, dport=9) / (b"x" * 30))


def test_forward_rewrites_what_a_router_rewrites_and_nothing_else() -> None:
    router = Router(SERVER, static={"10.77.0.2": lab_mac(1)})
    out = router.forward(frame())
    want = Ether(frame())
    want[Ether].dst, want[Ether].src = lab_mac(1), SERVER
    want[IP].ttl = 63
    del want[IP].chksum
    assert out is not None and b"".join(out) == raw(want)
    assert router.counters.routed == 1


@pytest.mark.parametrize("bad, counter", [
    (frame(ttl=1), "ttl_expired"),
    (frame(dst_ip="10.77.0.9"), "no_route"),
    (raw(Ether(src=lab_mac(0), dst=SERVER) / ARP()), "not_routable"),
    (frame()[:30], "not_routable"),
])
def test_what_cannot_be_routed_is_dropped_and_counted(bad: bytes, counter: str) -> None:
    router = Router(SERVER, static={"10.77.0.2": lab_mac(1)})
    assert router.forward(bad) is None
    assert getattr(router.counters, counter) == 1 and router.counters.routed == 0


def test_a_header_split_across_parts_is_joined_first() -> None:
    router = Router(SERVER)
    router.add_ring(make_ring(2, ring_id="a"))
    f = frame()
    out = router.to_neighbour(router.port_of_mac(lab_mac(1)), [f[:20], f[20:]])
    assert out is not None and Ether(b"".join(out))[Ether].dst == lab_mac(1)
    assert router.to_neighbour(99, [f]) is None and router.counters.no_route == 1
