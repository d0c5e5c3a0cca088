"""simple_switch_grpc's CPU per frame for builds of a program, on veth pairs: what costs what.

    python -m tools.bench_bmv2 [--ranks 4] [--packets 512] [--window 16] [--repeat 3]
                                [--log-levels off,trace] [--prefix nrpf]
                                NAME=BUILD_DIR[:MODES] ...        # root

BUILD_DIR holds p4c's `netreduce.json` and `netreduce.p4info.txtpb` (`p4c --target bmv2
--arch v1model --p4runtime-files DIR/netreduce.p4info.txtpb -o DIR FILE.p4`, the JSON
renamed if FILE is not netreduce.p4): switch/p4 as built, or a variant of it with a part
removed. MODES (default `forward,aggregate`) as in `tools.bench_targets`, whose traffic and
replay this uses: forward = the ring not registered, every frame L2-forwarded (a build needs
only switch/p4's `l2` table and flood group for it, e.g. docs/bmv2_l2_baseline.p4);
aggregate = the ring registered (every slot's contributions come back as results). Each
(build, log level, mode) gets a fresh simple_switch_grpc (`--log-level` as given; BMv2's
default is trace), started and programmed directly (no controller process), in namespace
`<prefix>` on veth pairs `<prefix>sN`/`<prefix>hN`. It reports the switch process's CPU
seconds (utime + stime) per frame sent, which on a shared machine moves far less than wall
time; runs are interleaved `--repeat` times and the median of each row printed last.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from switch.control.bmv2 import Bmv2Target, ShellSession, ThriftRegisters
from switch.dataplane.ports import Port, open_port
from switch.p4.program import build_paths
from tools.bench_pipeline import frames, lab_ring
from tools.bench_targets import replay
from tools.bmv2_lab import SIMPLE_SWITCH, wait_listening

GRPC_PORT = 9591
THRIFT_PORT = 9391
MODES = ("forward", "aggregate")


@dataclass(frozen=True)
class Run:
    name: str
    log_level: str
    mode: str
    frames_in: int
    frames_back: int
    wall: float              # s, first frame sent .. last frame back
    cpu: float               # s of simple_switch_grpc CPU over the replay
    aggregated: int          # the ring's counter (aggregate), else 0

    @property
    def row(self) -> str:
        return f"{self.name}/{self.log_level}/{self.mode}"

    @property
    def us_per_frame(self) -> float:
        return self.cpu / self.frames_in * 1e6

    def line(self) -> str:
        return (f"{self.row:32s} {self.frames_in} in, {self.frames_back} back in "
                f"{self.wall:6.2f} s ({self.frames_in / self.wall:7.0f}/s); CPU {self.cpu:6.2f} s"
                f" = {self.us_per_frame:7.1f} us/frame ({1e6 / self.us_per_frame:7.0f} "
                f"frames per CPU-s)" + (f"; aggregated {self.aggregated}"
                                        if self.mode == "aggregate" else ""))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ip(*args: str) -> None:
    run = subprocess.run(["ip", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {run.stderr.strip()}")


@contextmanager
def veth_pairs(prefix: str, ranks: int) -> Iterator[dict[int, tuple[str, str]]]:
    """Port r -> (switch side <prefix>s<r>, driver side <prefix>h<r>), removed afterwards."""
    links = {n: (f"{prefix}s{n}", f"{prefix}h{n}") for n in range(1, ranks + 1)}
    try:
        for sw, drv in links.values():
            _ip("link", "add", sw, "type", "veth", "peer", "name", drv)
            for dev in (sw, drv):
                Path(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6").write_text("1\n")
                _ip("link", "set", dev, "mtu", "9000", "up")
        yield links
    finally:
        for sw, _ in links.values():
            subprocess.run(["ip", "link", "del", sw], capture_output=True)


def _drain(drivers: dict[int, Port]) -> None:
    """Drop what an earlier run left in the driver sockets (late frames)."""
    for port in drivers.values():
        try:
            while port.sock.recv(65536):
                pass
        except BlockingIOError:
            pass


def run_once(name: str, build_dir: Path, log_level: str, mode: str, ranks: int,
             packets: int, window: int, links: dict[int, tuple[str, str]],
             drivers: dict[int, Port]) -> Run:
    spec = lab_ring(ranks, 256)
    todo = frames(spec, packets, 256)
    cmd = [SIMPLE_SWITCH, "--device-id", "0", "--thrift-port", str(THRIFT_PORT),
           "--log-level", log_level]
    cmd += [a for n, (sw, _) in sorted(links.items()) for a in ("-i", f"{n}@{sw}")]
    cmd += ["--no-p4", "--", "--grpc-server-addr", f"127.0.0.1:{GRPC_PORT}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(proc, GRPC_PORT)
        target = Bmv2Target(ShellSession(f"127.0.0.1:{GRPC_PORT}", build_paths(build_dir)),
                            {n: sw for n, (sw, _) in links.items()},
                            {c.src_mac: c.rank + 1 for c in spec.connections},
                            ThriftRegisters(THRIFT_PORT))
        try:
            if mode == "aggregate":
                target.register_ring(spec, 256)
            _drain(drivers)
            cpu0 = cpu_seconds(proc.pid)
            back, wall = replay(todo, drivers, ranks, window)
            cpu = cpu_seconds(proc.pid) - cpu0
            aggregated = (target.counters()["rings"][spec.ring_id]["counters"]["aggregated"]
                          if mode == "aggregate" else 0)
        finally:
            target.close()
    finally:
        proc.terminate()
        proc.wait()
    return Run(name, log_level, mode, len(todo), back, max(wall, 1e-9), cpu, aggregated)


def parse_build(text: str) -> tuple[str, Path, tuple[str, ...]]:
    """NAME=BUILD_DIR[:MODES] -> (name, dir, modes); ValueError names what is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise ValueError(f"{text!r}: expected NAME=BUILD_DIR[:MODES]")
    path, _, modes = rest.partition(":")
    chosen = tuple(modes.split(",")) if modes else MODES
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        raise ValueError(f"{text!r}: unknown mode(s) {unknown}: {', '.join(MODES)}")
    build = build_paths(Path(path))
    missing = [str(p) for p in (build.json, build.p4info) if not p.exists()]
    if missing:
        raise ValueError(f"{text!r}: missing {', '.join(missing)}")
    return name, Path(path), chosen


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_bmv2",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("builds", nargs="+", help="NAME=BUILD_DIR[:MODES]")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--packets", type=int, default=512, help="packets per rank")
    ap.add_argument("--window", type=int, default=16, help="slots outstanding at most")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--log-levels", default="off", help="comma-separated BMv2 --log-level values")
    ap.add_argument("--prefix", default="nrpf", help="namespace and veth name prefix")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        builds = [parse_build(b) for b in args.builds]
    except ValueError as e:
        ap.error(str(e))
    if os.geteuid() != 0:
        ap.error("needs root (a network namespace and veth pairs)")
    if not args.in_netns:
        subprocess.run(["ip", "netns", "del", args.prefix], capture_output=True)
        _ip("netns", "add", args.prefix)
        try:
            _ip("-n", args.prefix, "link", "set", "lo", "up")
            cmd = ["ip", "netns", "exec", args.prefix, sys.executable, "-m",
                   "tools.bench_bmv2", "--in-netns",
                   *(argv if argv is not None else sys.argv[1:])]
            return subprocess.run(cmd).returncode
        finally:
            subprocess.run(["ip", "netns", "del", args.prefix], capture_output=True)
    runs: list[Run] = []
    with veth_pairs(args.prefix, args.ranks) as links:
        drivers = {n: open_port(n, drv) for n, (_, drv) in links.items()}
        try:
            for _ in range(args.repeat):
                for name, path, modes in builds:
                    for level in args.log_levels.split(","):
                        for mode in modes:
                            runs.append(run_once(name, path, level, mode, args.ranks,
                                                 args.packets, args.window, links, drivers))
                            print(runs[-1].line(), flush=True)
        finally:
            for p in drivers.values():
                p.sock.close()
    print(f"median of {args.repeat}: us of simple_switch_grpc CPU per frame sent")
    for row in dict.fromkeys(r.row for r in runs):
        mine = [r for r in runs if r.row == row]
        us = statistics.median(r.us_per_frame for r in mine)
        lost = sum(r.frames_in - r.frames_back for r in mine)
        print(f"  {row:32s} {us:8.1f} us/frame  {1e6 / us:7.0f} frames per CPU-s"
              + (f"  ({lost} frames not back)" if lost else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
