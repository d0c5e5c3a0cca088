"""The native data plane's packet I/O from Python: ctypes over libnrio (switch/native/nrio.h).

`NativeIO(ports, workers=...)` opens every port (AF_XDP, or the logged AF_PACKET fallback),
`start(pipes)` runs one worker thread per pipeline instance, `stop()` joins them;
`port_counters()` and `worker_stats()` read the counters. Invariant: the structures below
mirror nrio.h field for field (checked by their sizes at load); nothing here is on the
per-packet path.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Mapping, Optional, Sequence

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
LIBRARY = HERE / "libnrio.so"
STUB_LIBRARY = HERE / "libnrio_stub.so"      # built against pipeline_stub.h: L2 only
KINDS = {1: "af_xdp-driver", 2: "af_xdp-generic", 3: "af_packet"}
MODES = {"auto": 0, "driver": 1, "generic": 2, "af_packet": 3}
IFNAME = 16


class PortSpec(ctypes.Structure):
    _fields_ = [("number", ctypes.c_uint32), ("worker", ctypes.c_uint32),
                ("ifname", ctypes.c_char * IFNAME)]


class Config(ctypes.Structure):
    _fields_ = [("workers", ctypes.c_uint32), ("batch", ctypes.c_uint32),
                ("ring_size", ctypes.c_uint32), ("max_frame", ctypes.c_uint32),
                ("xdp_mode", ctypes.c_int32), ("cpu_base", ctypes.c_int32),
                ("idle_poll_us", ctypes.c_uint32)]


PORT_COUNTERS = ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "tx_errors",
                 "rx_dropped", "rx_fill_empty", "rx_gathered", "rx_oversize", "tx_copied",
                 "fallback", "kind", "roce_packets")


class PortCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in PORT_COUNTERS]


class WorkerStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "frames", "outputs", "cpu_ns", "busy_until_ns", "started_ns", "ownership_errors",
        "chunks_free", "chunks_total")] + [("cpu", ctypes.c_int32), ("tid", ctypes.c_int32)]


def load(path: Path = LIBRARY) -> ctypes.CDLL:
    """libnrio with its functions' signatures set; OSError naming how to build it."""
    if not path.exists():
        raise OSError(f"{path} is not built: make -f switch/native/io.mk "
                      f"{'stub' if path == STUB_LIBRARY else ''}".rstrip())
    lib = ctypes.CDLL(str(path))
    vp, u32, u64 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64
    lib.nrio_create.restype = vp
    lib.nrio_create.argtypes = [ctypes.POINTER(PortSpec), u32, ctypes.POINTER(Config),
                                ctypes.c_char_p, ctypes.c_size_t]
    lib.nrio_start.argtypes = [vp, ctypes.POINTER(vp)]
    lib.nrio_stop.argtypes = [vp]
    lib.nrio_destroy.argtypes = [vp]
    lib.nrio_destroy.restype = None
    lib.nrio_port_counters.argtypes = [vp, u32, ctypes.POINTER(PortCounters)]
    lib.nrio_worker_stats.argtypes = [vp, u32, ctypes.POINTER(WorkerStats)]
    lib.nrio_expect.argtypes = [vp, u32, u64]
    lib.nrio_wait_frames.argtypes = [vp, u64, u32]
    lib.nrio_port_worker.argtypes = [vp, u32]
    lib.nrio_port_worker.restype = ctypes.c_int
    return lib


