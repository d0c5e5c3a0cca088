"""`python -m labswitches.fabric_lab`: the lab's two-tier fabric on the lab's ports (scripts/lab.sh
--racks R, or a restart as kind "racks:R[:LOSS]" through tests/lab/labswitch.py).

Takes the single switch's command line (`--port`, `--mac`, `--controller`, `--token-file`,
`--hosts-policy`, `--tls-cert`, `--tls-key`, `--ready-file`, `--stats-file`) plus `--racks R`, `--spine-port N` (the controller's leg:
cabled to the spine) and `--link-loss PCT`, and runs, each as a process of its own:
- ToR j (`python -m switch --role tor`) on the host ports of rack j (hosts spread as evenly
  as possible, in port order: `rack_sizes`) keeping their lab port numbers, uplink port
  UPLINK on a veth `nrkt{j}` whose peer `nrks{j}` is spine port j+1; with `--tor-target
  bmv2` tor.p4 on BMv2 (`python -m labswitches.bmv2_lab --role tor`, gRPC and Thrift ports of its
  own) instead;
- the spine (`--role spine`) on those peers and the spine ports; with `--spine-target bmv2`
  spine.p4 on BMv2 (`python -m labswitches.bmv2_lab --role spine`) instead;
  with either on BMv2 the fabric publishes its BMv2 pace (BMV2_FABRIC_ACK_TIMEOUT);
- the fabric's controller (`--role fabric`) on the job's controller address, with the
  job's token file and hosts policy, programming the switches through their control APIs
  on 127.0.0.1 (TLS only on the job's address: the switch namespace's loopback carries the
  rest). The ToRs and the spine take one principal only, "fabric", whose secret this
  process draws per start (`fabric.token` in --workdir, mode 0600): they never see the
  tenants' secrets, and a tenant's secret does not open them.
`--link-loss` % of the frames sent on every ToR–spine link is lost, both directions: a
software switch drops them itself (`--tx-loss`: this machine's kernel, where the switches
run, has no netem; the hosts' links are inside the lab VM, whose kernel has); a BMv2 switch
cannot, so its end of the veth drops them on egress (`lossy_egress`: tc, no netem needed).
Ready when all are.
On SIGTERM the children are stopped (each prints and writes its counters), their counters
go to `--stats-file` as {"switches": {name: counters}, "lost": {veth: frames}} (what each
BMv2 end's tc dropped), the veths are removed. A child that
exits on its own stops the fabric (exit 1, naming it): no half-fabric lingers.
One ToR can be restarted (issue 24: a ToR restart must cost a job one call's time): the
request "ID tor J" in `--workdir`/fabric.request stops ToR J and starts it again on the
same ports, with fresh state; the answer "ID ok tor J PID" (or "ID error WHY") replaces
`--workdir`/fabric.reply (tests/lab/labswitch.py: restart_tor). Nothing else changes: the
spine and the fabric's controller keep their state, so the controller's next lease renewal
on that ToR hears NOT_FOUND and reports the ring lost to its job.
"""
from __future__ import annotations

import argparse
import json
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from switch.daemon import _mac_arg, _port_arg
from switch.control.private import check_directory, write_private
from labswitches.bmv2_lab import BMV2_MAX_IN_FLIGHT

