"""Command line for the switch controller: prints each answer as JSON.

    python -m switch.ctl [--addr HOST:PORT] ping | counters | unregister RING_ID
                                            | register SPEC.json [--slots N]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from ring_setup.spec import RingSpec
from switch.controller import DEFAULT_ADDR, ControllerClient, ControllerError


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m switch.ctl", description=__doc__.splitlines()[0])
    ap.add_argument("--addr", default=DEFAULT_ADDR, help=f"controller (default {DEFAULT_ADDR})")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ping", help="is the controller there, which target")
    sub.add_parser("counters", help="ring, connection and port counters")
    p = sub.add_parser("unregister", help="remove a ring")
    p.add_argument("ring_id")
    p = sub.add_parser("register", help="register a ring from a RingSpec JSON file")
    p.add_argument("spec", type=Path)
    p.add_argument("--slots", type=int, default=None)
    args = ap.parse_args(argv)
    with ControllerClient(args.addr, args.timeout) as client:
        try:
            if args.cmd == "ping":
                out = client.ping()
            elif args.cmd == "counters":
                out = client.counters()
            elif args.cmd == "unregister":
                out = client.unregister_ring(args.ring_id)
            else:
                out = client.register_ring(RingSpec.from_json(args.spec.read_text()), args.slots)
        except ControllerError as e:
            print(f"switch.ctl: {e}", file=sys.stderr)
            return 1
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
