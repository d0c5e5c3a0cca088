"""simple_switch_grpc's CPU per frame for builds of a program, on veth pairs: what costs what.

    python -m benchmarks.bench_bmv2 [--ranks 4] [--packets 512] [--window 16] [--repeat 3]
                                [--log-levels off,trace] [--prefix nrpf]
                                NAME=BUILD_DIR[:MODES] ...        # root

BUILD_DIR holds p4c's `netreduce.json` and `netreduce.p4info.txtpb` (`p4c --target bmv2
--arch v1model --p4runtime-files DIR/netreduce.p4info.txtpb -o DIR FILE.p4`, the JSON
renamed if FILE is not netreduce.p4): switch/p4 as built, or a variant of it with a part
removed. MODES (default `forward,aggregate`) as in `benchmarks.bench_targets`, whose traffic and
replay this uses: forward = the ring not registered, every frame L2-forwarded (a build needs
only switch/p4's `l2` table and flood group for it, e.g. docs/bmv2_l2_baseline.p4);
aggregate = the ring registered (every slot's contributions come back as results). The
fabric's roles, each its own mode and build (`tor.json` in build/p4-tor, `spine.json` in
build/p4-spine), on the same ring as 2 racks of 2 ranks (`role_traffic`: the software roles
make the partials and totals, which the role vectors hold to the BMv2 programs byte for
byte): tor = ToR 0 gets its rack's two contributions per slot, sends the partial up, gets
the spine's total (sent as soon as the partial is back) and sends the two results; spine =
the spine gets both ToRs' partials per slot and sends both totals. Each
(build, log level, mode) gets a fresh simple_switch_grpc (`--log-level` as given; BMv2's
default is trace), started and programmed directly (no controller process), in namespace
`<prefix>` on veth pairs `<prefix>sN`/`<prefix>hN`. It reports the switch process's CPU
seconds (utime + stime) per frame sent, and per slot, which on a shared machine move far
less than wall time; runs are interleaved `--repeat` times and the medians of each row
printed last.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from nr_contract.spec import RingSpec
from switch.control.bmv2 import Bmv2Target, ShellSession
from switch.control.bmv2_registers import ThriftRegisters
from switch.control.bmv2_spine import Bmv2SpineTarget
from switch.control.bmv2_tor import Bmv2TorTarget
from switch.control.fabric import Placement, SpineTarget, TorTarget
from switch.dataplane.interswitch import Endpoint, is_interswitch
from switch.dataplane.ports import Port, open_port
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.dataplane.tor import TorConfig, TorPipeline
from switch.p4.program import MAIN, SPINE_MAIN, TOR_MAIN, build_paths
from benchmarks.bench_pipeline import frames, lab_ring
from benchmarks.bench_targets import Answer, replay
from benchmarks.veth import run_ip, veths
from labswitches.bmv2_lab import SIMPLE_SWITCH, wait_listening
from labswitches.fabric_lab import SPINE_IP, SPINE_MAC, tor_ip, tor_mac

GRPC_PORT = 9591
THRIFT_PORT = 9391
MODES = ("forward", "aggregate", "tor", "spine")
PROGRAMS = {"tor": TOR_MAIN, "spine": SPINE_MAIN}     # the roles' programs (else netreduce.p4)
UPLINK = 3                       # ToR 0's uplink: its hosts are on ports 1 and 2
RACKS = (0, 0, 1, 1)             # ranks 0-1 on ToR 0, 2-3 on ToR 1 (the lab's 2 x 2)
SLOTS = 256


@dataclass(frozen=True)
class RoleTraffic:
    """Per slot k, in order: what ToR 0 gets (its rack's two contributions on ports 1-2,
    then the spine's total for it on the uplink) and what the spine gets (the partials of
    ToR 0 on port 1 and of ToR 1 on port 2)."""

    spec: RingSpec
    contributions: list[tuple[int, bytes]]    # ToR 0's, k-major, 2 per slot
    totals: list[bytes]                       # the spine's to ToR 0, one per slot
    partials: list[tuple[int, bytes]]         # the spine's input, k-major, 2 per slot


def tor_config(j: int) -> TorConfig:
    return TorConfig(j, UPLINK, Endpoint(tor_mac(j), tor_ip(j)), Endpoint(SPINE_MAC, SPINE_IP))


def spine_config() -> SpineConfig:
    return SpineConfig(Endpoint(SPINE_MAC, SPINE_IP),
                       {j: (j + 1, Endpoint(tor_mac(j), tor_ip(j))) for j in (0, 1)})


def placement(spec: RingSpec) -> Placement:
    """RACKS, each rack's hosts on ports 1, 2 of its ToR."""
    local: dict[int, dict[str, int]] = {}
    for c in spec.connections:
        rack = local.setdefault(RACKS[c.rank], {})
        rack[c.src_ip] = len(rack) + 1
    return Placement(RACKS, local)


