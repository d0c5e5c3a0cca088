"""`python -m switch`: the switch process (data plane + optional controller).

`--target soft` (default) runs the Python data plane; `--target native` the C one
(switch/native: AF_XDP, worker threads; `switch.daemon_native`), with the same ports, static
MACs, controller and files (--role switch only; no --tx-loss: use tc netem).

`--role switch` (default) is the single switch; `--role tor` / `--role spine` are the two
tiers of a fabric (docs/multirack.md: a ToR's or the spine's pipeline, its own ports,
counters and control API, which takes rings only from the fabric's controller);
`--role fabric` is that controller alone, with no ports: the job's one address, programming
the ToRs and the spine through their control APIs (`switch.control.fabric_rpc`).
Runs until SIGTERM/SIGINT, then prints the per-port counters. SIGUSR1 prints them (and
writes --stats-file, mode 0600) without stopping.

Secure by default (docs/security.md): a controller asks every caller for a secret of its
token file (without --token-file it makes one, `switch.control.credentials`) and, on an
address other hosts reach, serves TLS (without --tls-cert it makes a self-signed
certificate); with two principals or more it needs --hosts-policy. Only --insecure, said in
so many words, serves without credentials or in clear text to the network.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Collection

from nr_contract.client import ControllerError, local_address
from nr_contract.distribution import HelpFormatter, add_version
from switch.control import credentials
from switch.control.fabric import FabricTarget, SpineTarget, TorTarget
from switch.control.fabric_rpc import SpineClient, SpineSwitch, TorClient, TorSwitch
from switch.control.config import (DEFAULT_CALLS_PER_SECOND, DEFAULT_LEASE_MS, DEFAULT_MAX_RINGS,
                                   DEFAULT_MAX_SLOT_MEMORY, MAX_RINGS_CEILING, ControllerConfig)
from switch.control.service import TlsFiles, serve
from switch.control.target import SoftwareTarget, Target
from switch.dataplane.interswitch import Endpoint
from switch.dataplane.pipeline import AggregationPipeline
from switch.dataplane.router import one_armed_router, parse_mac
from switch.dataplane.ports import DEFAULT_MAC_AGEING, DEFAULT_MAC_TABLE_SIZE, DataPlane
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.dataplane.tor import TorConfig, TorPipeline
from switch.control.private import check_directory
from switch.daemon_native import run_native
from switch.native.nrio import MODES
from switch.report import report

ROLES = ("switch", "tor", "spine", "fabric")
TARGETS = ("soft", "native")


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


def _neighbor_arg(text: str) -> tuple[str, str]:
    ip, sep, mac = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected IP=MAC")
    try:
        ipaddress.IPv4Address(ip)
        parse_mac(mac)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return ip, mac


def _port_worker_arg(text: str) -> tuple[int, int]:
    num, sep, worker = text.partition("=")
    if not sep or not num.isdigit() or not worker.isdigit():
        raise argparse.ArgumentTypeError(f"expected PORT=WORKER, got {text!r}")
    return int(num), int(worker)


def _loss_arg(text: str) -> tuple[int, float]:
    port, sep, pct = text.partition("=")
    try:
        loss = float(pct) / 100
    except ValueError:
        loss = -1.0
    if not sep or not port.isdigit() or not 0 <= loss < 1:
        raise argparse.ArgumentTypeError(f"expected PORT=PCT (0 <= PCT < 100), got {text!r}")
    return int(port), loss


def _endpoint_arg(text: str) -> Endpoint:
    mac, sep, ip = text.partition(",")
    if not sep or mac.count(":") != 5 or ip.count(".") != 3:
        raise argparse.ArgumentTypeError(f"expected MAC,IP, got {text!r}")
    return Endpoint(mac.lower(), ip)


def _tor_arg(text: str) -> tuple[int, tuple[int, Endpoint]]:
    """J=PORT,MAC,IP: ToR J hangs on spine port PORT with these addresses."""
    tor, sep, rest = text.partition("=")
    port, _, addr = rest.partition(",")
    if not sep or not tor.isdigit() or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected J=PORT,MAC,IP, got {text!r}")
    return int(tor), (int(port), _endpoint_arg(addr))


def _tor_addr_arg(text: str) -> tuple[int, str]:
    tor, sep, addr = text.partition("=")
    if not sep or not tor.isdigit() or ":" not in addr:
        raise argparse.ArgumentTypeError(f"expected J=HOST:PORT, got {text!r}")
    return int(tor), addr


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="netreduce-switch", formatter_class=HelpFormatter,
        description="NetReduce switch: forwards frames between its ports by MAC "
                    "(learned, or configured with --mac) and, with --controller, aggregates the "
                    "RoCE traffic of rings registered over gRPC (docs/pipeline.md). "
                    "--target native runs the same pipeline in C (switch/native/README.md).")
    add_version(ap)
    ap.add_argument("--role", choices=ROLES, default="switch",
                    help="switch: one switch; tor / spine: a tier of a two-tier fabric; "
                         "fabric: the fabric's controller (no ports)")
    ap.add_argument("--target", choices=TARGETS, default="soft",
                    help="soft: the Python data plane (the specification's reference); "
                         "native: the C data plane, frames handled by worker threads on "
                         "AF_XDP sockets (needs root; where AF_XDP cannot be had, a port "
                         "falls back to AF_PACKET, logged and counted); it learns no MACs "
                         "(unknown destinations are flooded) and has no --tx-loss")
    ap.add_argument("--port", action="append", type=_port_arg, default=[], metavar="N=IFNAME",
                    help="attach switch port N to interface IFNAME (repeat for every port)")
    ap.add_argument("--mac", action="append", type=_mac_arg, default=[], metavar="MAC=PORT",
                    help="a static MAC table entry: never moved by learning, and the only way "
                         "a ring's ports are found (give every host's MAC)")
    ap.add_argument("--one-armed", action="store_true",
                    help="run as a one-armed aggregation server reached by routing "
                         "(docs/switch.md): one port, --port 1=IFNAME; frames addressed to "
                         "IFNAME's MAC are aggregated or routed on to the registered rings' "
                         "hosts (and --neighbor); IFNAME's kernel must not forward IPv4; "
                         "--target native: switch/native/router.h")
    ap.add_argument("--neighbor", action="append", type=_neighbor_arg, default=[],
                    metavar="IP=MAC",
                    help="with --one-armed: a host routed to even when no registered ring "
                         "names it (repeatable)")
    ap.add_argument("--controller", metavar="ADDR:PORT",
                    help="serve the controller's gRPC API here and aggregate registered rings; "
                         "without it the switch only forwards")
    ap.add_argument("--mac-table-size", type=int, default=DEFAULT_MAC_TABLE_SIZE, metavar="N",
                    help="most learned MAC entries (static ones not counted); a new MAC "
                         "beyond it is not learned")
    ap.add_argument("--mac-ageing", type=float, default=DEFAULT_MAC_AGEING, metavar="S",
                    help="a learned MAC unseen for S seconds is forgotten")
    nat = ap.add_argument_group("native data plane (with --target native)")
    nat.add_argument("--workers", type=int, default=1, metavar="W",
                     help="worker threads, each with its own pipeline; a ring's ports must "
                          "all be on one worker")
    nat.add_argument("--port-worker", action="append", type=_port_worker_arg, default=[],
                     metavar="PORT=WORKER",
                     help="run PORT on WORKER (0..W-1; default 0 for every port)")
    nat.add_argument("--xdp-mode", choices=sorted(MODES), default="auto",
                     help="auto: driver XDP, else generic XDP, else AF_PACKET; or force one")
    ctl = ap.add_argument_group("controller (with --controller)")
    ctl.add_argument("--token-file", type=Path, metavar="FILE",
                     help="lines 'PRINCIPAL SECRET': every call but Ping must carry one of "
                          "these secrets (default: the controller makes one in "
                          "--credentials-dir and says where)")
    ctl.add_argument("--credentials-dir", type=Path, metavar="DIR",
                     default=credentials.default_directory(),
                     help="where the controller keeps the token file and TLS certificate it "
                          "makes when none are given (mode 0700; default %(default)s)")
    ctl.add_argument("--insecure", action="store_true",
                     help="ask no credentials and serve clear text on any address: anyone who "
                          "reaches the controller reads every ring's R_Key and removes any "
                          "ring (a private test machine only)")
    ctl.add_argument("--admin", action="append", default=[], metavar="PRINCIPAL",
                     help="a principal of the token file that sees every ring in Counters "
                          "(repeatable); any other principal sees only the rings it "
                          "registered, and the ports' and switch's totals")
    ctl.add_argument("--hosts-policy", type=Path, metavar="FILE",
                     help="lines 'PRINCIPAL NET [NET ...]': the host addresses (or CIDR "
                          "prefixes) each principal's rings may use; needed when the token "
                          "file has two principals or more (an address in one principal's "
                          "registered ring is never another's)")
    ctl.add_argument("--calls-per-second", type=float, default=DEFAULT_CALLS_PER_SECOND,
                     metavar="R", help="calls each principal may make per second, in bursts "
                     "of 2R; more are RESOURCE_EXHAUSTED (0: no limit)")
    ctl.add_argument("--tls-cert", type=Path, metavar="PEM",
                     help="serve TLS with this certificate (with --tls-key; default on an "
                          "address other hosts reach: a self-signed one made in "
                          "--credentials-dir)")
    ctl.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's key")
    ctl.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS, metavar="MS",
                     help="a registration's lease when the client asks for none; a ring not "
                          "renewed within its lease is unregistered")
    ctl.add_argument("--max-rings", type=int, default=DEFAULT_MAX_RINGS, metavar="N",
                     help=f"rings registered at once (at most {MAX_RINGS_CEILING})")
    ctl.add_argument("--max-slot-memory", type=int, default=DEFAULT_MAX_SLOT_MEMORY,
                     metavar="BYTES",
                     help="aggregator memory over all rings, slots x (ranks + 1) x MTU each; "
                          "0: no limit")
    ctl.add_argument("--max-in-flight", type=int, default=0, metavar="PACKETS",
                     help="the target's pace, published to clients: rings keep at most this "
                          "many packets unacknowledged per connection (0: only the slots "
                          "bound it)")
    ctl.add_argument("--capacity", type=int, default=0, metavar="SHARE",
                     help="this aggregator's share of a call split over several, relative to "
                          "the others' (netreduce/shards.py; 0: equal shares)")
    ctl.add_argument("--ack-timeout", type=int, default=0, metavar="EXP",
                     help="the target's pace, published to clients: rings use a QP local ACK "
                          "timeout of at least 4.096 us x 2^EXP (0: the hosts' default, 14 = "
                          "67 ms)")
    fab = ap.add_argument_group("two-tier fabric (docs/multirack.md)")
    fab.add_argument("--tor-id", type=int, metavar="J", help="tor: this ToR's id (0..31)")
    fab.add_argument("--uplink", type=int, metavar="PORT", help="tor: the port to the spine")
    fab.add_argument("--me", type=_endpoint_arg, metavar="MAC,IP",
                     help="tor, spine: this switch's addresses on the inter-switch links")
    fab.add_argument("--spine", type=_endpoint_arg, metavar="MAC,IP",
                     help="tor: the spine's addresses")
    fab.add_argument("--tor", type=_tor_arg, action="append", default=[],
                     metavar="J=PORT,MAC,IP", help="spine: ToR J on port PORT (repeat per ToR)")
    fab.add_argument("--tor-controller", type=_tor_addr_arg, action="append", default=[],
                     metavar="J=HOST:PORT",
                     help="fabric: ToR J's control API (repeat per ToR)")
    fab.add_argument("--spine-controller", metavar="HOST:PORT",
                     help="fabric: the spine's control API")
    fab.add_argument("--fabric-token-file", type=Path, metavar="FILE",
                     help="fabric: the token file whose first secret the fabric's controller "
                          "sends the ToRs and the spine (theirs: that principal alone; "
                          "default: --token-file's first)")
    ap.add_argument("--tx-loss", action="append", type=_loss_arg, default=[],
                    metavar="PORT=PCT",
                    help="lose PCT %% of the frames sent on PORT (tests: netem's loss where "
                         "the kernel has no netem, e.g. a fabric's inter-switch links)")
    ap.add_argument("--stats-file", type=Path,
                    help="write the counters as JSON here on SIGUSR1 and on exit (mode 0600: "
                         "they hold every ring's R_Key; its directory must be ours alone, or "
                         "sticky)")
    ap.add_argument("--ready-file", type=Path,
                    help="created once every port is open and the controller listens")
    return ap


def controller_options(args: argparse.Namespace) -> dict[str, Any]:
    """serve()'s keyword arguments from the command line, the credentials made where none
    are given (module doc); ValueError says what is wrong."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = TlsFiles(args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    token_file = args.token_file
    if args.insecure:
        if token_file is None and args.admin:
            raise ValueError("--admin names a principal of --token-file: give the token file")
    else:
        if token_file is None:
            token_file = credentials.token_file(args.credentials_dir)
        if tls is None and not local_address(args.controller):
            tls = TlsFiles(*credentials.tls_files(args.credentials_dir, args.controller))
    return {"config": ControllerConfig.with_token_file(
                token_file, hosts_policy=args.hosts_policy, admins=frozenset(args.admin),
                max_rings=args.max_rings, max_slot_memory=args.max_slot_memory,
                default_lease_ms=args.lease_ms, max_in_flight=args.max_in_flight,
                ack_timeout=args.ack_timeout, capacity=args.capacity,
                calls_per_second=args.calls_per_second,
                insecure=args.insecure),
            "tls": tls}


