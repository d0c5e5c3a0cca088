"""The native pipeline (libnrdp: pipeline.h) from Python: ctypes, control path only.

`NativePipeline` has the software pipeline's control shape (register_ring(spec, ports,
slots), unregister_ring, counters() with the same JSON as AggregationPipeline.counters),
and `process(frame, in_port)` returns None for a frame that is not the pipeline's (the
caller forwards it by L2, as AggregationPipeline.process returning False) or the list of
(port, frame) it sends. Invariant: the structures below mirror pipeline.h field for field
(checked by size at load); a ring's checks are nr_contract.spec.check_ring's, then C's own.
"""
from __future__ import annotations

import ctypes
import socket
import threading
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from nr_contract.spec import (CONN_COUNTERS, DEFAULT_SLOTS, MAX_RANKS, OUTCOMES,
                              RING_COUNTERS, RingSpec, check_ring)

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "libnrdp.so"
SANITIZED = HERE / "libnrdp_san.so"       # `make -C switch/native sanitize` (preload ASan)
COUNTS = OUTCOMES + ("messages", "recuts")   # nrdp_counter_name order
MAX_OUT = 1024 * MAX_RANKS + 1
NOT_MINE = -1
RING_ID_LEN = 64
ERR_LEN = 256

u32, u64 = ctypes.c_uint32, ctypes.c_uint64


class Out(ctypes.Structure):
    _fields_ = [("port", u32), ("len", u32), ("data", ctypes.POINTER(ctypes.c_uint8))]


class OutBatch(ctypes.Structure):
    _fields_ = [("n", u32), ("out", Out * MAX_OUT)]


class ConnDesc(ctypes.Structure):
    _fields_ = [(name, u32) for name in ("rank", "src_ip", "dst_ip", "src_qpn", "dst_qpn",
                                         "psn0", "in_port", "out_port")]


class RingDesc(ctypes.Structure):
    _fields_ = [("ring_id", ctypes.c_char * RING_ID_LEN), ("world_size", u32), ("mtu", u32),
                ("slots", u32)]


class RingStats(ctypes.Structure):
    _fields_ = [("world_size", u32), ("slots", u32), ("next_emit", u32), ("completed", u64),
                ("results_sent", u64)]


class ConnStats(ctypes.Structure):
    _fields_ = [("counts", u64 * len(COUNTS)), ("has_reth", u32), ("va", u64), ("rkey", u32),
                ("dma_len", u32)]


def load(path: Path = LIBRARY) -> ctypes.CDLL:
    """libnrdp with its signatures set; OSError naming how to build it, or how it differs."""
    if not path.exists():
        raise OSError(f"{path} is not built: make -C switch/native")
    lib = ctypes.CDLL(str(path))
    vp, i32, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    lib.nrdp_create.restype = vp
    lib.nrdp_create.argtypes = [u32, u32]
    lib.nrdp_destroy.argtypes = [vp]
    lib.nrdp_process.restype = i32
    lib.nrdp_process.argtypes = [vp, u32, ctypes.c_char_p, u32, ctypes.POINTER(OutBatch)]
    lib.nrdp_register_ring.restype = i32
    lib.nrdp_register_ring.argtypes = [vp, ctypes.POINTER(RingDesc), ctypes.POINTER(ConnDesc),
                                       cp, ctypes.c_size_t]
    lib.nrdp_unregister_ring.argtypes = [vp, i32]
    lib.nrdp_ring_stats.argtypes = [vp, i32, ctypes.POINTER(RingStats)]
    lib.nrdp_conn_stats.argtypes = [vp, i32, u32, ctypes.POINTER(ConnStats)]
    lib.nrdp_set_l2.argtypes = [vp, vp]
    lib.nrdp_counter_name.restype = cp
    lib.nrdp_counter_name.argtypes = [u32]
    sizes = (ctypes.c_size_t * 5)()
    lib.nrdp_abi_sizes(sizes)
    mine = [ctypes.sizeof(s) for s in (OutBatch, ConnDesc, RingDesc, RingStats, ConnStats)]
    names = tuple(lib.nrdp_counter_name(i).decode() for i in range(len(COUNTS)))
    if list(sizes) != mine or names != COUNTS:
        raise OSError(f"{path} does not match binding.py: sizes {list(sizes)} vs {mine}, "
                      f"counters {names}")
    return lib


def _ip(ip: str) -> int:
    return int.from_bytes(socket.inet_aton(ip), "big")


