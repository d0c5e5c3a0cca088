"""Both switch targets side by side on the same recorded contribution traffic, on veth pairs.

    python -m benchmarks.bench_targets [--targets soft,bmv2] [--ranks 4] [--packets 4096]
                                   [--payload 256] [--window 64] [--json FILE]

For each target, a fresh switch process (`python -m switch` or `python -m labswitches.bmv2_lab`:
the same command line, as in the lab) gets one port per rank, a veth pair each
(`nrbsN` switch side, `nrbhN` driver side: benchmarks.veth), and a controller on 127.0.0.1. The driver
replays `benchmarks.bench_pipeline.frames` (every rank's RDMA WRITE packet k, k-major, 256 B
payloads by default: BMv2's most; --payload 128 halves the elements) into the driver sides, keeping at most `window` slots
outstanding (rxe keeps at most 128 PSNs unacknowledged), and counts what comes back:
  - forward: the ring is not registered, every frame is L2-forwarded to its receiver;
  - aggregate: the ring is registered, every slot's n contributions become n results.
It reports frames in and out per second and, for aggregate, the target's own ring counters
(aggregated, completed, drops): aggregated packets/s and results/s.

Runs as root in its own network namespace, `nrlab` (the lab's: it takes the lab's
machine-wide lock, /run/lock/netreduce-lab.lock, for the whole run).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from nr_contract.client import ControllerClient
from switch.dataplane.interswitch import is_interswitch
from switch.dataplane.packets import parse
from switch.dataplane.ports import Port, open_port
from benchmarks.bench_pipeline import frames, lab_ring
from benchmarks.veth import make_veths, remove_veths, run_ip

NETNS = "nrlab"
LOCK = Path("/run/lock/netreduce-lab.lock")
MODULES = {"soft": "switch", "bmv2": "labswitches.bmv2_lab"}
CONTROLLER = "127.0.0.1:50199"
PATH_MTU = 256               # the ring's: BMv2's limit (switch/p4/limits.p4)
START_TIMEOUT = 120.0        # s (a first bmv2 start compiles switch/p4)
QUIET = 2.0                  # s without any frame back: the run is over (lost frames)


@dataclass(frozen=True)
class Result:
    target: str
    mode: str                # "forward" or "aggregate"
    frames_in: int           # frames the driver sent
    frames_out: int          # frames that came back (forwarded, or results)
    seconds: float           # first frame sent .. last frame back
    counters: dict           # the ring's counters (aggregate), else {}

    @property
    def in_per_s(self) -> float:
        return self.frames_in / self.seconds

    @property
    def out_per_s(self) -> float:
        return self.frames_out / self.seconds

    def line(self) -> str:
        text = (f"{self.target:5s} {self.mode:9s} {self.frames_in} frames in, "
                f"{self.frames_out} out in {self.seconds:.2f} s: {self.in_per_s / 1e3:7.2f} "
                f"kframes/s in, {self.out_per_s / 1e3:7.2f} kframes/s out")
        if self.counters:
            c = self.counters
            drops = {k: v for k, v in c.items() if k.startswith("drop_") and v}
            text += (f"; ring: aggregated {c['aggregated']} ({c['aggregated'] / self.seconds / 1e3:.2f}"
                     f" k/s), completed {c['completed']}, results_sent {c['results_sent']}"
                     f", drops {drops or 0}")
        return text


def credentials(log: Path) -> Path:
    """Where the switch logging to `log` keeps the credentials it makes (its defaults)."""
    return log.parent / "credentials"


@contextmanager
def switch_process(kind: str, ports: dict[int, str], macs: dict[str, int],
                   log: Path) -> Iterator[subprocess.Popen]:
    """The `kind` switch on `ports` with its controller at CONTROLLER, until the block ends;
    it keeps the token file it makes in `credentials(log)`."""
    ready = log.with_suffix(".ready")
    ready.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", MODULES[kind], "--controller", CONTROLLER,
           "--credentials-dir", str(credentials(log)), "--ready-file", str(ready)]
    cmd += [a for n, ifname in sorted(ports.items()) for a in ("--port", f"{n}={ifname}")]
    cmd += [a for mac, n in macs.items() for a in ("--mac", f"{mac}={n}")]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"the {kind} switch exited at start ({proc.returncode}): "
                                   f"{log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {kind} switch was not ready in {START_TIMEOUT:.0f} s")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


# A frame back on a driver port -> frames to send in answer (counted as not back), or None:
# it counts as back (bench_bmv2's ToR: a partial is answered with its slot's total).
Answer = Callable[[int, bytes], Optional[Sequence[tuple[int, bytes]]]]


def replay(todo: Sequence[tuple[int, bytes]], ports: dict[int, Port], ranks: int,
           window: int, back_per_slot: Optional[int] = None,
           answer: Optional[Answer] = None) -> tuple[int, float]:
    """Send `todo` (k-major, `ranks` frames per slot) keeping at most `window` slots without
    all their `back_per_slot` (default `ranks`) frames back; a RoCE or inter-switch frame
    back counts, unless `answer` answers it. (Frames back, seconds first send .. last frame.)"""
    socks = {p.sock.fileno(): (num, p.sock) for num, p in ports.items()}
    slots = len(todo) // ranks
    per_slot = back_per_slot or ranks
    sent = back = 0
    buf = bytearray(65536)
    t0 = last = time.perf_counter()
    while back < slots * per_slot:
        while sent < slots and sent - back // per_slot < window:
            for port, frame in todo[sent * ranks:(sent + 1) * ranks]:
                ports[port].sock.send(frame)
            sent += 1
        ready, _, _ = select.select(list(socks), [], [], QUIET)
        if not ready:
            break                              # lost frames: report what came back
        for fd in ready:
            num, sock = socks[fd]
            while True:
                try:
                    n = sock.recv_into(buf)
                except BlockingIOError:
                    break
                frame = memoryview(buf)[:n]
                if parse(frame) is None and not is_interswitch(frame):
                    continue                   # neither RoCEv2 nor a fabric's message
                reply = answer(num, bytes(frame)) if answer else None
                if reply is None:
                    back += 1
                    last = time.perf_counter()
                for port, out in reply or ():
                    ports[port].sock.send(out)
    return back, last - t0


def bench(kind: str, ranks: int, packets: int, payload: int, window: int,
          logdir: Path) -> list[Result]:
    spec = lab_ring(ranks, PATH_MTU)
    todo = frames(spec, packets, payload)
    links = make_veths("nrb", ranks)
    drivers = {num: open_port(num, drv) for num, (_, drv) in links.items()}
    macs = {c.src_mac: c.rank + 1 for c in spec.connections}
    out = []
    try:
        for mode in ("forward", "aggregate"):
            log = logdir / f"{kind}.log"
            with switch_process(kind, {n: sw for n, (sw, _) in links.items()}, macs, log):
                with ControllerClient(CONTROLLER, timeout=30,
                                      token_file=credentials(log) / "controller.token") as ctl:
                    if mode == "aggregate":
                        ctl.register_ring(spec, 256)
                    back, seconds = replay(todo, drivers, ranks, window)
                    counters = (ctl.counters()["rings"][spec.ring_id]["counters"]
                                if mode == "aggregate" else {})
            out.append(Result(kind, mode, len(todo), back, seconds, counters))
            print(out[-1].line(), flush=True)
    finally:
        for p in drivers.values():
            p.sock.close()
        remove_veths(links)
    return out


@contextmanager
def lab_namespace() -> Iterator[None]:
    """The lab's lock held and a fresh namespace NETNS (lo up), removed afterwards."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as lock:
        print(f"bench_targets: waiting for the lab lock {LOCK}", file=sys.stderr, flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
        run_ip("netns", "add", NETNS)
        try:
            run_ip("-n", NETNS, "link", "set", "lo", "up")
            yield
        finally:
            subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_targets",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--targets", default="soft,bmv2", help="comma-separated: soft, bmv2")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--packets", type=int, default=4096, help="packets per rank")
    ap.add_argument("--payload", type=int, default=PATH_MTU,
                    help=f"payload bytes per packet, a multiple of 4 up to {PATH_MTU}")
    ap.add_argument("--window", type=int, default=64, help="slots outstanding at most")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    kinds = args.targets.split(",")
    unknown = [k for k in kinds if k not in MODULES]
    if unknown:
        ap.error(f"unknown target(s) {unknown}: soft, bmv2")
    if args.payload % 4 or not 0 < args.payload <= PATH_MTU:
        ap.error(f"--payload {args.payload}: a multiple of 4 in 4..{PATH_MTU}")
    if os.geteuid() != 0:
        ap.error("needs root (a network namespace and veth pairs)")
    if not args.in_netns:
        with lab_namespace():
            cmd = ["ip", "netns", "exec", NETNS, sys.executable, "-m", "benchmarks.bench_targets",
                   "--in-netns", *(argv if argv is not None else sys.argv[1:])]
            return subprocess.run(cmd).returncode
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_targets.") as tmp:
        for kind in kinds:
            results += bench(kind, args.ranks, args.packets, args.payload, args.window,
                             Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(
            {"ranks": args.ranks, "packets_per_rank": args.packets, "payload": args.payload,
             "window": args.window,
             "results": [{**asdict(r), "in_per_s": r.in_per_s, "out_per_s": r.out_per_s}
                         for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