def _through(pipe: TorPipeline | SpinePipeline, port: int, frame: bytes
             ) -> list[tuple[int, bytes]]:
    """What the software role `pipe` sends for `frame` arriving on `port`."""
    out: list[tuple[int, bytes]] = []
    pipe.process(memoryview(bytearray(frame)), port,
                 lambda p, parts: out.append((p, b"".join(parts))))
    return out


def role_traffic(packets: int) -> RoleTraffic:
    """bench_pipeline.frames of 4 ranks (256 B payloads) through the software ToRs and
    spine, slot by slot, every total handed back to its ToR (so slots are reused)."""
    spec = lab_ring(len(RACKS), 256)
    place = placement(spec)
    tors = [TorPipeline(tor_config(j)) for j in (0, 1)]
    for tor in tors:
        TorTarget(tor, lambda mac: None).register_ring(spec, SLOTS, place)
    spine = SpinePipeline(spine_config())
    SpineTarget(spine).register_ring(spec, SLOTS, place)
    traffic = RoleTraffic(spec, [], [], [])
    todo = frames(spec, packets, 256)
    for k in range(packets):
        ups = []
        for c, (_, frame) in zip(spec.connections, todo[k * len(RACKS):(k + 1) * len(RACKS)]):
            rack = RACKS[c.rank]
            port = place.local_ports[rack][c.src_ip]
            if rack == 0:
                traffic.contributions.append((port, frame))
            ups += [(rack + 1, f) for p, f in _through(tors[rack], port, frame) if p == UPLINK]
        traffic.partials.extend(ups)
        for p, total in [out for port, f in ups for out in _through(spine, port, f)]:
            if p == 1:                                 # spine port j + 1: ToR j
                traffic.totals.append(total)
            _through(tors[p - 1], UPLINK, total)
    if len(traffic.totals) != packets or len(traffic.partials) != 2 * packets:
        raise RuntimeError(f"the software roles made {len(traffic.partials)} partials and "
                           f"{len(traffic.totals)} totals for {packets} slots")
    return traffic


@dataclass(frozen=True)
class Run:
    name: str
    log_level: str
    mode: str
    frames_in: int
    frames_back: int
    wall: float              # s, first frame sent .. last frame back
    cpu: float               # s of simple_switch_grpc CPU over the replay
    aggregated: int          # the ring's counter (aggregate, tor), else 0
    slots: int               # slots the replay fed
    expected_back: int       # frames it should have got back (a ToR's partials answered)

    @property
    def row(self) -> str:
        return f"{self.name}/{self.log_level}/{self.mode}"

    @property
    def us_per_frame(self) -> float:
        return self.cpu / self.frames_in * 1e6

    @property
    def us_per_slot(self) -> float:
        return self.cpu / self.slots * 1e6

    def line(self) -> str:
        return (f"{self.row:32s} {self.frames_in} in, {self.frames_back} back in "
                f"{self.wall:6.2f} s ({self.frames_in / self.wall:7.0f}/s); CPU {self.cpu:6.2f} s"
                f" = {self.us_per_frame:7.1f} us/frame in ({1e6 / self.us_per_frame:7.0f} "
                f"frames per CPU-s), {self.us_per_slot:7.1f} us/slot"
                + (f"; aggregated {self.aggregated}" if self.mode in ("aggregate", "tor")
                   else ""))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drain(drivers: dict[int, Port]) -> None:
    """Drop what an earlier run left in the driver sockets (late frames)."""
    for port in drivers.values():
        try:
            while port.sock.recv(65536):
                pass
        except BlockingIOError:
            pass