class NativeIO:
    """The switch's ports, opened; `workers` threads once started.

    ports: port number -> interface name; worker_of: port number -> worker (default:
    every port on worker 0). A ring's ports must all be on one worker (nrio.h).
    """

    def __init__(self, ports: Mapping[int, str], *, workers: int = 1,
                 worker_of: Optional[Mapping[int, int]] = None, batch: int = 64,
                 ring_size: int = 4096, max_frame: int = 9216, mode: str = "auto",
                 cpu_base: int = -1, idle_poll_us: int = 1000,
                 library: Path = LIBRARY) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {sorted(MODES)}")
        for number, ifname in ports.items():
            if len(ifname.encode()) >= IFNAME:
                raise ValueError(f"port {number}: interface name {ifname!r} too long")
        self.lib = load(library)
        specs = (PortSpec * len(ports))(*[
            PortSpec(n, (worker_of or {}).get(n, 0), ifname.encode())
            for n, ifname in sorted(ports.items())])
        cfg = Config(workers, batch, ring_size, max_frame, MODES[mode], cpu_base, idle_poll_us)
        err = ctypes.create_string_buffer(512)
        self._h = self.lib.nrio_create(specs, len(ports), ctypes.byref(cfg), err, len(err))
        if not self._h:
            raise OSError(f"native I/O: {err.value.decode()}")
        self.ports = dict(ports)
        self.workers = workers
        for number, c in self.port_counters().items():
            if c["fallback"]:
                log.warning("port %d (%s): AF_XDP unavailable, on the AF_PACKET fallback",
                            number, ports[number])

    def start(self, pipes: Sequence[int]) -> None:
        """Run worker w on pipeline pipes[w] (a pointer, as an int)."""
        if len(pipes) != self.workers:
            raise ValueError(f"{len(pipes)} pipelines for {self.workers} workers")
        arr = (ctypes.c_void_p * self.workers)(*pipes)
        r = self.lib.nrio_start(self._h, arr)
        if r:
            raise OSError(-r, "nrio_start")

    def expect(self, worker: int, frames: int) -> None:
        """Worker notes its CPU and time once it handled `frames` (before start)."""
        if self.lib.nrio_expect(self._h, worker, frames):
            raise ValueError(f"worker {worker}: not one of {self.workers}, or running")

    def wait_frames(self, frames: int, timeout: float) -> bool:
        return self.lib.nrio_wait_frames(self._h, frames, int(timeout * 1000)) == 0

    def stop(self) -> None:
        self.lib.nrio_stop(self._h)

    def port_worker(self, number: int) -> int:
        """The worker that owns port `number`, or -1 when it is not one of the ports."""
        return int(self.lib.nrio_port_worker(self._h, number))

    def port_counters(self) -> dict[int, dict[str, int | str]]:
        out: dict[int, dict[str, int | str]] = {}
        c = PortCounters()
        for number in sorted(self.ports):
            self.lib.nrio_port_counters(self._h, number, ctypes.byref(c))
            row: dict[str, int | str] = {name: getattr(c, name) for name in PORT_COUNTERS}
            row["kind"] = KINDS.get(int(row["kind"]), "?")
            out[number] = {"ifname": self.ports[number], **row}
        return out

    def worker_stats(self) -> list[dict[str, int]]:
        out = []
        s = WorkerStats()
        for k in range(self.workers):
            self.lib.nrio_worker_stats(self._h, k, ctypes.byref(s))
            out.append({name: getattr(s, name) for name, _ in WorkerStats._fields_})
        return out

    def close(self) -> None:
        if self._h:
            self.lib.nrio_destroy(self._h)
            self._h = None

    def __enter__(self) -> "NativeIO":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StubPipe(ctypes.Structure):
    """pipeline_stub.h's `struct nrdp_pipe`, l2.h's `struct nrdp_l2`: the static MAC table
    of the L2-only stub, and of a native pipeline's L2 forwarding (NativePipeline.set_l2)."""
    _fields_ = [("nmacs", ctypes.c_uint32), ("mac", (ctypes.c_uint8 * 6) * 256),
                ("port", ctypes.c_uint32 * 256), ("nports", ctypes.c_uint32),
                ("ports", ctypes.c_uint32 * 64)]


def stub_pipe(macs: Mapping[str, int], ports: Sequence[int]) -> StubPipe:
    """A stub pipeline forwarding to `macs` (MAC -> port), flooding others to `ports`."""
    if len(macs) > 256 or len(ports) > 64:
        raise ValueError(f"{len(macs)} MACs (256 at most), {len(ports)} ports (64 at most)")
    pipe = StubPipe()
    for i, (mac, port) in enumerate(macs.items()):
        pipe.mac[i][:] = list(bytes.fromhex(mac.replace(":", "")))
        pipe.port[i] = port
    pipe.nmacs = len(macs)
    pipe.nports = len(ports)
    for i, port in enumerate(ports):
        pipe.ports[i] = port
    return pipe