def role_pipeline(args: argparse.Namespace, dp: DataPlane) -> tuple[Any, Target]:
    """The pipeline and controller target of --role switch/tor/spine; ValueError: a missing
    or inconsistent role option, named."""
    if args.role == "switch":
        pipeline = AggregationPipeline()
        target = SoftwareTarget(pipeline, dp.static_port_of_mac, dp.port_counters,
                                dp.switch_counters, router=dp.router)
        dp.describe_connection = target.describe_connection
        return pipeline, target
    if args.role == "tor":
        tor = TorPipeline(tor_config(args, dp.ports))
        return tor, TorSwitch(TorTarget(tor, dp.static_port_of_mac, dp.port_counters),
                              dict(args.mac), dp.switch_counters)
    spine = SpinePipeline(spine_config(args, dp.ports))
    return spine, SpineSwitch(SpineTarget(spine, dp.port_counters), dp.switch_counters)


def tor_config(args: argparse.Namespace, ports: Collection[int]) -> TorConfig:
    """--role tor's --tor-id, --uplink (one of `ports`), --me and --spine as a TorConfig;
    ValueError names what is missing or wrong."""
    missing = [o for o, v in (("--tor-id", args.tor_id), ("--uplink", args.uplink),
                              ("--me", args.me), ("--spine", args.spine)) if v is None]
    if missing:
        raise ValueError(f"--role tor needs {', '.join(missing)}")
    if args.uplink not in ports:
        raise ValueError(f"--uplink {args.uplink} is not one of the ports {sorted(ports)}")
    return TorConfig(args.tor_id, args.uplink, args.me, args.spine)