@dataclass
class Setup:
    """One run's target, programmed, and what the replay sends and expects per slot."""

    target: Bmv2Target | Bmv2TorTarget | Bmv2SpineTarget
    ring_id: str
    todo: list[tuple[int, bytes]]
    per_slot: int                        # frames of `todo` per slot
    back_per_slot: int
    answer: Optional[Answer] = None
    extra_in: int = 0                    # frames sent in answers (a ToR's totals)


def setup(mode: str, session: ShellSession, ports: dict[int, str],
          registers: ThriftRegisters, ranks: int, packets: int,
          roles: Optional[RoleTraffic]) -> Setup:
    """The `mode` run's target on `ports`, its ring registered (not in forward mode)."""
    if mode not in PROGRAMS:
        spec = lab_ring(ranks, 256)
        switch = Bmv2Target(session, ports, {c.src_mac: c.rank + 1 for c in spec.connections},
                            registers)
        if mode == "aggregate":
            switch.register_ring(spec, SLOTS)
        return Setup(switch, spec.ring_id, frames(spec, packets, 256), ranks, ranks)
    assert roles is not None
    spec, place = roles.spec, placement(roles.spec)
    if mode == "spine":
        spine = Bmv2SpineTarget(session, spine_config(), ports,
                                {tor_mac(j): j + 1 for j in (0, 1)}, registers)
        SpineTarget(spine).register_ring(spec, SLOTS, place)       # type: ignore[arg-type]
        return Setup(spine, spec.ring_id, roles.partials, 2, 2)
    macs = {c.src_mac: place.local_ports[0].get(c.src_ip, UPLINK) for c in spec.connections}
    tor = Bmv2TorTarget(session, tor_config(0), ports, {**macs, SPINE_MAC: UPLINK}, registers)
    TorTarget(tor, lambda mac: None).register_ring(spec, SLOTS, place)  # type: ignore[arg-type]
    totals = iter(roles.totals)

    def answer(port: int, frame: bytes) -> Optional[list[tuple[int, bytes]]]:
        """A partial up (they leave in k order): the spine's total of its slot comes down."""
        return [(UPLINK, next(totals))] if port == UPLINK and is_interswitch(frame) else None
    return Setup(tor, spec.ring_id, roles.contributions, 2, 2, answer, len(roles.totals))


