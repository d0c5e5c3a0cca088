"""`python -m switch`: the software switch process (data plane + optional controller).

Runs until SIGTERM/SIGINT, then prints the per-port counters. SIGUSR1 prints them (and
writes --stats-file) without stopping.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from switch.controller import (DEFAULT_LEASE_MS, DEFAULT_MAX_RINGS, DEFAULT_MAX_SLOT_MEMORY,
                               MAX_RINGS_CEILING, ControllerConfig, SoftwareTarget, TlsFiles,
                               serve)
from switch.dataplane import DEFAULT_MAC_AGEING, DEFAULT_MAC_TABLE_SIZE, DataPlane
from switch.pipeline import AggregationPipeline
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
                    help="a static MAC table entry: never moved by learning, and the only way "
                         "a ring's ports are found (give every host's MAC)")
    ap.add_argument("--controller", metavar="ADDR:PORT",
                    help="serve the controller's gRPC API here and aggregate registered rings; "
                         "without it the switch only forwards")
    ap.add_argument("--mac-table-size", type=int, default=DEFAULT_MAC_TABLE_SIZE, metavar="N",
                    help="most learned MAC entries (static ones not counted); a new MAC "
                         f"beyond it is not learned (default {DEFAULT_MAC_TABLE_SIZE})")
    ap.add_argument("--mac-ageing", type=float, default=DEFAULT_MAC_AGEING, metavar="S",
                    help=f"a learned MAC unseen for S seconds is forgotten (default "
                         f"{DEFAULT_MAC_AGEING:g})")
    ctl = ap.add_argument_group("controller (with --controller)")
    ctl.add_argument("--token-file", type=Path, metavar="FILE",
                     help="lines 'PRINCIPAL SECRET': every call but Ping must carry one of "
                          "these secrets (default: no credentials asked)")
    ctl.add_argument("--tls-cert", type=Path, metavar="PEM",
                     help="serve TLS with this certificate (with --tls-key)")
    ctl.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's key")
    ctl.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS, metavar="MS",
                     help="a registration's lease when the client asks for none; a ring not "
                          f"renewed within its lease is unregistered (default {DEFAULT_LEASE_MS})")
    ctl.add_argument("--max-rings", type=int, default=DEFAULT_MAX_RINGS, metavar="N",
                     help=f"rings registered at once (default {DEFAULT_MAX_RINGS}, at most "
                          f"{MAX_RINGS_CEILING})")
    ctl.add_argument("--max-slot-memory", type=int, default=DEFAULT_MAX_SLOT_MEMORY,
                     metavar="BYTES",
                     help="aggregator memory over all rings, slots x (ranks + 1) x MTU each; "
                          f"0: no limit (default {DEFAULT_MAX_SLOT_MEMORY})")
    ctl.add_argument("--max-in-flight", type=int, default=0, metavar="PACKETS",
                     help="the target's pace, published to clients: rings keep at most this "
                          "many packets unacknowledged per connection (0: only the slots "
                          "bound it; default 0)")
    ctl.add_argument("--ack-timeout", type=int, default=0, metavar="EXP",
                     help="the target's pace, published to clients: rings use a QP local ACK "
                          "timeout of at least 4.096 us x 2^EXP (0: the hosts' default, 14 = "
                          "67 ms; default 0)")
    ap.add_argument("--stats-file", type=Path,
                    help="write the counters as JSON here on SIGUSR1 and on exit")
    ap.add_argument("--ready-file", type=Path,
                    help="created once every port is open and the controller listens")
    return ap


def controller_options(args: argparse.Namespace) -> dict[str, Any]:
    """serve()'s keyword arguments from the command line; ValueError says what is wrong."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = TlsFiles(args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    return {"config": ControllerConfig.with_token_file(
                args.token_file, max_rings=args.max_rings,
                max_slot_memory=args.max_slot_memory, default_lease_ms=args.lease_ms,
                max_in_flight=args.max_in_flight, ack_timeout=args.ack_timeout),
            "tls": tls}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="switch: %(levelname)s %(name)s: %(message)s")
    ports = dict(args.port)
    if len(ports) != len(args.port):
        print("switch: a port number is given twice", file=sys.stderr)
        return 2
    try:
        options = controller_options(args) if args.controller else {}
    except ValueError as e:
        print(f"switch: {e}", file=sys.stderr)
        return 2
    try:
        dp = DataPlane(ports, static_macs=dict(args.mac), mac_table_size=args.mac_table_size,
                       mac_ageing=args.mac_ageing)
    except ValueError as e:
        print(f"switch: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"switch: cannot open ports {ports}: {e}", file=sys.stderr)
        return 1
    server = None
    if args.controller:
        pipeline = AggregationPipeline()
        target = SoftwareTarget(pipeline, dp.static_port_of_mac, dp.port_counters,
                                dp.switch_counters)
        dp.pipeline, dp.describe_connection = pipeline, target.describe_connection
        try:
            server, _ = serve(target, args.controller, **options)
        except OSError as e:
            print(f"switch: controller: {e}", file=sys.stderr)
            return 1
        if args.token_file is None:
            logging.getLogger("switch").warning(
                "controller on %s without --token-file: anyone who reaches it can register "
                "and unregister rings", args.controller)

    def counters() -> dict:
        out = {"ports": dp.port_counters(), "mac_table": dp.mac_table_view(),
               "switch": dp.switch_counters()}
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
            server.stop()
        dump()
        dp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