def spine_config(args: argparse.Namespace, ports: Collection[int]) -> SpineConfig:
    """--role spine's --me and --tor (on `ports`) as a SpineConfig; ValueError names what is
    missing or wrong."""
    if args.me is None or not args.tor:
        raise ValueError("--role spine needs --me and a --tor per ToR")
    tors = dict(args.tor)
    bad = sorted(j for j, (port, _) in tors.items() if port not in ports)
    if len(tors) != len(args.tor) or bad:
        raise ValueError(f"--tor: a ToR given twice, or ToR(s) {bad} on no port of this switch")
    return SpineConfig(args.me, tors)


def run_fabric(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """--role fabric: serve FabricTarget over the ToRs' and the spine's control APIs."""
    if not args.controller or not args.tor_controller or not args.spine_controller:
        print("switch: --role fabric needs --controller, --spine-controller and a "
              "--tor-controller per ToR", file=sys.stderr)
        return 2
    token = args.fabric_token_file or args.token_file or (
        None if args.insecure else credentials.token_file(args.credentials_dir))
    token = str(token) if token else None
    try:
        tors = [TorClient(j, addr, token) for j, addr in args.tor_controller]
        spine = SpineClient(args.spine_controller, token)
        target = FabricTarget(tors, spine)
        server, _ = serve(target, args.controller, **options)
    except (ValueError, OSError, ControllerError) as e:
        print(f"switch: fabric: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"switch: fabric controller on {args.controller}: "
          f"{', '.join(f'tor{j}={a}' for j, a in args.tor_controller)}, "
          f"spine={args.spine_controller}", file=sys.stderr, flush=True)
    if args.ready_file:
        args.ready_file.write_text(str(os.getpid()))
    stop.wait()
    server.stop(None)
    for client in [*tors, spine]:
        client.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="switch: %(levelname)s %(name)s: %(message)s")
    try:
        options = controller_options(args) if args.controller else {}
        if args.stats_file:
            check_directory(args.stats_file.parent)
    except (ValueError, OSError) as e:      # TokenFileError, PrivateFileError among them
        print(f"switch: {e}", file=sys.stderr)
        return 2
    if args.role == "fabric":
        return run_fabric(args, options)
    ports = dict(args.port)
    if not ports or len(ports) != len(args.port):
        print("switch: no --port, or a port number given twice", file=sys.stderr)
        return 2
    if args.target == "native":
        return run_native(args, options)
    if args.role != "switch" and not args.controller:
        print(f"switch: --role {args.role} needs --controller (the fabric programs it)",
              file=sys.stderr)
        return 2
    try:
        router = one_armed_router(args, ports)
        dp = DataPlane(ports, static_macs=dict(args.mac), mac_table_size=args.mac_table_size,
                       mac_ageing=args.mac_ageing, tx_loss=dict(args.tx_loss), router=router)
    except ValueError as e:
        print(f"switch: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"switch: cannot open ports {ports}: {e}", file=sys.stderr)
        return 1
    server = None
    if args.controller:
        try:
            pipeline, target = role_pipeline(args, dp)
        except ValueError as e:
            print(f"switch: {e}", file=sys.stderr)
            dp.close()
            return 2
        dp.pipeline = pipeline
        try:
            server, _ = serve(target, args.controller, **options)
        except (OSError, ValueError) as e:
            print(f"switch: controller: {e}", file=sys.stderr)
            dp.close()
            return 1

    def counters() -> dict:
        out = {"ports": dp.port_counters(), "mac_table": dp.mac_table_view(),
               "switch": dp.switch_counters()}
        if server is not None:
            out["rings"] = pipeline.counters()
            out["interswitch"] = getattr(pipeline, "interswitch", {})
        return out

    def dump(*_: object) -> None:
        report(counters(), args.stats_file)

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGTERM, lambda *_: dp.stop())
    signal.signal(signal.SIGINT, lambda *_: dp.stop())
    print(f"switch: {args.role}: ports {', '.join(f'{n}={i}' for n, i in ports.items())}"
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
