"""Run one process per lab host, torchrun style:

    netreduce launch --hosts N [options] -- CMD [ARGS...]   (= python -m netreduce.tools.launch)

Rank I runs `CMD` in network namespace h(F+I), F = `--first-host` (default 0)
(`ip netns exec h(F+I) ...`; `--local` runs every rank here instead) with RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (default: rank 0's lab address 10.77.0.(F+1), or
127.0.0.1 with --local), MASTER_PORT and
the job's credentials set: NR_JOB_SECRET on rank 0 (a fresh random secret per run, unless
already set), NR_RANK_KEY (that rank's own key, derived from it) on every other rank.
In the lab's namespaces it also points torch's socket transports at the lab interface
(GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME = nr0) unless they are set: gloo otherwise advertises
an address of the namespace's hostname ([::1]) that no other rank can reach.
Warm starts: with `--forkservers DIR` (default $NR_FORKSERVERS, which scripts/lab.sh sets)
rank I is forked by the fork server listening on DIR/h(F+I).sock (DIR/local.sock with
--local; netreduce.tools.forkserver), which has numpy, pyverbs and grpc imported already:
under the lab's emulated CPUs that saves ~12 s per rank. A rank the server cannot run warm
(a command that is not `PYTHON SCRIPT ...` or `PYTHON -m MODULE ...` with its interpreter, a
missing socket) starts cold; the launcher logs why and the summary line counts cold ranks.
Every output line comes out prefixed "[rank I] ". When a rank fails, the others get
`--grace` seconds to finish before they are stopped; `--timeout` bounds the whole run.
Exit code: 0 if every rank exited 0, else the first failing rank's code (124 on timeout).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Mapping, Protocol, TextIO

from netreduce.tools.forkserver import NETNS_DIR as _NETNS_DIR, Refused, WarmProcess
from nr_contract.distribution import HelpFormatter
from ring_setup.store_protocol import (DEFAULT_PORT, RANK_KEY_ENV, SECRET_ENV, new_secret,
                                       rank_key)

log = logging.getLogger(__name__)

LAB_NET = "10.77.0."               # host hI is LAB_NET + (I + 1) (scripts/setup_rxe.sh)
LOCAL_MASTER_ADDR = "127.0.0.1"
LAB_IFNAME = "nr0"                 # every lab host's interface (scripts/setup_rxe.sh)
TORCH_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
NETNS_DIR = Path(_NETNS_DIR)
TIMEOUT_EXIT = 124
FORKSERVERS_ENV = "NR_FORKSERVERS"
_STOP_WAIT = 5.0


class RankProcess(Protocol):
    """What the launcher needs of a rank's process (subprocess.Popen or a WarmProcess):
    `pid` leads the rank's own process group."""
    pid: int
    returncode: int | None
    stdout: "IO[bytes] | None"

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class RankResult:
    rank: int
    returncode: int | None = None
    output: list[str] = field(default_factory=list)
    stopped: bool = False          # stopped by the launcher (another rank failed, or timeout)


@dataclass
class LaunchResult:
    ranks: list[RankResult]
    timed_out: bool = False
    cold: int = 0                  # ranks started cold although fork servers were given

    @property
    def exit_code(self) -> int:
        if self.timed_out:
            return TIMEOUT_EXIT
        failed = [r for r in self.ranks if r.returncode]
        first = next((r for r in failed if not r.stopped), failed[0] if failed else None)
        if first is None:
            return 0
        code = first.returncode or 1
        return code if code > 0 else 128 - code     # killed by signal N -> 128 + N

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def rank_env(rank: int, world_size: int, master_addr: str, port: int, local: bool,
             base: Mapping[str, str]) -> dict[str, str]:
    """Rank `rank`'s environment: `base`, torchrun's variables, and (in the lab's
    namespaces) torch's socket interfaces, which `base` may override. The job's secret
    (`base`'s NR_JOB_SECRET) goes to rank 0 only, which serves the store; every other rank
    gets its own key derived from it (NR_RANK_KEY), which proves that rank and no other."""
    ifnames = {} if local else {v: LAB_IFNAME for v in TORCH_IFNAME_VARS}
    env = {k: v for k, v in base.items() if k not in (SECRET_ENV, RANK_KEY_ENV)}
    if SECRET_ENV in base:
        secret = base[SECRET_ENV]
        env.update({SECRET_ENV: secret} if rank == 0 else
                   {RANK_KEY_ENV: rank_key(secret.encode(), rank).hex()})
    return {**ifnames, **env, "RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank if local else 0),
            "LOCAL_WORLD_SIZE": str(world_size if local else 1),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1"}     # a crash in a C extension prints its Python stack


def _pump(proc: RankProcess, result: RankResult, out: TextIO,
          lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        result.output.append(line)
        with lock:
            out.write(f"[rank {result.rank}] {line}\n")
            out.flush()


def _signal(proc: RankProcess, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)       # the rank's own process group (start_new_session)
    except ProcessLookupError:
        pass


def launch(cmd: list[str], hosts: int, *, master_addr: str | None = None,
           port: int = DEFAULT_PORT, local: bool = False, timeout: float = 3600.0,
           grace: float = 10.0, out: TextIO | None = None,
           env: Mapping[str, str] | None = None, first_host: int = 0,
           forkservers: str | None = None) -> LaunchResult:
    """Run `cmd` as ranks 0..hosts-1 (on lab hosts first_host, first_host + 1, ...) and wait
    for all of them (see the module doc); their prefixed output goes to `out` (default:
    sys.stdout). `forkservers`: the fork servers' directory (default $NR_FORKSERVERS; ""
    starts every rank cold)."""
    out = sys.stdout if out is None else out
    if hosts < 1:
        raise ValueError(f"launch: --hosts {hosts} must be >= 1")
    if not cmd:
        raise ValueError("launch: no command given")
    if first_host < 0:
        raise ValueError(f"launch: --first-host {first_host} must be >= 0")
    names = [f"h{first_host + i}" for i in range(hosts)]
    if not local:
        missing = [n for n in names if not (NETNS_DIR / n).exists()]
        if missing:
            raise ValueError(f"launch: network namespace(s) {', '.join(missing)} do not exist: "
                             f"run inside the lab (scripts/lab.sh --hosts "
                             f"{first_host + hosts} -- ...) or use --local")
    master = master_addr or (LOCAL_MASTER_ADDR if local else f"{LAB_NET}{first_host + 1}")
    # the job's secret, which the rendezvous store asks of every connection: fresh per run
    base = {SECRET_ENV: new_secret(), **(os.environ if env is None else env)}
    servers = os.environ.get(FORKSERVERS_ENV, "") if forkservers is None else forkservers
    lock = threading.Lock()
    results = [RankResult(i) for i in range(hosts)]
    procs: list[RankProcess] = []
    pumps = []
    cold = 0
    try:
        for i in range(hosts):
            rank_vars = rank_env(i, hosts, master, port, local, base)
            p = _warm(servers, None if local else names[i], cmd, rank_vars, i)
            if p is None:
                cold += bool(servers)
                argv = cmd if local else ["ip", "netns", "exec", names[i], *cmd]
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=rank_vars)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p, results[i], out, lock), daemon=True)
            t.start()
            pumps.append(t)
        timed_out = _supervise(procs, results, timeout, grace, out, lock)
    finally:
        _stop(procs, results)
        for t in pumps:
            t.join(timeout=_STOP_WAIT)
    for p, r in zip(procs, results):
        r.returncode = p.returncode
    result = LaunchResult(results, timed_out, cold)
    with lock:
        out.write("[launch] " + "; ".join(
            f"rank {r.rank}: exit {r.returncode}{' (stopped)' if r.stopped else ''}"
            for r in results) + (" - timed out" if timed_out else "")
            + (f" - {cold} rank(s) started cold, not by the fork servers" if cold else "")
            + "\n")
        out.flush()
    return result