UPLINK = 100
TOR_CONTROL_PORT = 50100           # ToR j: 127.0.0.1:50100+j; the spine: 127.0.0.1:50199
SPINE_CONTROL = "127.0.0.1:50199"
SPINE_GRPC_PORT, SPINE_THRIFT_PORT = 9659, 9190   # a BMv2 spine's (not the lab BMv2's)
TOR_GRPC_PORT, TOR_THRIFT_PORT = 9700, 9200        # BMv2 ToR j's: + j
START_TIMEOUT = 60.0
# A BMv2 child's start; run alone, a stale build compiles first (tor.p4: ~4 min here, ~7.5 min
# of a loaded 2-core machine, switch/p4/README.md). scripts/lab.sh compiles both programs
# before its 300 s wait for the fabric (scripts/lab_switch.sh: p4_build), so there they start
# from fresh builds.
BMV2_START_TIMEOUT = 280.0
BMV2_TOR_START_TIMEOUT = 600.0
# The pace a fabric with a BMv2 switch publishes: its own, not one BMv2 switch's 2^17 x
# 4.096 us = 537 ms (labswitches/bmv2_lab.py). A slot there costs the CPU of two or three BMv2
# processes (~10 ms in a 2 x 2 fabric of BMv2 switches, ~3.5 ms in one switch:
# docs/benchmarks.md), so 32 slots in flight per job take ~0.3 s of BMv2 CPU, ~0.7 s for
# CI's two jobs at once, on the two cores the lab's VM shares: past 537 ms, RC timed out
# on packets only queued (10-15 timeouts per host and run of test_bmv2_fabric's two jobs),
# and each spurious timeout is a chance for rxe's retry race (docs/roce.md, "rxe's retry
# race"). 2^18 x 4.096 us = 1.07 s.
BMV2_FABRIC_ACK_TIMEOUT = 18


def rack_sizes(hosts: int, racks: int) -> list[int]:
    """`hosts` over `racks` as evenly as possible, the first racks one larger (5, 2 -> [3, 2])."""
    if not 1 <= racks <= hosts:
        raise ValueError(f"{racks} racks for {hosts} hosts: need 1..{hosts}")
    return [hosts // racks + (j < hosts % racks) for j in range(racks)]


def tor_mac(j: int) -> str:
    return f"02:4e:52:01:00:{j:02x}"


def tor_ip(j: int) -> str:
    return f"10.77.1.{j + 1}"


SPINE_MAC, SPINE_IP = "02:4e:52:01:00:fe", "10.77.1.254"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


# The fabric's pace, published to clients by its controller (TargetLimits.ack_timeout): a
# result crosses two tiers of Python switches, and with rxe's 67 ms timer a 16 MiB bench job
# in the lab saw 27-84 retransmit timeouts with no frame lost (completer_retry_err; one job
# took 8.4 s instead of 2.5); 2^16 x 4.096 us = 268 ms gave none (docs/multirack.md).
FABRIC_ACK_TIMEOUT = 16


# Classic BPF (tc's cls_bpf, no compiler needed): A = a random u32 (SKF_AD_OFF +
# SKF_AD_RANDOM); A >= threshold -> 0 (no class: the frame goes out), else -1 (the filter's
# class, 1:2, whose pfifo of limit 0 drops it).
SKF_AD_RANDOM = 0xFFFFF000 + 56
LOSSY_BPF = "4,32 0 0 {rand},53 1 0 {threshold},6 0 0 4294967295,6 0 0 0"


def lossy_egress(dev: str, pct: float) -> None:
    """Lose `pct` % of the frames sent on `dev`, at random, where a sender that cannot drop
    frames on purpose (BMv2) transmits: this machine's kernel has neither netem nor gact, so
    an htb root (unclassified frames leave at once, as "direct" ones) with a classic-BPF
    filter sending `pct` % to a class whose pfifo of limit 0 drops all it gets. The sender
    sees its send fail (ENOBUFS) and goes on, as BMv2 does; `frames_lost` counts them."""
    threshold = min(2**32 - 1, round(pct / 100 * 2**32))
    sh("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb")
    sh("tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:2", "htb", "rate",
       "1mbit")
    sh("tc", "qdisc", "add", "dev", dev, "parent", "1:2", "handle", "2:", "pfifo", "limit", "0")
    sh("tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "all", "prio", "1", "bpf",
       "bytecode", LOSSY_BPF.format(rand=SKF_AD_RANDOM, threshold=threshold), "classid", "1:2")


def frames_lost(dev: str) -> int:
    """Frames `lossy_egress` dropped on `dev` so far (its pfifo's drop count)."""
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", dev], capture_output=True,
                         text=True).stdout
    block = out.partition("qdisc pfifo 2:")[2]
    found = re.search(r"dropped (\d+)", block)
    if not found:
        raise RuntimeError(f"tc shows no lossy pfifo on {dev}: {out.strip()!r}")
    return int(found[1])


