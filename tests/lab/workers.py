"""Launching lab jobs from a lab test: allreduce_worker.py as n ranks on the lab's hosts
(netreduce.tools.launch, one rank per host), in the foreground or in a thread, the lines a
rank printed, and the environment a launch gets (this tree first on PYTHONPATH; a new
user's shell). Every launch of a test session takes a port of its own."""
from __future__ import annotations

import contextlib
import io
import itertools
import os
import sys
import threading
from pathlib import Path
from typing import Iterator, Mapping, TextIO

import pytest

from netreduce.tools.launch import LaunchResult, launch
from tests.lab.labhosts import HOSTS, ROOT

WORKER = Path(__file__).with_name("allreduce_worker.py")
_PORTS = itertools.count(29600)


def next_port() -> int:
    """A MASTER_PORT no earlier launch of this test session used."""
    return next(_PORTS)


def tree_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: ours) with this tree first on PYTHONPATH: a rank run as a script or
    a console script would otherwise import whatever the venv has installed (another
    checkout's code), not this tree's."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def user_env() -> dict[str, str]:
    """What a new user's shell in the lab has: ours without the torch transports'
    interfaces (GLOO_SOCKET_IFNAME, TP_SOCKET_IFNAME), which the launcher must set itself."""
    return {k: v for k, v in os.environ.items()
            if k not in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")}


def run_worker(n: int, *args: str, timeout: float = 1800,
               out: TextIO | None = None, grace: float = 30,
               first_host: int = 0) -> LaunchResult:
    """allreduce_worker.py ARGS as n ranks (on hosts first_host, first_host + 1, ...); their
    prefixed output goes to `out` as it comes (default: stdout); `grace`: how long the
    others may run on after one rank failed."""
    if first_host + n > HOSTS:
        pytest.fail(f"the lab has {HOSTS} hosts, the test needs {first_host + n}")
    return launch([sys.executable, str(WORKER), *args], n, port=next_port(), timeout=timeout,
                  grace=grace, out=out, env=tree_env(), first_host=first_host)


class Watch(io.StringIO):
    """Output sink that sets `seen` once a line containing `marker` was written."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.seen = marker, threading.Event()

    def write(self, s: str) -> int:
        if self.marker in s:
            self.seen.set()
        return super().write(s)


@contextlib.contextmanager
def in_background(n: int, *args: str, until: Path, marker: str
                  ) -> Iterator[tuple[Watch, list[LaunchResult]]]:
    """Run allreduce_worker.py ARGS --until UNTIL as n ranks in a thread; enter once a rank
    printed `marker` (the Watch holds the output so far); on exit create `until` (the
    worker's cue to finish) and wait for the job, whose result is then in the list."""
    watch = Watch(marker)
    outcome: list[LaunchResult] = []
    worker = threading.Thread(target=lambda: outcome.append(
        # survivors hold until `until` (a lease expiry takes up to 3 leases + 30 s): the
        # launcher must not stop them 30 s after the rank that was killed on purpose
        run_worker(n, *args, "--until", str(until), timeout=600, out=watch, grace=300)))
    worker.start()
    try:
        assert watch.seen.wait(300), watch.getvalue()
        yield watch, outcome
    finally:
        until.touch()
        worker.join(timeout=300)


def lines(result: LaunchResult, rank: int, prefix: str) -> list[str]:
    """Rank `rank`'s output lines that start with `prefix`, the prefix cut off."""
    return [line[len(prefix):] for line in result.ranks[rank].output if line.startswith(prefix)]


#: what a rank's output says when it failed: its checks' verdicts, exceptions, the library's
#: errors and warnings (the lines a CI summary must show first; its tail is cut)
_WHY = ("FAIL", "Traceback", "netreduce.errors.", "RuntimeError", "AssertionError",
        "SystemExit", "ERROR", "WARNING")


def why(result: LaunchResult, rank: int, tail: int = 25) -> str:
    """Rank `rank`'s failure for an assertion message, most telling first: its exit code,
    the lines naming a failure or an error (at most 15), then the last `tail` lines."""
    r = result.ranks[rank]
    told = [x for x in r.output if any(w in x for w in _WHY)][-15:]
    return "\n".join([f"rank {rank}: exit {r.returncode}"
                      f"{' (stopped by the launcher)' if r.stopped else ''}",
                      *told, "... last lines:", *r.output[-tail:]])
