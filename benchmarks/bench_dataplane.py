"""The software switch's own ceiling: `switch.dataplane.ports.DataPlane` on real sockets,
with nothing else competing for its core.

    python -m benchmarks.bench_dataplane [--ranks 4] [--packets 2048] [--payload 4096] \
        [--repeat 3] [--recv recv_into|recvmmsg|both] [--profile] [--json FILE]  (root)

In a network namespace of its own (`nrdpbench`, made and removed here; veth pairs
`nrbsN`/`nrbhN` as benchmarks.bench_targets makes them), the driver first queues every frame
of `benchmarks.bench_pipeline.frames` (each rank's RDMA WRITE packet k, k-major) into the
switch's receive queues (the switch sockets get SO_RCVBUFFORCE room for all of them), then
the data plane runs in this process and drains them: **forward** (no ring registered:
every frame L2-forwarded to its receiver's port) and **aggregate** (the ring registered
with 256 slots: every slot's contributions become one result per rank). Reported per mode:
frames handled per second of wall time and per CPU-second of this process (the ceiling of
one core; getrusage: user + system, and the system part: the sockets' kernel work), and
the frames sent. Nothing reads the results (the peers' queues take them or the kernel
drops them on the driver side): only the switch's side is measured. `--recv both` runs the
data plane as it is (one recv_into per frame) and, alternately, a variant receiving with
recvmmsg(2) in batches (`BatchingPlane`, here only): the before/after of batching.
`--profile` adds one run per mode under cProfile.
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
import resource
import select
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from switch.dataplane.pipeline import AggregationPipeline
from switch.dataplane.ports import BATCH, DataPlane, open_port
from benchmarks.bench_pipeline import frames, lab_ring
from benchmarks.bench_targets import _ip, veth_pairs

NETNS = "nrdpbench"
SO_RCVBUFFORCE = 33
MODES = ("forward", "aggregate")


@dataclass(frozen=True)
class Result:
    mode: str
    frames_in: int
    frames_out: int
    wall_s: float
    cpu_s: float
    sys_s: float          # of cpu_s, in the kernel (syscalls, the sockets' work)
    recv: str = "recv_into"

    @property
    def per_s(self) -> float:
        return self.frames_in / self.wall_s

    @property
    def per_cpu_s(self) -> float:
        return self.frames_in / self.cpu_s

    def line(self) -> str:
        return (f"{self.recv:9s} {self.mode:9s} {self.frames_in} frames in, "
                f"{self.frames_out} out: "
                f"{self.per_s / 1e3:7.1f} k/s wall, {self.per_cpu_s / 1e3:7.1f} k/s per "
                f"CPU-second ({self.cpu_s / self.frames_in * 1e6:5.2f} us CPU per frame, "
                f"{self.sys_s / self.frames_in * 1e6:5.2f} of it in the kernel)")


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


def once(mode: str, ranks: int, packets: int, payload: int,
         links: dict[int, tuple[str, str]], profile: Optional[cProfile.Profile] = None,
         plane_class: type[CountingPlane] = CountingPlane) -> Result:
    spec = lab_ring(ranks, 4096)
    todo = frames(spec, packets, payload)
    pipeline = AggregationPipeline()
    if mode == "aggregate":
        pipeline.register_ring(spec, {c.src_ip: c.rank + 1 for c in spec.connections}, 256)
    plane = plane_class({n: sw for n, (sw, _) in links.items()},
                          {c.src_mac: c.rank + 1 for c in spec.connections}, pipeline)
    drivers = {n: open_port(n, drv) for n, (_, drv) in links.items()}
    try:
        for p in plane.ports.values():
            p.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
        for port, frame in todo:
            drivers[port].sock.send(frame)
        plane.expect = len(todo)
        time.sleep(0.2)                      # every frame queued at the switch side
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if profile is not None:
            profile.enable()
        plane.run()
        if profile is not None:
            profile.disable()
        after = resource.getrusage(resource.RUSAGE_SELF)
        user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
        wall = plane.done_at - t0
        out = sum(p.counters.tx_packets for p in plane.ports.values())
        drops = sum(int(c["rx_dropped"]) for c in plane.port_counters().values())
        if plane.handled != len(todo) or drops:
            raise RuntimeError(f"{mode}: handled {plane.handled} of {len(todo)} frames, "
                               f"{drops} dropped by the kernel")
        return Result(mode, len(todo), out, wall, user + system, system,
                      "recvmmsg" if isinstance(plane, BatchingPlane) else "recv_into")
    finally:
        plane.close()
        for d in drivers.values():
            d.sock.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_dataplane",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--packets", type=int, default=2048, help="packets per rank")
    ap.add_argument("--payload", type=int, default=4096, help="payload bytes per packet")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (best CPU kept)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--recv", default="recv_into", choices=("recv_into", "recvmmsg", "both"),
                    help="the data plane's receive: DataPlane's one recv_into per frame, "
                         "or recvmmsg batches of up to BATCH frames (BatchingPlane); both: "
                         "each mode's runs alternate between them")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", action="store_true",
                    help="one more run per mode under cProfile: the top functions")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("needs root (a network namespace and veth pairs)")
    if not args.in_netns:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
        _ip("netns", "add", NETNS)
        try:
            _ip("-n", NETNS, "link", "set", "lo", "up")
            cmd = ["ip", "netns", "exec", NETNS, sys.executable, "-m", "benchmarks.bench_dataplane",
                   "--in-netns", *(argv if argv is not None else sys.argv[1:])]
            return subprocess.run(cmd).returncode
        finally:
            subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    links = veth_pairs(args.ranks)
    results = []
    try:
        planes = {"recv_into": CountingPlane, "recvmmsg": BatchingPlane}
        kinds = list(planes) if args.recv == "both" else [args.recv]
        for mode in args.modes.split(","):
            runs: dict[str, list[Result]] = {kind: [] for kind in kinds}
            for _ in range(args.repeat):
                for kind in kinds:              # interleaved: a busy spell hits both
                    r = once(mode, args.ranks, args.packets, args.payload, links,
                             plane_class=planes[kind])
                    runs[kind].append(r)
                    print(r.line(), flush=True)
            for kind in kinds:
                results.append(min(runs[kind], key=lambda r: r.cpu_s))
            if args.profile:
                prof = cProfile.Profile()
                once(mode, args.ranks, args.packets, args.payload, links, prof)
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
                print(f"cProfile, {mode} (one run; the profiler's own cost inflates it):\n"
                      + text.getvalue(), flush=True)
    finally:
        for sw, _ in links.values():
            subprocess.run(["ip", "link", "del", sw], capture_output=True)
    print("best of each mode (by CPU):")
    for r in results:
        print("  " + r.line())
    if args.json:
        args.json.write_text(json.dumps(
            {"ranks": args.ranks, "packets_per_rank": args.packets, "payload": args.payload,
             "results": [{**asdict(r), "per_s": r.per_s, "per_cpu_s": r.per_cpu_s}
                         for r in results]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
