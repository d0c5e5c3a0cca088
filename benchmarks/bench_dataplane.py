"""The switch's data plane on real sockets, natively on veth: the Python target and the
native one (switch/native: AF_XDP, C) side by side on the same frames, with nothing else
competing for their cores.

    python -m benchmarks.bench_dataplane [--targets python,native] [--modes forward,aggregate]
        [--workers 1,2] [--mtus 4096,1024] [--ranks 4,8] [--packets 1024] [--repeat 3]
        [--recv recv_into|recvmmsg|both] [--io auto,generic] [--batch 256] [--callgrind]
        [--profile] [--json FILE]   (root)

In a network namespace of its own (`nrxbn0`, made and removed here; veth pairs
`nrxbns<P>`/`nrxbnh<P>`, benchmarks.veth), for every path MTU and ring size, the
driver first queues every frame of `benchmarks.bench_pipeline.frames` (each rank's RDMA
WRITE packet k, k-major) at the switch's ports, then the switch drains them: **forward**
(no ring registered: every frame L2-forwarded to its receiver's port) and **aggregate**
(the ring registered with 256 slots: every slot's contributions become one result per
rank). The native target runs with 1 and 2 workers: with W workers, W rings of the same
size on ports of their own, ring g on worker g (sharding by ring), so the CPU per
contribution of 1 and 2 workers compares like with like. Reported per run: contributions
per CPU-second of the switch (its threads' CPU plus its kernel receive share, measured as
bench_native's docstring says) and per wall second of the drain. The same run measures the
compute-only bound (the native pipeline over the frames in memory, no I/O), one core's
memcpy bandwidth, and with --callgrind the compute-only loop's instructions per frame.
`--recv both` runs the Python data plane as it is (one recv_into per frame) and,
alternately, a variant receiving with recvmmsg(2) in batches (`BatchingPlane`, here only).
`--profile` adds one Python run per mode under cProfile.
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
import ctypes.util
import io
import json
import os
import pstats
import select
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from benchmarks import bench_native as bn
from benchmarks.bench_native import Run, Workload
from benchmarks.veth import remove_veths
from switch.dataplane.pipeline import AggregationPipeline
from switch.dataplane.ports import BATCH, DataPlane

NETNS = "nrxbn0"
SO_RCVBUFFORCE = 33
MODES = ("forward", "aggregate")


class CountingPlane(DataPlane):
    """A DataPlane that stops itself once `expect` frames were handled, noting when."""

    expect = 0
    handled = 0
    done_at = 0.0

    def _handle(self, frame: memoryview, port) -> None:   # type: ignore[no-untyped-def]
        super()._handle(frame, port)
        self.handled += 1
        if self.handled == self.expect:
            self.done_at = time.perf_counter()
            self.stop()


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(_Iovec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


class BatchingPlane(CountingPlane):
    """The same data plane receiving with recvmmsg(2): up to BATCH frames per system call
    into BATCH buffers (what `--recv recvmmsg` measures against DataPlane's recv_into)."""

    SLOT = 16384                 # bytes per frame buffer (the bench's frames are < 4.2 KiB)
    MSG_DONTWAIT = 0x40

    def run(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        recvmmsg = libc.recvmmsg
        recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                             ctypes.c_void_p]
        buf = bytearray(BATCH * self.SLOT)
        base = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
        iovs = (_Iovec * BATCH)(*[_Iovec(base + i * self.SLOT, self.SLOT)
                                  for i in range(BATCH)])
        msgs = (_Mmsghdr * BATCH)()
        for i in range(BATCH):
            msgs[i].msg_hdr.msg_iov = ctypes.pointer(iovs[i])
            msgs[i].msg_hdr.msg_iovlen = 1
        lengths = np.frombuffer(msgs, dtype=np.dtype(
            {"names": ["len"], "formats": ["<u4"], "offsets": [_Mmsghdr.msg_len.offset],
             "itemsize": ctypes.sizeof(_Mmsghdr)}))["len"]
        view, at = memoryview(buf), ctypes.addressof(msgs)
        ep = select.epoll()
        for fd in self._by_fd:
            ep.register(fd, select.EPOLLIN)
        try:
            while not self._stop.is_set():
                for fd, _ in ep.poll(0.2):
                    port = self._by_fd[fd]
                    got = recvmmsg(fd, at, BATCH, self.MSG_DONTWAIT, None)
                    for i, n in enumerate(lengths[:max(got, 0)].tolist()):
                        self._handle(view[i * self.SLOT:i * self.SLOT + n], port)
        finally:
            ep.close()


def run_python(mode: str, load: Workload, links: dict[int, tuple[str, str]],
               todo: Sequence[tuple[int, bytes]], plane_class: type[CountingPlane] = CountingPlane,
               profile: Optional[cProfile.Profile] = None) -> Run:
    """One run of the Python target (one ring, this thread on the switch's CPU)."""
    spec = load.specs()[0]
    pipeline = AggregationPipeline()
    if mode == "aggregate":
        pipeline.register_ring(spec, {c.src_ip: c.rank + 1 for c in spec.connections}, 256)
    plane = plane_class({n: sw for n, (sw, _) in links.items()},
                        {c.src_mac: c.rank + 1 for c in spec.connections}, pipeline)
    cpu = 1 % bn.cpus()
    try:
        for p in plane.ports.values():
            p.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
        kernel = bn.Kernel(links, {p: cpu for p in links})
        os.sched_setaffinity(0, {0})
        rx_ns = bn.queue(todo, links, kernel)
        os.sched_setaffinity(0, {cpu})
        plane.expect = len(todo)
        t0, c0 = time.perf_counter(), time.thread_time()
        if profile is not None:
            profile.enable()
        plane.run()
        if profile is not None:
            profile.disable()
        cpu_s = time.thread_time() - c0
        out = sum(p.counters.tx_packets for p in plane.ports.values())
        drops = sum(int(c["rx_dropped"]) for c in plane.port_counters().values())
        if plane.handled != len(todo) or drops:
            raise RuntimeError(f"{mode}: handled {plane.handled} of {len(todo)} frames, "
                               f"{drops} dropped by the kernel")
        kind = "recvmmsg" if isinstance(plane, BatchingPlane) else "recv_into"
        return Run("python", mode, 1, load.ranks, load.mtu, len(todo), out,
                   plane.done_at - t0, cpu_s, rx_ns / 1e9, f"af_packet {kind}")
    finally:
        plane.close()
        os.sched_setaffinity(0, set(range(bn.cpus())))


def median(runs: list[Run]) -> Run:
    """The run of median CPU per contribution (the lower middle of an even count)."""
    for r in runs:
        print(r.line(), flush=True)
    return sorted(runs, key=lambda r: r.cpu_per_frame_us)[(len(runs) - 1) // 2]


def measure(args: argparse.Namespace, mtu: int, ranks: int,
            links: dict[int, tuple[str, str]]) -> tuple[list[Run], dict[str, Any]]:
    """Every target, mode and worker count at one (MTU, ranks): the median run of each, and
    the compute-only bound and callgrind counts."""
    results: list[Run] = []
    extra: dict[str, Any] = {"mtu": mtu, "ranks": ranks}
    targets, modes = args.targets.split(","), args.modes.split(",")
    planes = {"recv_into": CountingPlane, "recvmmsg": BatchingPlane}
    kinds = list(planes) if args.recv == "both" else [args.recv]
    for mode in modes:
        if "python" in targets:
            load = Workload(ranks, mtu, args.packets, 1)
            todo = load.frames()
            sub = {p: links[p] for p in range(1, ranks + 1)}
            for kind in kinds:
                results.append(median([run_python(mode, load, sub, todo, planes[kind])
                                     for _ in range(args.repeat)]))
            if args.profile:
                prof = cProfile.Profile()
                run_python(mode, load, sub, todo, profile=prof)
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
                print(f"cProfile, {mode} (one run; the profiler's own cost inflates it):\n"
                      + text.getvalue(), flush=True)
        if "native" not in targets:
            continue
        for workers in map(int, args.workers.split(",")):
            load = Workload(ranks, mtu, args.packets, workers)
            todo = load.frames()
            sub = {p: links[p] for p in range(1, ranks * workers + 1)}
            for io_mode in args.io.split(","):
                runs = [r for r in (bn.run_native(mode, load, workers, sub, todo, io_mode,
                                                  args.batch)
                                    for _ in range(args.repeat)) if r is not None]
                if runs:
                    results.append(median(runs))
        load = Workload(ranks, mtu, args.packets, 1)
        todo = load.frames()
        bound = min((bn.compute_only(mode, load, todo) or (0.0, 0) for _ in range(args.repeat)),
                    key=lambda b: b[0])
        if bound[0]:
            extra[f"compute_us_{mode}"] = bound[0] / len(todo) * 1e6
            print(f"compute-only {mode:9s} n{ranks} mtu{mtu}: {bound[0] / len(todo) * 1e6:.3f} "
                  f"us per frame ({bound[1]} outputs)", flush=True)
        if args.callgrind:
            ir = bn.callgrind_per_frame(mode, ranks, mtu, min(args.packets, 256))
            if ir:
                extra[f"callgrind_ir_{mode}"] = ir
                print(f"callgrind    {mode:9s} n{ranks} mtu{mtu}: {ir:.0f} instructions per "
                      "frame (compute-only loop)", flush=True)
    return results, extra


def summary(results: list[Run], extras: list[dict[str, Any]]) -> None:
    """The issue's ratios: native vs Python per CPU-second, the pipeline vs the compute-only
    bound, 2 workers vs 1 (CPU per contribution)."""
    key: dict[tuple[str, str, int, int, int], Run] = {}
    for r in results:               # the first --io mode listed stands for the native target
        key.setdefault((r.target, r.mode, r.workers, r.ranks, r.mtu), r)
    for x in extras:
        for mode in MODES:
            py = key.get(("python", mode, 1, x["ranks"], x["mtu"]))
            n1 = key.get(("native", mode, 1, x["ranks"], x["mtu"]))
            n2 = key.get(("native", mode, 2, x["ranks"], x["mtu"]))
            bound = x.get(f"compute_us_{mode}")
            parts = []
            if py and n1:
                parts.append(f"native/python per CPU-s {n1.per_cpu_s / py.per_cpu_s:.1f}x")
            if n1 and bound:
                parts.append(f"native CPU / compute-only {n1.cpu_per_frame_us / bound:.2f}x")
            if n1 and n2:
                parts.append(f"2 workers' CPU per frame {n2.cpu_per_frame_us / n1.cpu_per_frame_us - 1:+.0%}"
                             " of 1 worker's")
            if parts:
                print(f"  {mode:9s} n{x['ranks']} mtu{x['mtu']}: " + "; ".join(parts))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_dataplane",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--targets", default="python,native")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--workers", default="1,2", help="native worker counts")
    ap.add_argument("--mtus", default="4096,1024", help="path MTUs (payload bytes per packet)")
    ap.add_argument("--ranks", default="4,8", help="ring sizes")
    ap.add_argument("--packets", type=int, default=1024, help="packets per rank")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (the median by CPU kept)")
    ap.add_argument("--recv", default="recv_into", choices=("recv_into", "recvmmsg", "both"),
                    help="the Python data plane's receive: DataPlane's one recv_into per "
                         "frame, or recvmmsg batches of up to BATCH frames (BatchingPlane)")
    ap.add_argument("--io", default="auto",
                    help="the native ports' modes, each measured (switch.native.nrio.MODES: "
                         "auto = driver XDP where the driver has it, driver, generic, af_packet)")
    ap.add_argument("--batch", type=int, default=256,
                    help="native: frames taken per port and round (1..256)")
    ap.add_argument("--callgrind", action="store_true",
                    help="also count the compute-only loop's instructions under callgrind")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", action="store_true",
                    help="one more Python run per mode under cProfile: the top functions")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("needs root (a network namespace and veth pairs)")
    if not args.in_netns:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
        subprocess.run(["ip", "netns", "add", NETNS], check=True)
        try:
            subprocess.run(["ip", "-n", NETNS, "link", "set", "lo", "up"], check=True)
            cmd = ["ip", "netns", "exec", NETNS, sys.executable, "-m",
                   "benchmarks.bench_dataplane", "--in-netns",
                   *(argv if argv is not None else sys.argv[1:])]
            return subprocess.run(cmd).returncode
        finally:
            subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    results: list[Run] = []
    extras: list[dict[str, Any]] = []
    gbps = bn.memcpy_gbps() if "native" in args.targets else 0.0
    if gbps:
        print(f"memcpy, one core: {gbps:.1f} GB/s", flush=True)
    ranks = [int(n) for n in args.ranks.split(",")]
    nports = max(ranks) * max(int(w) for w in args.workers.split(","))
    for mtu in map(int, args.mtus.split(",")):
        links = bn.veth_ports(nports, 1500 if mtu <= 1024 else 9000)
        try:
            for n in ranks:
                got, extra = measure(args, mtu, n, links)
                results += got
                extras.append(extra)
        finally:
            remove_veths(links)
    print("median of each case (by CPU per contribution):")
    for r in results:
        print("  " + r.line())
    summary(results, extras)
    if args.json:
        args.json.write_text(json.dumps(
            {"packets_per_rank": args.packets, "memcpy_gbps": gbps, "bounds": extras,
             "results": [{**asdict(r), "per_cpu_s": r.per_cpu_s, "per_wall_s": r.per_wall_s}
                         for r in results]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
