"""`netreduce-switch --target native`: the single switch on the C data plane (switch/native).

libnrio opens every --port (an AF_XDP socket in copy mode, or the AF_PACKET fallback where
none can be had: logged, and counted as the port's `fallback` and the switch's
`fallback_ports`), and `--workers` threads run every frame through their libnrdp pipeline;
the controller (`switch.control.service`) programs them through `NativeTarget`. No Python
runs per packet. Invariant: the pipelines' L2 table is the static port map (--mac) alone:
a frame that is no registered ring's goes to its destination MAC's port, or is flooded to
every other port (the native switch learns no MACs; give every host's MAC).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from switch.control.native_target import NativeTarget
from switch.dataplane.router import one_armed_router
from switch.control.service import serve
from switch.native.binding import NativePipeline, NativeRouter
from switch.native.nrio import NativeIO
from switch.report import report

log = logging.getLogger(__name__)
MAX_CONNS = 1024          # connections per worker's pipeline (open-addressed, fixed at start)


def native_ports(args: argparse.Namespace) -> dict[int, int]:
    """--port-worker as port -> worker (every port on worker 0 unless said); ValueError
    names a port or worker that does not exist, and options only the software switch has."""
    if args.role != "switch":
        raise ValueError(f"--target native runs --role switch only, not {args.role}")
    if args.one_armed and args.workers != 1:
        raise ValueError(f"--one-armed: one port, one worker (not --workers {args.workers})")
    if args.one_armed and args.xdp_mode not in ("auto", "af_packet"):
        raise ValueError(f"--one-armed: --xdp-mode af_packet, not {args.xdp_mode} (an AF_XDP "
                         "socket takes every frame from the server's kernel: its ARP and its "
                         "controller's connections too)")
    if args.tx_loss:
        raise ValueError("--tx-loss is the software switch's: with --target native, emulate "
                         "loss with tc netem on the links")
    if args.workers < 1:
        raise ValueError(f"--workers {args.workers}: at least 1")
    ports = dict(args.port)
    worker_of = dict(args.port_worker)
    bad = sorted(p for p, w in worker_of.items() if p not in ports or w >= args.workers)
    if bad:
        raise ValueError(f"--port-worker: port(s) {bad} not a --port, or worker not below "
                         f"--workers {args.workers}")
    return {p: worker_of.get(p, 0) for p in ports}


IFF_LOOPBACK = 0x8


def check_interfaces(ports: dict[int, str]) -> None:
    """OSError naming every --port interface this namespace does not have, and any that is
    a loopback (a program on it would take the machine's own local traffic: its store,
    its controller, ssh's forwards)."""
    missing, loopback = [], []
    for n, ifname in sorted(ports.items()):
        try:
            socket.if_nametoindex(ifname)
        except OSError:
            missing.append(f"{n}={ifname}")
            continue
        flags = Path(f"/sys/class/net/{ifname}/flags")
        if flags.exists() and int(flags.read_text(), 16) & IFF_LOOPBACK:
            loopback.append(f"{n}={ifname}")
    if missing:
        raise OSError(f"no such interface: {', '.join(missing)} (ip link shows this "
                      "namespace's)")
    if loopback:
        raise OSError(f"a loopback interface is not a switch port: {', '.join(loopback)} "
                      "(its traffic is this machine's own)")


def run_native(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Open the ports, start the workers, serve the controller (with --controller) until
    SIGTERM/SIGINT, then print and write the counters."""
    try:
        worker_of = native_ports(args)
        router = one_armed_router(args, dict(args.port))
    except ValueError as e:
        print(f"switch: {e}", file=sys.stderr)
        return 2
    ports = dict(args.port)
    macs = dict(args.mac)
    pipes: list[NativePipeline] = []
    routers: list[NativeRouter] = []
    try:
        check_interfaces(ports)
        mode = "af_packet" if router is not None else args.xdp_mode
        io = NativeIO(ports, workers=args.workers, worker_of=worker_of, mode=mode)
    except (OSError, ValueError) as e:
        print(f"switch: cannot open ports {ports}: {e}", file=sys.stderr)
        return 1
    try:
        for _ in range(args.workers):
            pipes.append(NativePipeline(max_rings=args.max_rings, max_conns=MAX_CONNS))
            pipes[-1].set_l2(macs, sorted(ports))
        if router is not None:
            routers.append(NativeRouter(pipes[0], router))
        target = NativeTarget(io, pipes, macs, args.max_rings, *routers)
        io.start([p.address for p in pipes])
    except (OSError, ValueError) as e:
        print(f"switch: native data plane: {e}", file=sys.stderr)
        _close(io, pipes, routers, started=False)
        return 1
    server = None
    if args.controller:
        try:
            server, _ = serve(target, args.controller, **options)
        except (OSError, ValueError) as e:
            print(f"switch: controller: {e}", file=sys.stderr)
            _close(io, pipes, routers, started=True)
            return 1

    def dump(*_: object) -> None:
        report({**target.counters(), "workers": io.worker_stats()}, args.stats_file)

    stop = threading.Event()
    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    kinds = {n: c["kind"] for n, c in io.port_counters().items()}
    print(f"switch: native, {args.workers} worker(s): ports "
          + ", ".join(f"{n}={i} ({kinds[n]}, worker {worker_of[n]})" for n, i in ports.items())
          + (f"; controller on {args.controller}" if args.controller else "; forwarding only"),
          file=sys.stderr, flush=True)
    if args.ready_file:
        args.ready_file.write_text(str(os.getpid()))
    try:
        while not stop.wait(1.0):
            pass
    finally:
        if server is not None:
            server.stop(None)
        dump()
        _close(io, pipes, routers, started=True)
    return 0


def _close(io: NativeIO, pipes: list[NativePipeline], routers: list[NativeRouter],
           started: bool) -> None:
    """Join the workers before their routers and pipelines go."""
    if started:
        io.stop()
    io.close()
    for r in routers:
        r.close()
    for p in pipes:
        p.close()