def cable(j: int, mtu: int) -> tuple[str, str]:
    """The veth between ToR j's uplink and spine port j+1."""
    tor_if, spine_if = f"nrkt{j}", f"nrks{j}"
    subprocess.run(["ip", "link", "del", tor_if], capture_output=True)
    sh("ip", "link", "add", tor_if, "type", "veth", "peer", "name", spine_if)
    for d in (tor_if, spine_if):
        sh("ip", "link", "set", d, "mtu", str(mtu), "up")
        subprocess.run(["ethtool", "-K", d, "tx", "off", "tso", "off", "gso", "off", "gro",
                        "off"], capture_output=True)
    return tor_if, spine_if


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m labswitches.fabric_lab", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--port", action="append", type=_port_arg, required=True)
    ap.add_argument("--mac", action="append", type=_mac_arg, default=[])
    ap.add_argument("--spine-port", type=int, action="append", default=[], metavar="N",
                    help="a lab port cabled to the spine, not a host (the controller's leg)")
    ap.add_argument("--racks", type=int, required=True)
    ap.add_argument("--link-loss", type=float, default=0.0, metavar="PCT",
                    help="loss on every ToR-spine link, both directions")
    ap.add_argument("--controller", required=True)
    ap.add_argument("--ack-timeout", type=int, default=FABRIC_ACK_TIMEOUT, metavar="EXP",
                    help="the fabric's pace: rings use a QP local ACK timeout of at least "
                         f"4.096 us x 2^EXP (default {FABRIC_ACK_TIMEOUT}: 268 ms)")
    ap.add_argument("--token-file", type=Path, required=True,
                    help="the fabric's controller's (the jobs' principals)")
    ap.add_argument("--hosts-policy", type=Path,
                    help="the fabric's controller's (with two principals or more)")
    ap.add_argument("--spine-target", choices=("soft", "bmv2"), default="soft",
                    help="the spine: the software role, or spine.p4 on BMv2 (python -m "
                         "labswitches.bmv2_lab --role spine)")
    ap.add_argument("--tor-target", choices=("soft", "bmv2"), default="soft",
                    help="the ToRs: the software role, or tor.p4 on BMv2 (python -m "
                         "labswitches.bmv2_lab --role tor; its rings must span racks)")
    ap.add_argument("--tls-cert", type=Path, metavar="PEM",
                    help="the fabric's controller serves TLS with this certificate (the "
                         "switches' own control APIs listen on 127.0.0.1 of the switch "
                         "namespace only)")
    ap.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's key")
    ap.add_argument("--ready-file", type=Path)
    ap.add_argument("--stats-file", type=Path)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp"),
                    help="the children's ready and stats files")
    return ap


