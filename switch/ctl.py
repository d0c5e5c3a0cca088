"""Command line for the switch controller: prints each answer as JSON.

    python -m switch.ctl [--addr HOST:PORT] [--token-file F] [--ca-file F] CMD
        ping | counters [--ring ID] [--connections] | register SPEC.json [--slots N]
        [--lease-ms MS] | renew RING_ID | unregister RING_ID

Credentials as the host library's: --token-file (else $NR_CONTROLLER_TOKEN), --ca-file
(else $NR_CONTROLLER_CA) for TLS.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from nr_contract.client import DEFAULT_ADDR, ControllerClient, ControllerError
from nr_contract.distribution import add_version
from nr_contract.tokens import TokenFileError
from nr_contract.spec import RingSpec


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="netreduce-ctl", description=__doc__.splitlines()[0])
    add_version(ap)
    ap.add_argument("--addr", default=DEFAULT_ADDR, help=f"controller (default {DEFAULT_ADDR})")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    ap.add_argument("--token-file", type=Path,
                    help="token file whose first secret is sent (default $NR_CONTROLLER_TOKEN)")
    ap.add_argument("--ca-file", type=Path,
                    help="connect with TLS, verifying the switch with this CA "
                         "(default $NR_CONTROLLER_CA; neither: no TLS)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ping", help="is the controller there, which target, its limits")
    p = sub.add_parser("counters", help="ring, port and switch counters")
    p.add_argument("--ring", help="only this ring")
    p.add_argument("--connections", action="store_true", help="per-connection detail")
    p = sub.add_parser("unregister", help="remove a ring")
    p.add_argument("ring_id")
    p = sub.add_parser("renew", help="renew a ring's lease")
    p.add_argument("ring_id")
    p = sub.add_parser("register", help="register a ring from a RingSpec JSON file")
    p.add_argument("spec", type=Path)
    p.add_argument("--slots", type=int, default=None)
    p.add_argument("--lease-ms", type=int, default=None)
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
        print(f"switch.ctl: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
