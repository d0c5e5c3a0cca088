"""The software switch's data plane: ports, L2 forwarding, port counters, the main loop.

Every RoCEv2 frame (UDP 4791) and inter-switch frame of a two-tier fabric (UDP 4792,
docs/multirack.md) received on a port is first offered to the pipeline (if one is
installed: the single switch's, a ToR's or the spine's); whatever the pipeline does not consume is forwarded by L2 exactly as received.
Invariants:
- a frame never leaves by the port it arrived on (no reflection, no loops on one port),
  except in one-armed mode (`router`: switch/dataplane/router.py), where the one port
  takes in only frames addressed to the server's MAC and sends them on routed;
- static MAC entries (`--mac`) never move; learning fills at most `mac_table_size` other
  entries, which age out after `mac_ageing` s unseen; a frame whose source MAC cannot be
  learned (a static MAC seen on another port, or the table full) counts `mac_learn_refused`;
- an exception in the pipeline drops that one frame and counts `pipeline_errors` (logged
  once per connection); forwarding and every other connection go on;
- the receive buffer is reused for the next frame as soon as `_handle` returns, so the
  pipeline and `emit` must copy what they keep;
- a port given a tx loss (`tx_loss`, a test's stand-in for netem where the kernel has
  none) loses that fraction of the frames sent on it, counted as `tx_lost`;
- counters only grow; they are read without locking (plain ints, written by one thread).
"""
from __future__ import annotations

import dataclasses
import logging
import random
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from nr_contract.spec import PSN_MASK
from switch.dataplane.interswitch import is_interswitch
from switch.dataplane.packets import parse
from switch.dataplane.router import PHYSICAL_PORT, Router, parse_mac

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
PACKET_STATISTICS = 6          # struct tpacket_stats {u32 tp_packets, tp_drops}; read resets
BATCH = 64            # frames drained from one port before looking at the others
SOCKET_BUFFER = 8 << 20
FRAME_BUFFER = 65536
DEFAULT_MAC_TABLE_SIZE = 4096   # learned entries (static ones are not counted)
DEFAULT_MAC_AGEING = 300.0      # s a learned entry lives unseen
AGEING_SWEEP = 1.0              # s between sweeps of the learned entries
MAX_LOGGED_FAULTS = 1024        # connections whose first pipeline error is logged
INTERSWITCH_KEY = -1            # the "connection" of inter-switch messages in the error log
log = logging.getLogger(__name__)


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
    interswitch_packets: int = 0   # a fabric's partials/totals received (IPv4, UDP dport 4792)
    flooded: int = 0           # frames received here that were flooded (unknown/broadcast dst)
    tx_errors: int = 0         # frames the kernel refused to send on this port (dropped)
    rx_dropped: int = 0        # frames the kernel dropped before the switch read them (queue full)
    tx_lost: int = 0           # frames deliberately lost on this port (--tx-loss, for tests)


@dataclass
class Port:
    number: int
    ifname: str
    sock: socket.socket
    counters: PortCounters = field(default_factory=PortCounters)
    loss: float = 0.0          # probability that a frame sent here is lost (--tx-loss)


