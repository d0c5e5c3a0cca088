"""The software switch's data plane: ports, L2 forwarding, port counters, the main loop.

Every frame received on a port is first offered to the aggregation pipeline (if one is
installed); whatever the pipeline does not consume is forwarded by L2 exactly as received.
Invariants:
- a frame never leaves by the port it arrived on (no reflection, no loops on one port);
- the receive buffer is reused for the next frame as soon as `_handle` returns, so the
  pipeline and `emit` must copy what they keep;
- counters only grow; they are read without locking (plain ints, written by one thread).
"""
from __future__ import annotations

import dataclasses
import select
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Protocol, Sequence

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
PACKET_STATISTICS = 6          # struct tpacket_stats {u32 tp_packets, tp_drops}; read resets
ROCEV2_UDP_PORT = 4791
BATCH = 64            # frames drained from one port before looking at the others
SOCKET_BUFFER = 8 << 20
FRAME_BUFFER = 65536


Buffer = bytes | bytearray | memoryview


class Emit(Protocol):
    def __call__(self, port: int, parts: Sequence[Buffer]) -> None: ...


class Pipeline(Protocol):
    """The hook the aggregation pipeline implements (see docs/pipeline.md)."""

    def process(self, frame: memoryview, in_port: int, emit: Emit) -> bool:
        """True: consumed (aggregated, answered or dropped). False: forward unchanged."""
        ...


@dataclass
class PortCounters:
    rx_packets: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    tx_bytes: int = 0
    roce_packets: int = 0      # RoCEv2 frames received (IPv4, UDP dport 4791)
    flooded: int = 0           # frames received here that were flooded (unknown/broadcast dst)
    tx_errors: int = 0         # frames the kernel refused to send on this port (dropped)
    rx_dropped: int = 0        # frames the kernel dropped before the switch read them (queue full)


@dataclass
class Port:
    number: int
    ifname: str
    sock: socket.socket
    counters: PortCounters = field(default_factory=PortCounters)


def open_port(number: int, ifname: str) -> Port:
    """A raw socket on `ifname` that sees every frame arriving there, none of its own."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.bind((ifname, ETH_P_ALL))
    sock.setblocking(False)
    return Port(number, ifname, sock)


def is_rocev2(frame: memoryview) -> bool:
    """IPv4 (no options), UDP, destination port 4791."""
    return (len(frame) >= 42 and frame[12] == 0x08 and frame[13] == 0x00
            and frame[23] == 17 and frame[36] == 0x12 and frame[37] == 0xB7)


def format_mac(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


def parse_mac(text: str) -> bytes:
    mac = bytes(int(x, 16) for x in text.split(":"))
    if len(mac) != 6:
        raise ValueError(f"not a MAC address: {text!r}")
    return mac


class DataPlane:
    """Ports, a MAC table (learned, or configured with `static_macs`), the forwarding loop."""

    def __init__(self, ports: dict[int, str], static_macs: dict[str, int] | None = None,
                 pipeline: Pipeline | None = None) -> None:
        if not ports:
            raise ValueError("a switch needs at least one port")
        self.ports: dict[int, Port] = {n: open_port(n, ifname) for n, ifname in sorted(ports.items())}
        self._by_fd = {p.sock.fileno(): p for p in self.ports.values()}
        self.mac_table: dict[bytes, int] = {}
        self._static: set[bytes] = set()
        for mac, port in (static_macs or {}).items():
            if port not in self.ports:
                raise ValueError(f"static MAC {mac} on unknown port {port}")
            self.mac_table[parse_mac(mac)] = port
            self._static.add(parse_mac(mac))
        self.pipeline = pipeline
        self._stop = threading.Event()

    # -- lookups the controller uses -------------------------------------------------------
    def port_of_mac(self, mac: str) -> int | None:
        return self.mac_table.get(parse_mac(mac))

    def port_counters(self) -> dict[str, dict[str, int | str]]:
        for p in self.ports.values():
            _, drops = struct.unpack("II", p.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
            p.counters.rx_dropped += drops
        return {str(n): {"ifname": p.ifname, **dataclasses.asdict(p.counters)}
                for n, p in self.ports.items()}

    def mac_table_view(self) -> dict[str, int]:
        return {format_mac(m): p for m, p in self.mac_table.items()}

    # -- the data path ---------------------------------------------------------------------
    def emit(self, port: int, parts: Sequence[Buffer]) -> None:
        """Send one frame made of `parts` out of `port` (used by the pipeline)."""
        p = self.ports[port]
        try:
            n = p.sock.sendmsg(parts)
        except OSError:
            p.counters.tx_errors += 1
            return
        p.counters.tx_packets += 1
        p.counters.tx_bytes += n

    def _send(self, p: Port, frame: memoryview) -> None:
        try:
            p.sock.send(frame)
        except OSError:
            p.counters.tx_errors += 1
            return
        p.counters.tx_packets += 1
        p.counters.tx_bytes += len(frame)

    def _handle(self, frame: memoryview, port: Port) -> None:
        c = port.counters
        c.rx_packets += 1
        c.rx_bytes += len(frame)
        if len(frame) < 14:
            return
        src = frame[6:12].tobytes()
        if src not in self._static and not frame[6] & 1 and self.mac_table.get(src) != port.number:
            self.mac_table[src] = port.number
        if is_rocev2(frame):
            c.roce_packets += 1
            if self.pipeline is not None and self.pipeline.process(frame, port.number, self.emit):
                return
        out = None if frame[0] & 1 else self.mac_table.get(frame[0:6].tobytes())
        if out is None:
            c.flooded += 1
            for p in self.ports.values():
                if p is not port:
                    self._send(p, frame)
        elif out != port.number:
            self._send(self.ports[out], frame)

    def run(self) -> None:
        """Forward until `stop()`; drains up to BATCH frames per ready port per round."""
        ep = select.epoll()
        for fd in self._by_fd:
            ep.register(fd, select.EPOLLIN)
        buf = bytearray(FRAME_BUFFER)
        view = memoryview(buf)
        try:
            while not self._stop.is_set():
                for fd, _ in ep.poll(0.2):
                    port = self._by_fd[fd]
                    recv_into = port.sock.recv_into
                    for _ in range(BATCH):
                        try:
                            n = recv_into(buf)
                        except BlockingIOError:
                            break
                        self._handle(view[:n], port)
        finally:
            ep.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        for p in self.ports.values():
            p.sock.close()


def format_port_table(counters: dict[str, dict[str, int | str]]) -> str:
    """Per-port counters as an aligned text table (what the switch prints on exit)."""
    cols = ["ifname", *[f.name for f in dataclasses.fields(PortCounters)]]
    rows = [["port", *cols]] + [[n, *(str(v.get(k, "-")) for k in cols)]  # "-": not kept (BMv2)
                                for n, v in counters.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in rows)