class NativePipeline:
    """One nrdp_pipe: rings by id on the Python side (their handle, spec, ports, slots)."""

    max_ranks = MAX_RANKS

    def __init__(self, max_rings: int = 64, max_conns: int = 1024,
                 path: Path = LIBRARY) -> None:
        self._lib = load(path)
        self._pipe = self._lib.nrdp_create(max_rings, max_conns)
        if not self._pipe:
            raise OSError(ctypes.get_errno(), "nrdp_create failed")
        self._out = OutBatch()
        self._rings: dict[str, tuple[int, RingSpec, dict[str, int], int]] = {}
        self._lock = threading.Lock()

    @property
    def address(self) -> int:
        """The C pipe (a `struct nrdp_pipe *`): what nrio's start(pipes) takes."""
        if not self._pipe:
            raise ValueError("pipeline closed")
        return int(self._pipe)

    def set_l2(self, macs: Mapping[str, int], ports: Sequence[int]) -> None:
        """The L2 table (l2.h) the I/O layer forwards NOT_MINE frames by: `macs` (MAC ->
        port), others flooded to `ports`. Before the pipe's worker starts."""
        from switch.native.nrio import stub_pipe     # l2.h's struct, field for field
        table = stub_pipe(macs, ports)
        self._lib.nrdp_set_l2(self._pipe, ctypes.byref(table))

    def close(self) -> None:
        if self._pipe:
            self._lib.nrdp_destroy(self._pipe)
            self._pipe = None

    def register_ring(self, spec: RingSpec, ports: dict[str, int],
                      slots: int = DEFAULT_SLOTS) -> None:
        """Install a ring; `ports` maps each rank's IP to its switch port. The same ring
        again with the same spec, ports and slots is a no-op (as the software pipeline)."""
        check_ring(spec, slots, self.max_ranks)
        missing = sorted({c.src_ip for c in spec.connections} - ports.keys())
        if missing:
            raise ValueError(f"ring {spec.ring_id}: no switch port for {', '.join(missing)}")
        bad = {ip: p for ip, p in ports.items() if not 0 <= p < 1 << 32}
        if bad:
            raise ValueError(f"ring {spec.ring_id}: switch ports not 32-bit: {bad}")
        rid = spec.ring_id.encode()
        if len(rid) >= RING_ID_LEN:
            raise ValueError(f"ring id {spec.ring_id!r} is longer than {RING_ID_LEN - 1} bytes")
        with self._lock:
            old = self._rings.get(spec.ring_id)
            if old is not None:
                if old[1:] == (spec, ports, slots):
                    return
                raise ValueError(f"ring {spec.ring_id} is already registered differently")
            conns = (ConnDesc * spec.world_size)(*[
                ConnDesc(c.rank, _ip(c.src_ip), _ip(c.dst_ip), c.src_qpn, c.dst_qpn, c.psn0,
                         ports[c.src_ip], ports[c.dst_ip]) for c in spec.connections])
            err = ctypes.create_string_buffer(ERR_LEN)
            handle = self._lib.nrdp_register_ring(
                self._pipe, ctypes.byref(RingDesc(rid, spec.world_size, spec.mtu, slots)),
                conns, err, ERR_LEN)
            if handle < 0:
                raise ValueError(err.value.decode())
            self._rings[spec.ring_id] = (handle, spec, dict(ports), slots)

    def unregister_ring(self, ring_id: str) -> None:
        """Remove a ring; its connections' traffic is forwarded from then on."""
        with self._lock:
            ring = self._rings.pop(ring_id, None)
            if ring is None:
                raise KeyError(f"ring {ring_id} is not registered")
            self._lib.nrdp_unregister_ring(self._pipe, ring[0])

    def counters(self) -> dict[str, Any]:
        """AggregationPipeline.counters' JSON: per ring its counters, slots, next_emit and
        per-connection state; a ring's outcome counters are the sums of its connections'."""
        out = {}
        for rid, (handle, spec, ports, slots) in list(self._rings.items()):
            rs = RingStats()
            if self._lib.nrdp_ring_stats(self._pipe, handle, ctypes.byref(rs)):
                continue                # unregistered meanwhile
            conns = []
            for c in spec.connections:
                cs = ConnStats()
                self._lib.nrdp_conn_stats(self._pipe, handle, c.rank, ctypes.byref(cs))
                counts = dict(zip(COUNTS, cs.counts))
                counts["packets"] = sum(counts[o] for o in OUTCOMES)
                conns.append({"rank": c.rank, "src_ip": c.src_ip, "dst_ip": c.dst_ip,
                              "dst_qpn": c.dst_qpn, "psn0": c.psn0,
                              "in_port": ports[c.src_ip], "out_port": ports[c.dst_ip],
                              "reth": {"va": cs.va, "rkey": cs.rkey, "dma_len": cs.dma_len}
                              if cs.has_reth else None,
                              "counters": {name: counts[name] for name in CONN_COUNTERS}})
            totals = {"completed": rs.completed, "results_sent": rs.results_sent}
            out[rid] = {"world_size": rs.world_size, "slots": rs.slots,
                        "next_emit": rs.next_emit, "connections": conns,
                        "counters": {name: totals[name] if name in totals else
                                     sum(c["counters"][name] for c in conns)
                                     for name in RING_COUNTERS}}
        return out

    def process(self, frame: bytes, in_port: int) -> Optional[list[tuple[int, bytes]]]:
        """Rules 1-8 for one frame: None when it is not the pipeline's, else what it sends."""
        n = self._lib.nrdp_process(self._pipe, in_port, frame, len(frame),
                                   ctypes.byref(self._out))
        if n == NOT_MINE:
            return None
        return [(o.port, ctypes.string_at(o.data, o.len)) for o in self._out.out[:n]]


