"""The measuring half of `benchmarks.bench_dataplane` for both targets on veth: the ports,
the frames, the CPU accounting, the native runs, the compute-only bound, memcpy, callgrind.

How a run is counted (the same for the Python and the native target):
- Every port is a veth pair `nrxbns<P>` (switch side) / `nrxbnh<P>` (driver side) with GRO
  on and threaded NAPI, so the kernel's receive work of each side runs in a kernel thread
  of its own (`napi/<ifname>-<id>`), whose CPU time /proc/<pid>/schedstat gives in ns.
- Queue phase: the driver sends every frame (each rank's packet k, k-major) while the
  switch is not polling; the switch side's NAPI threads (pinned to the switch's CPUs) do
  the kernel's receive work - generic or driver XDP and the copy into the UMEM (native),
  or the skb queued to the socket (Python) - and their CPU is the switch's **kernel RX
  share**.
- Drain phase: the switch runs and handles everything queued. Its threads' CPU
  (CLOCK_THREAD_CPUTIME_ID: user + system, which includes its sends, as copy-mode TX and
  send(2) run in the sender's system call) up to the last frame handled is the **switch
  CPU**; the wall time of the drain is the **wall** figure. The driver side's NAPI threads
  (the receivers' kernel work) are pinned to CPU 0 and not counted.
  CPU per contribution = (switch CPU + kernel RX share) / frames in.
"""
from __future__ import annotations

import ctypes
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from benchmarks.bench_pipeline import frames
from benchmarks.veth import make_veths
from nr_contract.spec import DEFAULT_SLOTS, Connection, RingSpec
from switch.control.target import resolve_ports
from switch.native import nrio
from switch.native.binding import NativePipeline

PREFIX = "nrxbn"
SETTLE = 0.3                      # s after the last frame sent: the queue phase is over


def ring_spec(ranks: int, mtu: int, index: int) -> RingSpec:
    """Ring `index`: bench_pipeline.lab_ring's shape on addresses of its own (10.77.index.*,
    MACs 02:4e:52:index:00:*), so several rings share no host."""
    ip = [f"10.77.{index}.{i + 1}" for i in range(ranks)]
    mac = [f"02:4e:52:{index:02x}:00:{i + 1:02x}" for i in range(ranks)]
    conns = tuple(Connection(r, ip[r], ip[(r + 1) % ranks], mac[r], mac[(r + 1) % ranks],
                             0x100 + 2 * r, 0x101 + 2 * ((r + 1) % ranks), 1000 * r)
                  for r in range(ranks))
    return RingSpec(f"bench{index}", ranks, mtu, 64 * mtu, 2, conns)


@dataclass(frozen=True)
class Workload:
    """`rings` rings of `ranks` ranks; ring g's rank r on switch port g*ranks + r + 1."""
    ranks: int
    mtu: int
    packets: int
    rings: int

    def specs(self) -> list[RingSpec]:
        return [ring_spec(self.ranks, self.mtu, g) for g in range(self.rings)]

    def port(self, ring: int, rank: int) -> int:
        return ring * self.ranks + rank + 1

    def macs(self) -> dict[str, int]:
        return {c.src_mac: self.port(g, c.rank)
                for g, spec in enumerate(self.specs()) for c in spec.connections}

    def frames(self) -> list[tuple[int, bytes]]:
        """(port, frame) of every ring, ring-major (each ring's own k-major order)."""
        return [(port + g * self.ranks, f) for g, spec in enumerate(self.specs())
                for port, f in frames(spec, self.packets)]


def veth_ports(count: int, link_mtu: int) -> dict[int, tuple[str, str]]:
    """Port p -> (switch side, driver side): GRO on (veth's NAPI), threaded NAPI (its CPU
    counted), as benchmarks.veth makes them."""
    return make_veths(PREFIX, count, link_mtu, gro=True, threaded_napi=True)


def napi_threads(ifname: str) -> list[int]:
    """PIDs of the threaded-NAPI kernel threads of `ifname` (comm `napi/<ifname>-<id>`)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                comm = (d / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(f"napi/{ifname}-"):
                pids.append(int(d.name))
    return pids


def thread_ns(pid: int) -> int:
    """CPU time of a thread so far, in ns (/proc/<pid>/schedstat, first field)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def cpus() -> int:
    return os.cpu_count() or 1


class Kernel:
    """The NAPI threads of the switch sides (pinned per port) and the driver sides (CPU 0)."""

    def __init__(self, links: dict[int, tuple[str, str]], cpu_of_port: dict[int, int]) -> None:
        self.switch = {p: napi_threads(sw) for p, (sw, _) in links.items()}
        if not all(self.switch.values()):
            raise RuntimeError(f"no threaded NAPI thread for some of {links}")
        for p, pids in self.switch.items():
            for pid in pids:
                os.sched_setaffinity(pid, {cpu_of_port[p]})
        for _, drv in links.values():
            for pid in napi_threads(drv):
                os.sched_setaffinity(pid, {0})

    def switch_ns(self) -> int:
        return sum(thread_ns(pid) for pids in self.switch.values() for pid in pids)


