"""One-armed mode: the switch as an aggregation server with one port, reached by routing.

The hosts route each ring's RC traffic to its successor via this server (docs/switch.md,
"One-armed mode"): a ring frame arrives addressed to the server's MAC with the successor's
IP as destination. The pipeline is unchanged; it sees *neighbour ports*: every host MAC the
registered rings name is given a port number of its own (from 2 up; the physical port is
1), so the pipeline's in-port check becomes a check of the frame's source MAC, and a frame
the pipeline sends "out of neighbour port p" leaves the one physical port addressed to p's
MAC.

Invariants:
- a frame leaves only as a router sends it: destination MAC the next hop's (the neighbour
  port's MAC, or the neighbour of its destination IPv4 address), source MAC the server's,
  TTL one less and the IPv4 header checksum recomputed; nothing else changes, so a RoCEv2
  frame's ICRC (which masks TTL and checksum) stays right;
- a frame with TTL <= 1, not IPv4, or for a destination with no neighbour is dropped and
  counted, never sent back as received (no ICMP is sent: the hosts' RC retries are the
  only ones that see a loss);
- neighbours are the registered rings' hosts (their IP -> MAC, as each rank published
  them) and the static ones given at start; a ring's neighbours go with it. The tables are
  replaced, never mutated, so the data path reads them without a lock.
"""
from __future__ import annotations

import argparse
import ipaddress
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from nr_contract.spec import RingSpec

PHYSICAL_PORT = 1                 # the server's one port
FIRST_NEIGHBOUR_PORT = 2
ETH_LEN = 14
ETHERTYPE_IPV4 = b"\x08\x00"
TTL_OFF = ETH_LEN + 8
CSUM_OFF = ETH_LEN + 10

Buffer = bytes | bytearray | memoryview


def parse_mac(text: str) -> bytes:
    """'02:4e:52:00:00:01' -> 6 bytes; ValueError names the text."""
    parts = text.split(":")
    if len(parts) != 6:
        raise ValueError(f"{text!r} is not a MAC address (six hex bytes, colon-separated)")
    try:
        return bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r} is not a MAC address") from None


def ipv4_checksum(header: Buffer) -> int:
    """RFC 791's header checksum over `header` (its checksum field taken as zero)."""
    words = struct.unpack(f"!{len(header) // 2}H", header)
    total = sum(words) - words[5]
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@dataclass
class RouterCounters:
    routed: int = 0              # frames sent on by routing (results included)
    ttl_expired: int = 0         # TTL <= 1: dropped, as a router does (no ICMP)
    no_route: int = 0            # IPv4 for an address with no neighbour
    not_routable: int = 0        # not IPv4, or a header too short for its IHL
    not_for_router: int = 0      # not addressed to the server's MAC: its kernel's, not routed