ROUTER_MAX = 256                          # router.h's NRDP_ROUTER_MAX
ROUTER_COUNTERS = ("routed", "ttl_expired", "no_route", "not_routable", "not_for_router")


class RouterTable(ctypes.Structure):
    _fields_ = [("nmacs", u32), ("mac", (ctypes.c_uint8 * 6) * ROUTER_MAX),
                ("port", u32 * ROUTER_MAX), ("nips", u32),
                ("ip", (ctypes.c_uint8 * 4) * ROUTER_MAX),
                ("ip_mac", (ctypes.c_uint8 * 6) * ROUTER_MAX)]


class RouterCounters(ctypes.Structure):
    _fields_ = [(name, u64) for name in ROUTER_COUNTERS]


class NativeRouter:
    """One-armed mode on the native data plane (router.h): `router` (switch/dataplane/
    router.py's Router) owns the neighbours and their ports; `sync()` hands its tables to
    the C router, which the pipeline's worker then sends every frame through. Invariant:
    the C table is the Router's as of the last sync (call it after every add/remove_ring)."""

    def __init__(self, pipeline: NativePipeline, router: Any, path: Path = LIBRARY) -> None:
        lib = load(path)
        vp = ctypes.c_void_p
        lib.nrdp_router_create.restype = vp
        lib.nrdp_router_create.argtypes = [ctypes.c_char_p]
        lib.nrdp_router_destroy.argtypes = [vp]
        lib.nrdp_router_set.argtypes = [vp, ctypes.POINTER(RouterTable)]
        lib.nrdp_router_counters.argtypes = [vp, ctypes.POINTER(RouterCounters)]
        lib.nrdp_route.restype = ctypes.c_int
        lib.nrdp_route.argtypes = [vp, vp, vp, u32, ctypes.POINTER(OutBatch)]
        lib.nrdp_set_router.argtypes = [vp, vp]
        sizes = (ctypes.c_size_t * 2)()
        lib.nrdp_router_abi_sizes(sizes)
        if list(sizes) != [ctypes.sizeof(RouterTable), ctypes.sizeof(RouterCounters)]:
            raise OSError(f"{path}: router.h does not match binding.py ({list(sizes)})")
        self._lib, self.pipeline, self.router = lib, pipeline, router
        self._r = lib.nrdp_router_create(bytes(router.own_mac))
        if not self._r:
            raise OSError(ctypes.get_errno(), "nrdp_router_create failed")
        try:
            self.sync()
        except ValueError:
            lib.nrdp_router_destroy(self._r)
            raise
        lib.nrdp_set_router(pipeline.address, self._r)

    def sync(self) -> None:
        """Give the C router the Router's current tables; ValueError if they exceed
        ROUTER_MAX entries."""
        mac_of, ip_mac = self.router.tables()
        if len(mac_of) > ROUTER_MAX or len(ip_mac) > ROUTER_MAX:
            raise ValueError(f"one-armed: {len(mac_of)} neighbour MACs, {len(ip_mac)} "
                             f"addresses; the native router holds {ROUTER_MAX} of each")
        t = RouterTable(nmacs=len(mac_of), nips=len(ip_mac))
        for i, (port, mac) in enumerate(sorted(mac_of.items())):
            t.mac[i][:] = list(mac)
            t.port[i] = port
        for j, (ip, mac) in enumerate(sorted(ip_mac.items())):
            t.ip[j][:] = list(ip)
            t.ip_mac[j][:] = list(mac)
        if self._lib.nrdp_router_set(self._r, ctypes.byref(t)):
            raise ValueError("nrdp_router_set refused the table")

    def counters(self) -> dict[str, int]:
        """router.py's RouterCounters, as the C router counted them."""
        c = RouterCounters()
        self._lib.nrdp_router_counters(self._r, ctypes.byref(c))
        return {name: getattr(c, name) for name in ROUTER_COUNTERS}

    def process(self, frame: bytes) -> list[tuple[int, bytes]]:
        """One received frame in one-armed mode, off the I/O layer (tests): what leaves."""
        buf = ctypes.create_string_buffer(bytes(frame), len(frame))
        out = OutBatch()
        n = self._lib.nrdp_route(self._r, self.pipeline.address, buf, len(frame),
                                 ctypes.byref(out))
        return [(o.port, ctypes.string_at(o.data, o.len)) for o in out.out[:n]]

    def close(self) -> None:
        """Detach from the pipeline (its worker stopped) and free the C router."""
        if self._r:
            if self.pipeline._pipe:
                self._lib.nrdp_set_router(self.pipeline.address, None)
            self._lib.nrdp_router_destroy(self._r)
            self._r = None
