"""`python -m labswitches.bmv2_lab`: BMv2 in the software switch's place, same command line.

Compiles switch/p4 (p4c), starts `simple_switch_grpc` on the given ports (port N is
BMv2 port N: host hI on I+1, the controller's port last, as for `python -m switch`),
pushes the program, installs the static MAC table and the flood group, and with
--controller serves the controller's gRPC API with a Bmv2Target; with `--role spine --me
MAC,IP --tor J=PORT,MAC,IP ...` (as `python -m switch --role spine`) it runs the fabric's
spine program (spine.p4) instead, with `--role tor --tor-id J --uplink PORT --me MAC,IP
--spine MAC,IP` (as `python -m switch --role tor`) its ToR program (tor.p4), each served as
the software role is (rings only from a fabric's controller). BMv2 does not learn MAC addresses: give every host's --mac (unknown
destinations are flooded). Runs until SIGTERM/SIGINT; SIGUSR1 prints the port counters and
writes --stats-file.

BMv2's own servers listen on loopback only: P4Runtime on 127.0.0.1 by its option; Thrift
(no option: it binds every address) through `labswitches/bmv2_loopback.c`, LD_PRELOAD'ed,
and checked once it listens (`listening_elsewhere`): a switch that would listen anywhere
else is stopped.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import ipaddress
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from switch.daemon import build_parser, controller_options, spine_config, tor_config
from switch.control.bmv2 import Bmv2Target, ShellSession
from switch.control.private import check_directory
from switch.control.bmv2_registers import ThriftRegisters
from switch.control.bmv2_spine import Bmv2SpineTarget
from switch.control.bmv2_tor import Bmv2TorTarget
from switch.control.fabric import SpineTarget, TorTarget
from switch.control.fabric_rpc import SpineSwitch, TorSwitch
from switch.control.service import serve
from switch.control.target import Target
from switch.dataplane.spine import SpineConfig
from switch.dataplane.tor import TorConfig
from switch.p4.program import (DEFAULT_BUILD, DEFAULT_SPINE_BUILD, DEFAULT_TOR_BUILD,
                               SPINE_MAIN, TOR_MAIN, compile_program)
from switch.report import report

SIMPLE_SWITCH = "simple_switch_grpc"
# BMv2's log level defaults to 'trace' even with no log sink (no --log-console/--log-file):
# it then formats every trace message per table, action and field, for nothing. Off, this
# build spends half the CPU per packet (switch/p4/README.md, "Cost per packet").
LOG_OFF = ("--log-level", "off")
START_TIMEOUT = 30.0
# BMv2's pace, published to clients (--max-in-flight / --ack-timeout default to these here).
# In the TCG lab BMv2 spends about 4.5 ms of CPU per contribution (docs/benchmarks.md). With
# rxe's default 67 ms retransmit timer, 4 ranks x 128 packets in flight take BMv2 ~2.3 s to
# drain: every timer fires, go-back-N resends everything, and retransmissions then take
# most of BMv2's time (a 256 KiB call stalled). 32 packets per connection keep BMv2 busy
# (the hosts answer in far less than BMv2 takes) and 4 ranks x 32 x 4.5 ms ~ 0.6 s sits well
# inside a 2^18 x 4.096 us = 1.07 s timer. Since the program and the log level were made
# cheaper (switch/p4/README.md, "Cost per packet": ~0.7 ms per contribution, 4-5x less) the
# same 128 packets drain in ~0.1-0.2 s, so the timer is now 2^17 x 4.096 us = 537 ms: still
# 3x that under load, and half the wait for each loss the responder's NAK does not repair.
BMV2_MAX_IN_FLIGHT = 32
BMV2_ACK_TIMEOUT = 17


LOOPBACK_SHIM = Path(__file__).with_name("bmv2_loopback.c")
TCP_LISTEN = "0A"                          # /proc/net/tcp's state of a listening socket


def loopback_shim(build: Path = DEFAULT_BUILD.parent / "bmv2-loopback") -> Path:
    """labswitches/bmv2_loopback.c compiled (once per version of it) into `build`; RuntimeError
    when it cannot be (no C compiler): BMv2 is then not started at all."""
    source = LOOPBACK_SHIM.read_bytes()
    out = build / f"bmv2_loopback-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError(f"no C compiler (cc) to build {LOOPBACK_SHIM.name}: without it "
                           f"{SIMPLE_SWITCH}'s Thrift server listens on every address")
    build.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(LOOPBACK_SHIM),
                           "-ldl"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{cc} could not build {LOOPBACK_SHIM.name}: {done.stderr[-500:]}")
    os.replace(tmp, out)
    return out


def listening_elsewhere(ports: set[int]) -> list[str]:
    """'ADDRESS:PORT' of every TCP socket of this network namespace listening on one of
    `ports` at an address other than loopback (/proc/net/tcp, tcp6)."""
    out = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            hexaddr, hexport = local.split(":")
            if state != TCP_LISTEN or int(hexport, 16) not in ports:
                continue
            raw = bytes.fromhex(hexaddr)    # the kernel's words, each in host (little) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.ip_address(socket.inet_ntop(family, raw))
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            if not addr.is_loopback:
                out.append(f"{addr}:{int(hexport, 16)}")
    return out


def wait_listening(proc: subprocess.Popen, port: int, timeout: float = START_TIMEOUT) -> None:
    """Until `proc` (a simple_switch_grpc) listens on 127.0.0.1:`port`; RuntimeError if it
    exits first or takes longer than `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{SIMPLE_SWITCH} exited at start ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{SIMPLE_SWITCH} did not listen on port {port} in {timeout:.0f} s")


class Bmv2Switch:
    """A simple_switch_grpc process on `ports` with switch/p4 pushed, and its Bmv2Target;
    with `spine`, the spine program (spine.p4, built into build/p4-spine by default) and a
    Bmv2SpineTarget; with `tor`, the ToR program (tor.p4, build/p4-tor) and a Bmv2TorTarget.

    Invariant: while the object is open the process runs and `target` is connected;
    `close()` stops what it started (by pid) and is idempotent.
    """

    target: Bmv2Target | Bmv2SpineTarget | Bmv2TorTarget

    def __init__(self, ports: dict[int, str], macs: dict[str, int],
                 build_dir: Optional[Path] = None, grpc_port: int = 9559,
                 thrift_port: int = 9090, log: Optional[Path] = None,
                 spine: Optional[SpineConfig] = None, tor: Optional[TorConfig] = None):
        if shutil.which(SIMPLE_SWITCH) is None:
            raise RuntimeError(f"{SIMPLE_SWITCH} is not on PATH: it comes with "
                               "p4lang/behavioral-model (see switch/p4/README.md)")
        if spine is not None:
            build = compile_program(build_dir or DEFAULT_SPINE_BUILD, SPINE_MAIN)
        elif tor is not None:
            build = compile_program(build_dir or DEFAULT_TOR_BUILD, TOR_MAIN)
        else:
            build = compile_program(build_dir or DEFAULT_BUILD)
        grpc_addr = f"127.0.0.1:{grpc_port}"
        cmd = [SIMPLE_SWITCH, "--device-id", "0", "--thrift-port", str(thrift_port),
               *LOG_OFF]
        for num, ifname in sorted(ports.items()):
            cmd += ["-i", f"{num}@{ifname}"]
        cmd += ["--no-p4", "--", "--grpc-server-addr", grpc_addr]
        self.build, self.thrift_port = build, thrift_port   # the program, simple_switch_CLI's port
        self._connect_args = (grpc_addr, build, ports, macs, spine, tor)
        self.registers = ThriftRegisters(thrift_port)   # one CLI for the process's life
        preload = [str(loopback_shim()), *filter(None, [os.environ.get("LD_PRELOAD")])]
        env = {**os.environ, "LD_PRELOAD": " ".join(preload)}
        with open(log or os.devnull, "ab") as out:     # the child keeps its own copy
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        self._or_stop(lambda: wait_listening(self.proc, grpc_port),
                      lambda: wait_listening(self.proc, thrift_port),
                      lambda: self._loopback_only({grpc_port, thrift_port}), self._connect)
        self._open = True

    @staticmethod
    def _loopback_only(ports: set[int]) -> None:
        """RuntimeError if BMv2 listens on `ports` anywhere but loopback."""
        elsewhere = listening_elsewhere(ports)
        if elsewhere:
            raise RuntimeError(f"{SIMPLE_SWITCH} listens on {', '.join(elsewhere)}, not only "
                               "on loopback: stopped (others could write its tables)")

    def _or_stop(self, *steps: Callable[[], object]) -> None:
        """Run `steps` in order; on a failure stop the process, then re-raise."""
        try:
            for step in steps:
                step()
        except BaseException:
            self._stop_process()
            raise

    def _connect(self) -> None:
        """Push the program (P4Runtime's SetForwardingPipelineConfig: BMv2 starts every
        table, register and counter over, not its multicast groups: see reset) and serve
        it with a new target, which installs the static MAC table and the flood group."""
        grpc_addr, build, ports, macs, spine, tor = self._connect_args
        session = ShellSession(grpc_addr, build)
        registers = self.registers
        if spine is not None:
            self.target = Bmv2SpineTarget(session, spine, ports, macs, registers)
        elif tor is not None:
            self.target = Bmv2TorTarget(session, tor, ports, macs, registers)
        else:
            self.target = Bmv2Target(session, ports, macs, registers)

    def _close_target(self) -> None:
        self.target.remove_groups()
        self.target.close()

    def reset(self) -> None:
        """The device and its target as just after start, the process and its ports kept:
        the target's multicast groups deleted (pushing the program again resets every
        table, register and counter but leaves BMv2's multicast groups in place, which the
        P4Runtime server then forgets: the next target's groups would get a second copy of
        every replica), then the program pushed again and a new target (_connect). Frames
        still inside the switch are the caller's to wait for first. On a failure the
        switch is closed."""
        assert self._open, "reset of a closed switch"
        self._open = False
        self._or_stop(self._close_target, self._connect)
        self._open = True

    def _stop_process(self) -> None:
        self.registers.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        if self._open:
            self._open = False
            self.target.close()
        self._stop_process()


def served(sw: Bmv2Switch) -> Target:
    """What the process serves: the single switch's target, or a role's, wrapped as the
    software role is (TorSwitch / SpineSwitch), publishing its program's limits."""
    t = sw.target
    if isinstance(t, Bmv2SpineTarget):
        return SpineSwitch(SpineTarget(t, t.port_counters),       # type: ignore[arg-type]
                           limits=t.limits())
    if isinstance(t, Bmv2TorTarget):
        return TorSwitch(TorTarget(t, t.port_of_mac, t.port_counters),   # type: ignore[arg-type]
                         t.macs(), limits=t.limits())
    return t


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = build_parser()
    ap.prog = "python -m labswitches.bmv2_lab"
    ap.description = (__doc__ or "").split("\n\n")[1].replace("\n", " ")
    ap.add_argument("--build", type=Path, default=None,
                    help=f"where p4c's output goes (default {DEFAULT_BUILD}, with --role "
                         f"spine {DEFAULT_SPINE_BUILD}, with --role tor {DEFAULT_TOR_BUILD})")
    ap.add_argument("--grpc-port", type=int, default=9559, help="BMv2's P4Runtime port")
    ap.add_argument("--thrift-port", type=int, default=9090, help="BMv2's Thrift port")
    ap.add_argument("--bmv2-log", type=Path, help="simple_switch_grpc's output goes here")
    ap.set_defaults(max_in_flight=BMV2_MAX_IN_FLIGHT, ack_timeout=BMV2_ACK_TIMEOUT)
    args = ap.parse_args(argv)
    ports = dict(args.port)
    if len(ports) != len(args.port):
        print("bmv2_lab: a port number is given twice", file=sys.stderr)
        return 2
    if args.role not in ("switch", "spine", "tor"):
        print(f"bmv2_lab: --role {args.role}: BMv2 runs the switch, the spine or a ToR",
              file=sys.stderr)
        return 2
    if args.tx_loss:
        print("bmv2_lab: --tx-loss: BMv2 has no such thing (lose frames on the peers' side)",
              file=sys.stderr)
        return 2
    try:              # credentials, hosts policy, stats directory: refused before BMv2 starts
        options = controller_options(args) if args.controller else {}
        if args.stats_file:
            check_directory(args.stats_file.parent)
    except (ValueError, OSError) as e:
        print(f"bmv2_lab: {e}", file=sys.stderr)
        return 2
    try:
        spine = spine_config(args, ports) if args.role == "spine" else None
        tor = tor_config(args, ports) if args.role == "tor" else None
        sw = Bmv2Switch(ports, dict(args.mac), args.build, args.grpc_port, args.thrift_port,
                        args.bmv2_log, spine, tor)
    except (RuntimeError, ValueError) as e:
        print(f"bmv2_lab: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    server = None
    target = served(sw)
    try:
        if args.controller:
            try:
                server, _ = serve(target, args.controller, **options)
            except (OSError, ValueError) as e:
                print(f"bmv2_lab: controller: {e}", file=sys.stderr)
                return 1

        def dump(*_: object) -> None:
            c = target.counters()
            report({"ports": c["ports"], "mac_table": sw.target.macs(), "rings": c["rings"]},
                   args.stats_file)

        signal.signal(signal.SIGUSR1, dump)
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        print(f"bmv2_lab: {SIMPLE_SWITCH} pid {sw.proc.pid}, ports "
              + ", ".join(f"{n}={i}" for n, i in sorted(ports.items()))
              + (f"; controller on {args.controller}" if args.controller else "; forwarding only"),
              file=sys.stderr, flush=True)
        if args.ready_file:
            args.ready_file.write_text(str(os.getpid()))
        while not stop.wait(0.5):
            if sw.proc.poll() is not None:
                print(f"bmv2_lab: {SIMPLE_SWITCH} died ({sw.proc.returncode})", file=sys.stderr)
                return 1
        dump()
    finally:
        if server is not None:
            server.stop(grace=None)
        sw.close()
    return 0

if __name__ == "__main__":
    sys.exit(main())