def open_port(number: int, ifname: str) -> Port:
    """A raw socket on `ifname` that sees every frame arriving there, none of its own, and
    never a frame of another interface: it is opened for no protocol and receives only once
    bound to `ifname` (opened for ETH_P_ALL, it would queue every interface's frames until
    the bind)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.bind((ifname, ETH_P_ALL))
    sock.setblocking(False)
    return Port(number, ifname, sock)


@dataclass
class SwitchCounters:
    mac_learn_refused: int = 0   # source MACs not learned: static elsewhere, or table full
    mac_aged_out: int = 0        # learned entries removed after mac_ageing s unseen
    pipeline_errors: int = 0     # frames dropped because the pipeline raised on them


def describe_key(key: int) -> str:
    """'10.0.0.1 -> 10.0.0.2 DestQP 17' of a `packets.conn_key`."""
    addrs = key >> 24
    return (f"{socket.inet_ntoa((addrs >> 32).to_bytes(4, 'big'))} -> "
            f"{socket.inet_ntoa((addrs & 0xFFFFFFFF).to_bytes(4, 'big'))} "
            f"DestQP {key & PSN_MASK}")


def format_mac(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)



class DataPlane:
    """Ports, a MAC table (static `static_macs` plus bounded learning), the forwarding loop.

    `describe_connection(key)` (optional) names the ring and rank of a connection key for
    the pipeline-error log.
    """

    def __init__(self, ports: dict[int, str], static_macs: dict[str, int] | None = None,
                 pipeline: Pipeline | None = None, *,
                 mac_table_size: int = DEFAULT_MAC_TABLE_SIZE,
                 mac_ageing: float = DEFAULT_MAC_AGEING,
                 describe_connection: Callable[[int], Optional[str]] | None = None,
                 tx_loss: dict[int, float] | None = None,
                 router: Router | None = None) -> None:
        if not ports:
            raise ValueError("a switch needs at least one port")
        if router is not None and (list(ports) != [PHYSICAL_PORT] or static_macs):
            raise ValueError(f"one-armed mode: exactly one port, numbered {PHYSICAL_PORT}, and "
                             "no static MACs (the neighbours are the registered rings' hosts)")
        if mac_table_size < 0 or mac_ageing <= 0:
            raise ValueError(f"MAC table size {mac_table_size} / ageing {mac_ageing} s")
        static = {parse_mac(mac): port for mac, port in (static_macs or {}).items()}
        for mac, port in static.items():
            if port not in ports:
                raise ValueError(f"static MAC {format_mac(mac)} on unknown port {port}")
        for port, loss in (tx_loss or {}).items():
            if port not in ports or not 0 <= loss < 1:
                raise ValueError(f"tx loss {loss} on port {port}: need a port of the switch "
                                 "and 0 <= loss < 1")
        self.ports: dict[int, Port] = {n: open_port(n, ifname) for n, ifname in sorted(ports.items())}
        for port, loss in (tx_loss or {}).items():
            self.ports[port].loss = loss
        self._random = random.Random(0x4E52)     # --tx-loss draws: reproducible per run
        self._by_fd = {p.sock.fileno(): p for p in self.ports.values()}
        self.mac_table: dict[bytes, int] = dict(static)   # what forwarding looks up
        self._static = static
        self._seen: dict[bytes, float] = {}               # learned MAC -> tick last seen
        self.mac_table_size = mac_table_size
        self.mac_ageing = mac_ageing
        self._tick = time.monotonic()
        self._next_sweep = self._tick + AGEING_SWEEP
        self.counters = SwitchCounters()
        self._faulty: set[int] = set()                    # connection keys logged as faulty
        self.describe_connection = describe_connection
        self.pipeline = pipeline
        self.router = router
        self._stop = threading.Event()

    # -- lookups the controller uses -------------------------------------------------------
    def static_port_of_mac(self, mac: str) -> int | None:
        """The port of `mac` in the static port map (never a learned entry)."""
        return self._static.get(parse_mac(mac))

    def switch_counters(self) -> dict[str, int]:
        routed = dataclasses.asdict(self.router.counters) if self.router is not None else {}
        return {**dataclasses.asdict(self.counters), "mac_table_learned": len(self._seen),
                **routed}

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
        if p.loss and self._random.random() < p.loss:
            p.counters.tx_lost += 1
            return
        try:
            n = p.sock.sendmsg(parts)
        except OSError:
            p.counters.tx_errors += 1
            return
        p.counters.tx_packets += 1
        p.counters.tx_bytes += n

    def _send(self, p: Port, frame: memoryview) -> None:
        if p.loss and self._random.random() < p.loss:
            p.counters.tx_lost += 1
            return
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
        if self.router is not None:
            self._handle_routed(frame, port)
            return
        src = frame[6:12].tobytes()
        if src in self._seen:                      # a learned MAC: refresh (it may move)
            self._seen[src] = self._tick
            self.mac_table[src] = port.number
        elif not frame[6] & 1 and self._static.get(src) != port.number:
            self._learn_new(src, port.number)
        fields = parse(frame)
        interswitch = fields is None and is_interswitch(frame)   # a partial or a total
        if fields is not None:
            c.roce_packets += 1
        elif interswitch:
            c.interswitch_packets += 1
        if (fields is not None or interswitch) and self.pipeline is not None:
            try:
                if self.pipeline.process(frame, port.number, self.emit):
                    return
            except Exception as e:  # noqa: BLE001 - one frame's fault stays that frame's
                self._pipeline_failed(fields[0] if fields else INTERSWITCH_KEY, port.number, e)
                return
        out = None if frame[0] & 1 else self.mac_table.get(frame[0:6].tobytes())
        if out is None:
            c.flooded += 1
            for p in self.ports.values():
                if p is not port:
                    self._send(p, frame)
        elif out != port.number:
            self._send(self.ports[out], frame)

    def _handle_routed(self, frame: memoryview, port: Port) -> None:
        """One-armed mode: a frame for this server goes to the pipeline from its source MAC's
        neighbour port, and what the pipeline does not take is routed on; any other frame
        (broadcasts, other hosts' traffic) is the server's kernel's, not forwarded."""
        router = self.router
        assert router is not None
        if not router.for_me(frame):
            router.counters.not_for_router += 1
            return
        fields = parse(frame)
        if fields is not None:
            port.counters.roce_packets += 1
            if self.pipeline is not None:
                try:
                    if self.pipeline.process(frame, router.source_port(frame),
                                             self._emit_routed):
                        return
                except Exception as e:  # noqa: BLE001 - one frame's fault stays that frame's
                    self._pipeline_failed(fields[0], port.number, e)
                    return
        out = router.forward(frame)
        if out is not None:
            self.emit(PHYSICAL_PORT, out)

    def _emit_routed(self, port: int, parts: Sequence[Buffer]) -> None:
        """The pipeline's emit in one-armed mode: `port` is a neighbour's (router.py)."""
        assert self.router is not None
        out = self.router.to_neighbour(port, parts)
        if out is not None:
            self.emit(PHYSICAL_PORT, out)

    def _learn_new(self, src: bytes, port: int) -> None:
        """A unicast source MAC neither learned nor static on `port`: learn it if it is not
        static elsewhere and the table has room, else count the refusal."""
        if src in self._static or len(self._seen) >= self.mac_table_size:
            self.counters.mac_learn_refused += 1
        else:
            self._seen[src] = self._tick
            self.mac_table[src] = port

    def _age(self) -> None:
        """Forget learned MACs unseen for mac_ageing s (runs every AGEING_SWEEP s)."""
        oldest = self._tick - self.mac_ageing
        for mac in [m for m, t in self._seen.items() if t < oldest]:
            del self._seen[mac]
            del self.mac_table[mac]
            self.counters.mac_aged_out += 1

    def _pipeline_failed(self, key: int, in_port: int, e: Exception) -> None:
        self.counters.pipeline_errors += 1
        if key in self._faulty or len(self._faulty) >= MAX_LOGGED_FAULTS:
            return
        self._faulty.add(key)
        owner = self.describe_connection(key) if self.describe_connection else None
        log.error("pipeline error on connection %s (%s) from port %d: %s: %s; frame dropped, "
                  "further errors of this connection are only counted (pipeline_errors)",
                  "of inter-switch messages" if key == INTERSWITCH_KEY else describe_key(key),
                  owner or "no registered ring", in_port,
                  type(e).__name__, e, exc_info=e)

    def run(self) -> None:
        """Forward until `stop()`; drains up to BATCH frames per ready port per round."""
        ep = select.epoll()
        for fd in self._by_fd:
            ep.register(fd, select.EPOLLIN)
        buf = bytearray(FRAME_BUFFER)
        view = memoryview(buf)
        try:
            while not self._stop.is_set():
                events = ep.poll(0.2)
                self._tick = now = time.monotonic()
                if now >= self._next_sweep:
                    self._next_sweep = now + AGEING_SWEEP
                    self._age()
                for fd, _ in events:
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