def _warm(servers: str, netns: str | None, cmd: list[str], env: Mapping[str, str],
          rank: int) -> WarmProcess | None:
    """Rank `rank` forked by the fork server of lab host `netns` (None: --local) in
    directory `servers`, or None (no servers given, or this one cannot: logged) to start
    it cold."""
    if not servers:
        return None
    path = os.path.join(servers, f"{netns or 'local'}.sock")
    try:
        return WarmProcess(path, cmd, env, netns=None if netns is None else str(NETNS_DIR / netns))
    except Refused as exc:
        log.warning("launch: rank %d starts cold: the fork server %s refused: %s",
                    rank, path, exc)
    except OSError as exc:
        log.warning("launch: rank %d starts cold: no fork server at %s (%s)", rank, path, exc)
    return None


def _supervise(procs: list[RankProcess], results: list[RankResult],
               timeout: float, grace: float, out: TextIO, lock: threading.Lock) -> bool:
    """Wait for every rank; returns whether the global timeout struck."""
    start = time.monotonic()
    failed_at: float | None = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if now - start > timeout:
            with lock:
                out.write(f"[launch] timeout after {timeout:g}s: stopping every rank\n")
            return True
        if failed_at is None:
            failed = [(i, p.returncode) for i, p in enumerate(procs) if p.poll()]
            if failed:
                failed_at = now
                with lock:
                    out.write(f"[launch] rank {failed[0][0]} exited with code {failed[0][1]}: "
                              f"stopping the others in {grace:g}s\n")
        elif now - failed_at > grace:
            return False
        time.sleep(0.05)
    return False


def _stop(procs: list[RankProcess], results: list[RankResult]) -> None:
    """SIGTERM every rank still running, SIGKILL what is left after a few seconds."""
    running = [(p, r) for p, r in zip(procs, results) if p.poll() is None]
    for p, r in running:
        r.stopped = True
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_WAIT
    for p, _ in running:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL)
            p.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", type=int, required=True, help="number of ranks")
    parser.add_argument("--local", action="store_true",
                        help="run every rank in this namespace (no lab)")
    parser.add_argument("--first-host", type=int, default=0, metavar="F",
                        help="rank I runs on lab host h(F+I)")
    parser.add_argument("--master-addr", help="rendezvous address (default: rank 0's)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="the rendezvous port each rank gets as MASTER_PORT")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds the whole run may take (then exit 124)")
    parser.add_argument("--forkservers", metavar="DIR",
                        help="fork servers' directory: rank I forked by DIR/h(F+I).sock "
                             f"(default ${FORKSERVERS_ENV}; \"\" for cold starts)")
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds the other ranks get to finish after one fails")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        result = launch(cmd, args.hosts, master_addr=args.master_addr, port=args.port,
                        local=args.local, timeout=args.timeout, grace=args.grace,
                        first_host=args.first_host, forkservers=args.forkservers)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:           # the ranks were stopped on the way out
        return 130
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netreduce launch", description=__doc__,
                                     formatter_class=HelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