class Fabric:
    """The child processes and cables of one fabric; `stop` undoes everything."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.children: dict[str, subprocess.Popen] = {}
        self.cables: list[str] = []
        self.lossy: list[str] = []      # veth ends dropping --link-loss % (BMv2 senders)
        self.argvs: dict[str, tuple[list[str], str, float]] = {}   # how each was started
        # the one principal the ToRs and the spine take: the fabric's controller
        self.switch_token = args.workdir / "fabric.token"
        write_private(self.switch_token, f"fabric {secrets.token_hex(16)}\n".encode())

    def spawn(self, name: str, argv: list[str], module: str = "switch",
              timeout: float = START_TIMEOUT) -> None:
        self.argvs[name] = (argv, module, timeout)
        ready = self.args.workdir / f"fabric-{name}.ready"
        ready.unlink(missing_ok=True)
        self.children[name] = subprocess.Popen(
            [sys.executable, "-m", module, *argv, "--ready-file", str(ready),
             "--stats-file", str(self.args.workdir / f"fabric-{name}.json")])
        end = time.monotonic() + timeout
        while not ready.exists():
            if self.children[name].poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"{name} did not start (exit {self.children[name].poll()})")
            time.sleep(0.1)

    def start(self) -> None:
        a = self.args
        ports = dict(a.port)
        hosts = [p for p in sorted(ports) if p not in a.spine_port]
        mtu = int(Path(f"/sys/class/net/{ports[hosts[0]]}/mtu").read_text())
        macs = dict(a.mac)
        racks, first = [], 0
        for size in rack_sizes(len(hosts), a.racks):
            racks.append(hosts[first:first + size])
            first += size
        spine_ports = {p: ports[p] for p in a.spine_port}
        spine_macs = {m: p for m, p in macs.items() if p in a.spine_port}
        tor_args = []
        for j, rack in enumerate(racks):
            tor_if, spine_if = cable(j, mtu)
            self.cables.append(tor_if)
            if a.link_loss:          # a BMv2 end loses frames on the veth, a software one itself
                self.lossy += [d for d, t in ((tor_if, a.tor_target), (spine_if, a.spine_target))
                               if t == "bmv2"]
            spine_ports[j + 1] = spine_if
            spine_macs[tor_mac(j)] = j + 1
            tor_macs = {m: (p if p in rack else UPLINK) for m, p in macs.items()}
            spine_macs.update({m: j + 1 for m, p in macs.items() if p in rack})
            tor_args.append(["--role", "tor", "--tor-id", str(j), "--uplink", str(UPLINK),
                             "--me", f"{tor_mac(j)},{tor_ip(j)}", "--spine",
                             f"{SPINE_MAC},{SPINE_IP}",
                             *[f"--port={p}={ports[p]}" for p in rack],
                             f"--port={UPLINK}={tor_if}",
                             *[f"--mac={m}={p}" for m, p in tor_macs.items()],
                             f"--mac={SPINE_MAC}={UPLINK}",
                             "--controller", f"127.0.0.1:{TOR_CONTROL_PORT + j}",
                             "--token-file", str(self.switch_token)])
        for j, argv in enumerate(tor_args):
            if a.tor_target == "bmv2":
                # tor.p4 on BMv2 (lab.sh compiled it; alone, its first start does); it cannot lose
                # frames on purpose: its uplink's veth does (lossy_egress)
                self.spawn(f"tor{j}", [*argv, "--grpc-port", str(TOR_GRPC_PORT + j),
                                       "--thrift-port", str(TOR_THRIFT_PORT + j),
                                       "--bmv2-log", str(a.workdir / f"fabric-tor{j}-bmv2.log")],
                           module="labswitches.bmv2_lab", timeout=BMV2_TOR_START_TIMEOUT)
            else:
                self.spawn(f"tor{j}", [*argv, f"--tx-loss={UPLINK}={a.link_loss}"])
        spine = ["--role", "spine", "--me", f"{SPINE_MAC},{SPINE_IP}",
                 *[f"--tor={j}={j + 1},{tor_mac(j)},{tor_ip(j)}" for j in range(len(racks))],
                 *[f"--port={p}={i}" for p, i in sorted(spine_ports.items())],
                 *[f"--mac={m}={p}" for m, p in spine_macs.items()],
                 "--controller", SPINE_CONTROL, "--token-file", str(self.switch_token)]
        pace = ["--ack-timeout", str(a.ack_timeout)]
        if "bmv2" in (a.spine_target, a.tor_target):
            # The fabric publishes its BMv2 pace (BMV2_FABRIC_ACK_TIMEOUT above).
            pace = ["--ack-timeout", str(max(a.ack_timeout, BMV2_FABRIC_ACK_TIMEOUT)),
                    "--max-in-flight", str(BMV2_MAX_IN_FLIGHT)]
        if a.spine_target == "bmv2":
            # spine.p4 on BMv2 (compiled as tor.p4 above); it cannot lose frames
            # on purpose: its ports' veths do (lossy_egress)
            self.spawn("spine", [*spine, "--grpc-port", str(SPINE_GRPC_PORT),
                                 "--thrift-port", str(SPINE_THRIFT_PORT),
                                 "--bmv2-log", str(a.workdir / "fabric-spine-bmv2.log")],
                       module="labswitches.bmv2_lab", timeout=BMV2_START_TIMEOUT)
        else:
            self.spawn("spine", [*spine, *[f"--tx-loss={j + 1}={a.link_loss}"
                                           for j in range(len(racks))]])
        for dev in self.lossy:
            lossy_egress(dev, a.link_loss)
        tls = [f"--tls-cert={a.tls_cert}", f"--tls-key={a.tls_key}"] if a.tls_cert else []
        policy = [f"--hosts-policy={a.hosts_policy}"] if a.hosts_policy else []
        self.spawn("fabric", ["--role", "fabric", "--controller", a.controller, *tls, *pace,
                              f"--token-file={a.token_file}", *policy,
                              f"--fabric-token-file={self.switch_token}",
                              "--spine-controller", SPINE_CONTROL,
                              *[f"--tor-controller={j}=127.0.0.1:{TOR_CONTROL_PORT + j}"
                                for j in range(len(racks))]])
        print(f"fabric_lab: {len(racks)} racks: "
              + "; ".join(f"tor{j} ports {rack} uplink {UPLINK}={self.cables[j]}"
                          for j, rack in enumerate(racks))
              + f"; ToRs ({a.tor_target}); spine ({a.spine_target}) ports "
              + f"{sorted(spine_ports)}; link loss {a.link_loss}%"
              + (f" (tc on the BMv2 ends {', '.join(self.lossy)})" if self.lossy else ""),
              file=sys.stderr, flush=True)

    def restart(self, name: str) -> int:
        """Stop child `name` (TERM, then KILL after 10 s) and start it again as it was
        started; its pid."""
        child = self.children[name]
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        self.spawn(name, *self.argvs[name])
        return self.children[name].pid

    def serve_request(self) -> None:
        """Answer a pending fabric.request in the workdir (see the module doc)."""
        request = self.args.workdir / "fabric.request"
        try:
            rid, what, j = request.read_text().split()
        except (FileNotFoundError, ValueError):
            return
        request.unlink(missing_ok=True)
        name = f"{what}{j}"
        if what != "tor" or name not in self.children:
            reply = f"{rid} error no ToR {j} in this fabric (ToRs: " \
                    f"{', '.join(sorted(n for n in self.children if n.startswith('tor')))})"
        else:
            print(f"fabric_lab: restarting {name} (request {rid})", file=sys.stderr,
                  flush=True)
            try:
                reply = f"{rid} ok tor {j} {self.restart(name)}"
            except RuntimeError as e:
                reply = f"{rid} error {e}"
        tmp = self.args.workdir / "fabric.reply.tmp"
        tmp.write_text(reply + "\n")
        tmp.rename(self.args.workdir / "fabric.reply")

    def stop(self) -> None:
        for name in ["fabric", *sorted(n for n in self.children if n != "fabric")]:
            child = self.children.get(name)
            if child is not None and child.poll() is None:
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
        stats = {}
        for name in self.children:
            path = self.args.workdir / f"fabric-{name}.json"
            if path.exists():
                stats[name] = json.loads(path.read_text())
        lost = {}
        for dev in self.lossy:
            try:
                lost[dev] = frames_lost(dev)
            except RuntimeError as e:
                print(f"fabric_lab: {e}", file=sys.stderr, flush=True)
        if lost:
            print("fabric_lab: frames lost on the BMv2 ends' veths: "
                  + ", ".join(f"{d} {n}" for d, n in lost.items()), file=sys.stderr, flush=True)
        if self.args.stats_file:
            write_private(self.args.stats_file,
                          json.dumps({"switches": stats, "lost": lost}, indent=1).encode())
        for tor_if in self.cables:
            subprocess.run(["ip", "link", "del", tor_if], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for directory in {args.workdir, *([args.stats_file.parent] if args.stats_file else [])}:
            check_directory(directory)
    except ValueError as e:
        print(f"fabric_lab: {e}", file=sys.stderr, flush=True)
        return 2
    fabric = Fabric(args)
    stopping = False

    def on_term(*_: object) -> None:
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        fabric.start()
        if args.ready_file:
            args.ready_file.write_text("ready")
        while not stopping:
            fabric.serve_request()
            dead = [n for n, c in fabric.children.items() if c.poll() is not None]
            if dead:
                print(f"fabric_lab: {', '.join(dead)} exited: stopping the fabric",
                      file=sys.stderr, flush=True)
                return 1
            time.sleep(0.2)
        return 0
    except (RuntimeError, ValueError, subprocess.CalledProcessError, OSError) as e:
        print(f"fabric_lab: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        fabric.stop()


if __name__ == "__main__":
    sys.exit(main())