def drivers(links: dict[int, tuple[str, str]]) -> dict[int, socket.socket]:
    """A send-only raw socket on each driver side (bound for no protocol: receives none)."""
    out = {}
    for p, (_, drv) in links.items():
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        s.bind((drv, 0))
        out[p] = s
    return out


class Blob:
    """Frames in one buffer, as the C helpers take them (offsets, lengths, ports)."""

    def __init__(self, todo: Sequence[tuple[int, bytes]]) -> None:
        self.n = len(todo)
        self.lengths = np.array([len(f) for _, f in todo], dtype=np.uint32)
        self.offsets = np.zeros(self.n, dtype=np.uint64)
        self.offsets[1:] = np.cumsum(self.lengths[:-1], dtype=np.uint64)
        self.data = np.frombuffer(bytearray(b"".join(f for _, f in todo)), dtype=np.uint8)
        self.ports = np.array([p for p, _ in todo], dtype=np.uint32)

    def args(self) -> list[ctypes.c_void_p]:
        return [ctypes.c_void_p(a.ctypes.data)
                for a in (self.data, self.offsets, self.lengths, self.ports)]


def queue(todo: Sequence[tuple[int, bytes]], links: dict[int, tuple[str, str]],
          kernel: Kernel, batch: int = 32, pause_us: int = 200) -> int:
    """Send every frame from the driver sides (this process on CPU 0, sendmmsg bursts of
    `batch` per port, so the switch side's NAPI threads take them in batches as under
    load); the switch's kernel RX share in ns (its NAPI threads' CPU meanwhile)."""
    socks = drivers(links)
    lib = nrio.load(nrio.STUB_LIBRARY)
    lib.nrio_send_burst.restype = ctypes.c_int64
    fds = (ctypes.c_int * 64)(*[-1] * 64)
    for p, s in socks.items():
        fds[p] = s.fileno()
    blob = Blob(todo)
    before = kernel.switch_ns()
    try:
        sent = lib.nrio_send_burst(fds, *blob.args(), blob.n, batch, pause_us)
    finally:
        for s in socks.values():
            s.close()
    if sent != blob.n:
        raise RuntimeError(f"the driver sent {sent} of {blob.n} frames")
    time.sleep(SETTLE)
    return kernel.switch_ns() - before


@dataclass(frozen=True)
class Run:
    target: str                   # "python" or "native"
    mode: str                     # "forward" or "aggregate"
    workers: int
    ranks: int
    mtu: int
    frames_in: int
    frames_out: int
    wall_s: float                 # the drain
    cpu_s: float                  # the switch's threads during the drain
    kernel_rx_s: float            # its NAPI threads during the queue phase
    io: str                       # how its ports moved frames

    @property
    def cpu_per_frame_us(self) -> float:
        return (self.cpu_s + self.kernel_rx_s) / self.frames_in * 1e6

    @property
    def per_cpu_s(self) -> float:
        return self.frames_in / (self.cpu_s + self.kernel_rx_s)

    @property
    def per_wall_s(self) -> float:
        return self.frames_in / self.wall_s

    def line(self) -> str:
        return (f"{self.target:6s} {self.mode:9s} w{self.workers} n{self.ranks:<2d} "
                f"mtu{self.mtu:<5d} {self.frames_in:6d} in {self.frames_out:6d} out: "
                f"{self.per_cpu_s / 1e3:8.1f} k/CPU-s ({self.cpu_per_frame_us:6.2f} us: "
                f"{self.cpu_s / self.frames_in * 1e6:5.2f} switch + "
                f"{self.kernel_rx_s / self.frames_in * 1e6:5.2f} kernel RX), "
                f"{self.per_wall_s / 1e3:8.1f} k/s wall  [{self.io}]")


