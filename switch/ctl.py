"""netreduce-ctl (= python -m switch.ctl): the switch controller's command line; prints
each answer as JSON.

    netreduce-ctl [--addr HOST:PORT] [--token-file F] [--ca-file F] CMD
        ping | counters [--ring ID] [--connections] | register SPEC.json [--slots N]
        [--lease-ms MS] | renew RING_ID | unregister RING_ID

The controller and the credentials as the host library finds them: --addr (else
$NR_CONTROLLER, which the lab sets, else the lab's 10.77.0.254:50051), --token-file (else
$NR_CONTROLLER_TOKEN), --ca-file (else $NR_CONTROLLER_CA) for TLS.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Optional, Sequence

from nr_contract.client import DEFAULT_ADDR, ControllerClient, ControllerError
from nr_contract.distribution import HelpFormatter, add_version
from nr_contract.spec import RingSpec
from nr_contract.tokens import ADDR_ENV, TokenFileError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="netreduce-ctl", description=__doc__,
                                 formatter_class=HelpFormatter)
    add_version(ap)
    ap.add_argument("--addr", default=os.environ.get(ADDR_ENV) or DEFAULT_ADDR,
                    metavar="HOST:PORT",
                    help=f"the controller's address (default %(default)s: ${ADDR_ENV} when "
                         f"set, else {DEFAULT_ADDR})")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    ap.add_argument("--token-file", type=Path,
                    help="token file whose first secret is sent (default $NR_CONTROLLER_TOKEN)")
    ap.add_argument("--ca-file", type=Path,
                    help="connect with TLS, verifying the switch with this CA "
                         "(default $NR_CONTROLLER_CA; neither: no TLS)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="CMD")

    def command(name: str, summary: str, detail: str) -> argparse.ArgumentParser:
        text = (f"{summary}: {detail} The options --addr, --timeout, --token-file and "
                "--ca-file go before CMD (netreduce-ctl --help).")
        return sub.add_parser(name, help=summary, description=textwrap.fill(text, 88),
                              formatter_class=HelpFormatter)
    command("ping", "is the controller there, which target, its limits",
            "prints the target's kind (software, bmv2, fabric, ...), the limits it enforces "
            "(path MTUs, slots, ranks, rings and free rings, slot memory, default lease) and "
            "the pace it publishes (max_in_flight, ack_timeout), and whether its other calls "
            "need credentials. Ping itself needs none.")
    p = command("counters", "ring, port and switch counters",
                "prints every ring's counters that the caller may see (an admin sees all), "
                "and the ports' and switch's totals.")
    p.add_argument("--ring", metavar="RING_ID", help="only this ring")
    p.add_argument("--connections", action="store_true",
                   help="each connection's counters too")
    p = command("unregister", "remove a ring", "the ring stops being aggregated at once.")
    p.add_argument("ring_id", help="the ring's id, as register printed it")
    p = command("renew", "renew a ring's lease",
                "prints the lease granted, in ms from now.")
    p.add_argument("ring_id", help="the ring's id, as register printed it")
    p = command("register", "register a ring from a RingSpec JSON file",
                "prints its id, slots, ports and lease.")
    p.add_argument("spec", type=Path,
                   help="the RingSpec as JSON (nr_contract.spec.RingSpec.to_json)")
    p.add_argument("--slots", type=int, default=None,
                   help="aggregator slots for the ring (default: the switch's choice)")
    p.add_argument("--lease-ms", type=int, default=None,
                   help="the lease asked for (default: the switch's, its --lease-ms)")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        with ControllerClient(args.addr, args.timeout, token_file=args.token_file,
                              ca_file=args.ca_file) as client:
            if args.cmd == "ping":
                out = client.ping()
            elif args.cmd == "counters":
                out = client.counters(args.ring, connections=args.connections)
            elif args.cmd == "unregister":
                out = client.unregister_ring(args.ring_id)
            elif args.cmd == "renew":
                out = client.renew_lease(args.ring_id)
            else:
                spec = RingSpec.from_json(args.spec.read_text())
                out = client.register_ring(spec, args.slots, args.lease_ms)
    except (ControllerError, TokenFileError, OSError, TypeError, ValueError) as e:
        print(f"{ap.prog}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