class Router:
    """The one-armed server's neighbour table and its frame rewrite (module doc)."""

    def __init__(self, own_mac: str, static: Optional[dict[str, str]] = None) -> None:
        self.own_mac = parse_mac(own_mac)
        self._static = {str(ipaddress.IPv4Address(ip)): parse_mac(mac)
                        for ip, mac in (static or {}).items()}
        self._rings: dict[str, dict[str, bytes]] = {}     # ring id -> its hosts' IP -> MAC
        self._lock = threading.Lock()
        self.counters = RouterCounters()
        self._port_of: dict[bytes, int] = {}              # neighbour MAC -> its port
        self._mac_of: dict[int, bytes] = {}               # port -> neighbour MAC
        self._ip_mac: dict[bytes, bytes] = {}             # packed IPv4 -> MAC
        self._publish()

    @classmethod
    def for_interface(cls, ifname: str, static: Optional[dict[str, str]] = None) -> "Router":
        """The router of the server's port `ifname` (its MAC); ValueError if the interface's
        kernel forwards IPv4 (it would send every routed frame a second time)."""
        try:
            mac = Path(f"/sys/class/net/{ifname}/address").read_text().strip()
            forwarding = Path(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding").read_text().strip()
        except OSError as e:
            raise ValueError(f"one-armed port {ifname}: {e.strerror}") from None
        if forwarding != "0":
            raise ValueError(f"one-armed port {ifname}: the kernel forwards IPv4 on it "
                             f"(net.ipv4.conf.{ifname}.forwarding={forwarding}); it would route "
                             "every ring frame a second time: set it to 0")
        return cls(mac, static)

    # -- control: the rings' hosts -----------------------------------------------------------
    def add_ring(self, spec: RingSpec) -> bool:
        """Learn the ring's hosts; False if this ring is known already (nothing changes: the
        pipeline decides whether the registration is the same). ValueError if a host
        contradicts a known neighbour (the same IP with another MAC): nothing is learned."""
        hosts: dict[str, bytes] = {}
        for c in spec.connections:
            for ip, mac in ((c.src_ip, c.src_mac), (c.dst_ip, c.dst_mac)):
                hosts[ip] = parse_mac(mac)
        with self._lock:
            if spec.ring_id in self._rings:
                return False
            known = self._neighbours()
            clash = sorted(ip for ip, mac in hosts.items() if known.get(ip, mac) != mac)
            if clash:
                raise ValueError(f"ring {spec.ring_id}: host(s) {', '.join(clash)} already "
                                 "have another MAC in this aggregator's neighbour table")
            self._rings = {**self._rings, spec.ring_id: hosts}
            self._publish()
        return True

    def remove_ring(self, ring_id: str) -> None:
        """Forget the ring's hosts (those no other ring or static entry names)."""
        with self._lock:
            self._rings = {r: h for r, h in self._rings.items() if r != ring_id}
            self._publish()

    def port_of_mac(self, mac: str) -> Optional[int]:
        """The neighbour port of a host MAC a registered ring or the static table names."""
        return self._port_of.get(parse_mac(mac))

    def tables(self) -> tuple[dict[int, bytes], dict[bytes, bytes]]:
        """The data path's tables as published: neighbour port -> MAC, packed IPv4 -> MAC
        (what the native data plane's router is given: switch/native/router.h)."""
        with self._lock:
            return self._mac_of, self._ip_mac

    def _neighbours(self) -> dict[str, bytes]:
        out = dict(self._static)
        for hosts in self._rings.values():
            out.update(hosts)
        return out

    def _publish(self) -> None:
        """Rebuild the data path's tables (caller holds the lock, or __init__). A MAC keeps
        its port for as long as any neighbour has it; a new MAC takes the lowest free one."""
        neighbours = self._neighbours()
        macs = set(neighbours.values())
        port_of = {m: p for m, p in self._port_of.items() if m in macs}
        free = (p for p in range(FIRST_NEIGHBOUR_PORT, FIRST_NEIGHBOUR_PORT + len(macs) + 1)
                if p not in port_of.values())
        for mac in sorted(macs - port_of.keys()):
            port_of[mac] = next(free)
        self._ip_mac = {ipaddress.IPv4Address(ip).packed: m for ip, m in neighbours.items()}
        self._mac_of = {p: m for m, p in port_of.items()}
        self._port_of = port_of

    # -- the data path -------------------------------------------------------------------------
    def source_port(self, frame: Buffer) -> int:
        """The neighbour port a received frame comes from (its source MAC's); 0 if the MAC is
        no neighbour's (the pipeline then refuses it as from the wrong port)."""
        return self._port_of.get(bytes(frame[6:12]), 0)

    def for_me(self, frame: Buffer) -> bool:
        """Is the frame addressed to this server's MAC (what a router takes in)?"""
        return bytes(frame[0:6]) == self.own_mac

    def to_neighbour(self, port: int, parts: Sequence[Buffer]) -> Optional[list[Buffer]]:
        """What the pipeline sends out of neighbour port `port`, as a router sends it to
        that neighbour's MAC; None: dropped (counted)."""
        return self._rewrite(self._mac_of.get(port), parts)

    def forward(self, frame: Buffer) -> Optional[list[Buffer]]:
        """A frame for this server that the pipeline did not take, routed to its destination
        IPv4 address's neighbour; None: dropped (counted)."""
        if len(frame) < ETH_LEN + 20:
            self.counters.not_routable += 1
            return None
        return self._rewrite(self._ip_mac.get(bytes(frame[ETH_LEN + 16:ETH_LEN + 20])), [frame])

    def _rewrite(self, dst: Optional[bytes], parts: Sequence[Buffer]) -> Optional[list[Buffer]]:
        first = parts[0]
        if len(first) >= ETH_LEN + 20:
            head, rest = bytearray(first), list(parts[1:])
        else:
            head, rest = bytearray(b"".join(parts)), []
        ihl = (head[ETH_LEN] & 0xF) * 4 if len(head) >= ETH_LEN + 20 else 0
        if ihl < 20 or len(head) < ETH_LEN + ihl or head[12:14] != ETHERTYPE_IPV4 \
                or head[ETH_LEN] >> 4 != 4:
            self.counters.not_routable += 1
            return None
        if dst is None:
            self.counters.no_route += 1
            return None
        if head[TTL_OFF] <= 1:
            self.counters.ttl_expired += 1
            return None
        head[0:6] = dst
        head[6:12] = self.own_mac
        head[TTL_OFF] -= 1
        head[CSUM_OFF:CSUM_OFF + 2] = ipv4_checksum(head[ETH_LEN:ETH_LEN + ihl]).to_bytes(2, "big")
        self.counters.routed += 1
        return [head, *rest]


def one_armed_router(args: argparse.Namespace, ports: dict[int, str]) -> Optional[Router]:
    """netreduce-switch --one-armed's Router (None without it), either target; ValueError
    names what is wrong."""
    if not args.one_armed:
        if args.neighbor:
            raise ValueError("--neighbor needs --one-armed")
        return None
    if args.role != "switch":
        raise ValueError(f"--one-armed: a single aggregation server, not --role {args.role}")
    if list(ports) != [PHYSICAL_PORT]:
        raise ValueError(f"--one-armed: exactly one port, --port {PHYSICAL_PORT}=IFNAME")
    return Router.for_interface(ports[PHYSICAL_PORT], dict(args.neighbor))
