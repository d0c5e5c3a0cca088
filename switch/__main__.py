"""`python -m switch`: the software switch process (data plane + optional controller).

Runs until SIGTERM/SIGINT, then prints the per-port counters. SIGUSR1 prints them (and
writes --stats-file) without stopping.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from switch.dataplane import DataPlane
from switch.report import report


def _port_arg(text: str) -> tuple[int, str]:
    num, sep, ifname = text.partition("=")
    if not sep or not num.isdigit() or not ifname:
        raise argparse.ArgumentTypeError(f"expected N=IFNAME, got {text!r}")
    return int(num), ifname


def _mac_arg(text: str) -> tuple[str, int]:
    mac, sep, num = text.partition("=")
    if not sep or not num.isdigit():
        raise argparse.ArgumentTypeError(f"expected MAC=PORT, got {text!r}")
    return mac.lower(), int(num)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m switch",
        description="NetReduce software switch: forwards frames between its ports by MAC "
                    "(learned, or configured with --mac) and, with --controller, aggregates the "
                    "RoCE traffic of rings registered over gRPC (docs/pipeline.md).")
    ap.add_argument("--port", action="append", type=_port_arg, required=True, metavar="N=IFNAME",
                    help="attach switch port N to interface IFNAME (repeat for every port)")
    ap.add_argument("--mac", action="append", type=_mac_arg, default=[], metavar="MAC=PORT",
                    help="a static MAC table entry (learning still fills in the rest)")
    ap.add_argument("--controller", metavar="ADDR:PORT",
                    help="serve the controller's gRPC API here and aggregate registered rings; "
                         "without it the switch only forwards")
    ap.add_argument("--stats-file", type=Path,
                    help="write the counters as JSON here on SIGUSR1 and on exit")
    ap.add_argument("--ready-file", type=Path,
                    help="created once every port is open and the controller listens")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ports = dict(args.port)
    if len(ports) != len(args.port):
        print("switch: a port number is given twice", file=sys.stderr)
        return 2
    try:
        dp = DataPlane(ports, static_macs=dict(args.mac))
    except OSError as e:
        print(f"switch: cannot open ports {ports}: {e}", file=sys.stderr)
        return 1
    server = None
    if args.controller:
        from switch.controller import SoftwareTarget, serve
        from switch.pipeline import AggregationPipeline
        dp.pipeline = pipeline = AggregationPipeline()
        try:
            server, _ = serve(SoftwareTarget(pipeline, dp.port_of_mac, dp.port_counters),
                              args.controller)
        except OSError as e:
            print(f"switch: controller: {e}", file=sys.stderr)
            return 1

    def counters() -> dict:
        out = {"ports": dp.port_counters(), "mac_table": dp.mac_table_view()}
        if server is not None:
            out["rings"] = pipeline.counters()
        return out

    def dump(*_: object) -> None:
        report(counters(), args.stats_file)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGTERM, lambda *_: dp.stop())
    signal.signal(signal.SIGINT, lambda *_: dp.stop())
    print(f"switch: ports {', '.join(f'{n}={i}' for n, i in ports.items())}"
          + (f"; controller on {args.controller}" if args.controller else "; forwarding only"),
          file=sys.stderr, flush=True)
    if args.ready_file:
        args.ready_file.write_text(str(os.getpid()))
    try:
        dp.run()
    finally:
        if server is not None:
            server.stop(grace=None)
        dump()
        dp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