def pipelines(mode: str, load: Workload, workers: int
              ) -> tuple[list[int], Path, list[object], Optional[str]]:
    """Worker w's pipeline (its address), the library it runs in, the objects that own
    the pipelines (keep them alive), or why this build cannot run `mode`. Forward: the L2
    stub; aggregate: a NativePipeline (libnrdp) per worker holding the rings whose ports
    are the worker's (run_native's split), NOT_MINE frames forwarded by its L2 table."""
    ports = [load.port(g, r) for g in range(load.rings) for r in range(load.ranks)]
    library = nrio.LIBRARY if mode == "aggregate" else nrio.STUB_LIBRARY
    if not library.exists():
        return [], library, [], f"{library.name} is not built (switch/native/io.mk)"
    if mode != "aggregate":
        stubs = [nrio.stub_pipe(load.macs(), ports) for _ in range(workers)]
        return [ctypes.addressof(s) for s in stubs], library, list(stubs), None
    per_worker = load.ranks * load.rings // workers
    pipes = [NativePipeline() for _ in range(workers)]
    for g, spec in enumerate(load.specs()):
        pipe = pipes[(load.port(g, 0) - 1) // per_worker]
        pipe.register_ring(spec, resolve_ports(spec, load.macs().get), DEFAULT_SLOTS)
    for pipe in pipes:
        pipe.set_l2(load.macs(), ports)
    return [p.address for p in pipes], library, list(pipes), None


def run_native(mode: str, load: Workload, workers: int, links: dict[int, tuple[str, str]],
               todo: Sequence[tuple[int, bytes]], io_mode: str = "auto", batch: int = 256
               ) -> Optional[Run]:
    """One run of the native target: ring g's ports on worker g mod workers, its ports in
    `io_mode` (nrio.MODES: auto is driver XDP where the driver has it), up to `batch`
    frames per port and round."""
    pipes, library, owners, why = pipelines(mode, load, workers)
    if why:
        print(f"native {mode}: skipped: {why}", flush=True)
        return None
    per_worker = load.ranks * load.rings // workers
    worker_of = {p: (p - 1) // per_worker for p in links}
    base = 1 if workers == 1 and cpus() > 1 else 0
    cpu_of_port = {p: (base + w) % cpus() for p, w in worker_of.items()}
    pieces = -(-(load.mtu + 100) // 3840)
    ring = 1 << (max(2 * load.packets * pieces, 2 * batch) - 1).bit_length()
    io = nrio.NativeIO({p: sw for p, (sw, _) in links.items()}, workers=workers,
                       worker_of=worker_of, ring_size=ring, cpu_base=base, idle_poll_us=0,
                       mode=io_mode, batch=batch, library=library)
    try:
        kernel = Kernel(links, cpu_of_port)
        os.sched_setaffinity(0, {0})
        rx_ns = queue(todo, links, kernel)
        share = {w: sum(1 for p in links if worker_of[p] == w) * load.packets
                 for w in range(workers)}
        for w, n in share.items():
            io.expect(w, n)
        io.start(pipes)
        done = io.wait_frames(len(todo), 60.0)
        time.sleep(0.05)
        io.stop()
        stats, counters = io.worker_stats(), io.port_counters()
    finally:
        io.close()
        del owners                  # the pipelines lived until the workers stopped
    if not done or any(s["ownership_errors"] for s in stats):
        raise RuntimeError(f"native {mode}: {sum(s['frames'] for s in stats)} of {len(todo)} "
                           f"frames handled; workers {stats}; ports {counters}")
    drops = sum(int(c["rx_dropped"]) + int(c["rx_fill_empty"]) for c in counters.values())
    if drops:
        raise RuntimeError(f"native {mode}: {drops} frames dropped by the kernel: {counters}")
    kinds = sorted({str(c["kind"]) for c in counters.values()})
    return Run("native", mode, workers, load.ranks, load.mtu, len(todo),
               sum(int(c["tx_packets"]) for c in counters.values()),
               (max(s["busy_until_ns"] for s in stats) - min(s["started_ns"] for s in stats)) / 1e9,
               sum(s["cpu_ns"] for s in stats) / 1e9, rx_ns / 1e9, "+".join(kinds))


def compute_only(mode: str, load: Workload, todo: Sequence[tuple[int, bytes]]
                 ) -> Optional[tuple[float, int]]:
    """The pipeline's work on the frames in memory, one thread: (CPU s, outputs)."""
    pipes, library, owners, why = pipelines(mode, load, 1)
    if why:
        return None
    lib = nrio.load(library)
    lib.nrio_compute.restype = ctypes.c_int64
    blob = Blob(todo)
    outs = ctypes.c_uint64()
    ns = lib.nrio_compute(ctypes.c_void_p(pipes[0]), *blob.args(), blob.n,
                          ctypes.byref(outs))
    del owners                      # the pipeline lived until here
    return ns / 1e9, outs.value


def memcpy_gbps() -> float:
    """One core's memcpy bandwidth over 64 MiB buffers (best of 8), GB/s."""
    lib = nrio.load(nrio.STUB_LIBRARY)
    lib.nrio_memcpy_gbps.restype = ctypes.c_double
    lib.nrio_memcpy_gbps.argtypes = [ctypes.c_size_t, ctypes.c_uint32]
    return float(lib.nrio_memcpy_gbps(64 << 20, 8))


def callgrind_per_frame(mode: str, ranks: int, mtu: int, packets: int) -> Optional[float]:
    """Instructions per frame of the compute-only loop under callgrind (only that loop is
    instrumented), from a fresh process; None if valgrind is missing or the mode cannot run."""
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null",
           os.sys.executable, "-m", "benchmarks.bench_native", mode, str(ranks), str(mtu),
           str(packets)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or not m or "frames" not in run.stdout:
        return None
    return int(m.group(1)) / int(run.stdout.split()[1])


if __name__ == "__main__":          # the process callgrind measures: compute-only, once
    import sys
    mode, ranks, mtu, packets = sys.argv[1], *map(int, sys.argv[2:5])
    load = Workload(ranks, mtu, packets, 1)
    todo = load.frames()
    got = compute_only(mode, load, todo)
    if got is not None:
        print(f"frames {len(todo)} outputs {got[1]}")