def run_once(name: str, build_dir: Path, log_level: str, mode: str, ranks: int,
             packets: int, window: int, links: dict[int, tuple[str, str]],
             drivers: dict[int, Port], roles: Optional[RoleTraffic] = None) -> Run:
    nums = {"tor": [1, 2, UPLINK], "spine": [1, 2]}.get(mode, list(range(1, ranks + 1)))
    ports = {n: links[n][0] for n in nums}
    mine = {n: drivers[n] for n in nums}
    cmd = [SIMPLE_SWITCH, "--device-id", "0", "--thrift-port", str(THRIFT_PORT),
           "--log-level", log_level]
    cmd += [a for n, sw in sorted(ports.items()) for a in ("-i", f"{n}@{sw}")]
    cmd += ["--no-p4", "--", "--grpc-server-addr", f"127.0.0.1:{GRPC_PORT}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    registers = ThriftRegisters(THRIFT_PORT)
    try:
        wait_listening(proc, GRPC_PORT)
        session = ShellSession(f"127.0.0.1:{GRPC_PORT}",
                               build_paths(build_dir, PROGRAMS.get(mode, MAIN)))
        run = setup(mode, session, ports, registers, ranks, packets, roles)
        try:
            _drain(mine)
            cpu0 = cpu_seconds(proc.pid)
            back, wall = replay(run.todo, mine, run.per_slot, window, run.back_per_slot,
                                run.answer)
            cpu = cpu_seconds(proc.pid) - cpu0
            rings = run.target.counters() if mode != "forward" else {}
            rings = rings.get("rings", rings)       # Bmv2Target's, beside its ports
            aggregated = (rings[run.ring_id]["counters"].get("aggregated", 0)
                          if mode != "forward" else 0)
        finally:
            run.target.close()
    finally:
        registers.close()
        proc.terminate()
        proc.wait()
    slots = len(run.todo) // run.per_slot
    return Run(name, log_level, mode, len(run.todo) + run.extra_in, back, max(wall, 1e-9),
               cpu, aggregated, slots, slots * run.back_per_slot)


def parse_build(text: str) -> tuple[str, Path, tuple[str, ...]]:
    """NAME=BUILD_DIR[:MODES] -> (name, dir, modes); ValueError names what is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise ValueError(f"{text!r}: expected NAME=BUILD_DIR[:MODES]")
    path, _, modes = rest.partition(":")
    chosen = tuple(modes.split(",")) if modes else MODES[:2]
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        raise ValueError(f"{text!r}: unknown mode(s) {unknown}: {', '.join(MODES)}")
    roles = {PROGRAMS[m] for m in chosen if m in PROGRAMS}
    if roles and len(chosen) > 1:
        raise ValueError(f"{text!r}: a role's build runs its role's mode alone (tor, spine)")
    build = build_paths(Path(path), *roles)
    missing = [str(p) for p in (build.json, build.p4info) if not p.exists()]
    if missing:
        raise ValueError(f"{text!r}: missing {', '.join(missing)}")
    return name, Path(path), chosen


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_bmv2",
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
        run_ip("netns", "add", args.prefix)
        try:
            run_ip("-n", args.prefix, "link", "set", "lo", "up")
            cmd = ["ip", "netns", "exec", args.prefix, sys.executable, "-m",
                   "benchmarks.bench_bmv2", "--in-netns",
                   *(argv if argv is not None else sys.argv[1:])]
            return subprocess.run(cmd).returncode
        finally:
            subprocess.run(["ip", "netns", "del", args.prefix], capture_output=True)
    runs: list[Run] = []
    roles = (role_traffic(args.packets)
             if any(m in PROGRAMS for _, _, modes in builds for m in modes) else None)
    with veths(args.prefix, max(args.ranks, UPLINK)) as links:
        drivers = {n: open_port(n, drv) for n, (_, drv) in links.items()}
        try:
            for _ in range(args.repeat):
                for name, path, modes in builds:
                    for level in args.log_levels.split(","):
                        for mode in modes:
                            runs.append(run_once(name, path, level, mode, args.ranks,
                                                 args.packets, args.window, links, drivers,
                                                 roles))
                            print(runs[-1].line(), flush=True)
        finally:
            for p in drivers.values():
                p.sock.close()
    print(f"median of {args.repeat}: us of simple_switch_grpc CPU per frame sent in, per slot")
    for row in dict.fromkeys(r.row for r in runs):
        mine = [r for r in runs if r.row == row]
        us = statistics.median(r.us_per_frame for r in mine)
        slot = statistics.median(r.us_per_slot for r in mine)
        lost = sum(r.expected_back - r.frames_back for r in mine)
        print(f"  {row:32s} {us:8.1f} us/frame  {1e6 / us:7.0f} frames per CPU-s  "
              f"{slot:8.1f} us/slot" + (f"  ({lost} frames not back)" if lost else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
