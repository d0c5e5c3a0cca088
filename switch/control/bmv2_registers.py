"""BMv2 register reads over Thrift: one long-lived simple_switch_CLI per switch.

BMv2's P4Runtime server cannot read registers, so the BMv2 targets read the few they report
(a connection's RETH, a ring's next PSN, a ToR's skipped slots) with simple_switch_CLI. A
CLI started per read costs an interpreter start and a download of the switch's JSON
program: about a second on a quiet machine, several seconds under the lab's load, and a
fabric's counters read a dozen registers (the controller's calls missed their 10 s
deadlines that way). So one CLI per switch is started on the first read and kept: each
read writes `register_read NAME INDEX` and a sync line the CLI cannot parse, and takes the
output up to the CLI's complaint about that sync line.

Invariants: a read returns the register's value or None (CLI missing, dead, silent past
its deadline, or no value printed), never a value read for another request; after a
failure the CLI is killed and the next read starts a fresh one (logged, counted in
`restarts`); reads are serialised (one CLI, one request at a time).
"""
from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import threading
import uuid
from typing import Optional

log = logging.getLogger(__name__)

FIRST_READ_TIMEOUT = 60.0   # s: the CLI's start downloads and parses the switch's program
READ_TIMEOUT = 10.0         # s: one read of a CLI already up


class ThriftRegisters:
    """`reader(name, index)`: register `name`[`index`] of the BMv2 switch at `thrift_port`,
    or None (module doc)."""

    def __init__(self, thrift_port: int = 9090, cli: str = "simple_switch_CLI"):
        self.cmd = [cli, "--thrift-port", str(thrift_port)]
        self._proc: Optional[subprocess.Popen[str]] = None
        self._lines: queue.Queue[Optional[str]] = queue.Queue()
        self._lock = threading.Lock()
        self._started = 0               # CLIs started (or tried)

    @property
    def restarts(self) -> int:
        """CLIs started after the first (each one logged)."""
        return max(0, self._started - 1)

    def __call__(self, name: str, index: int) -> Optional[int]:
        with self._lock:
            first = self._proc is None
            if first and not self._start():
                return None
            sync = f"nr_sync_{uuid.uuid4().hex[:12]}"
            try:
                assert self._proc is not None and self._proc.stdin is not None
                self._proc.stdin.write(f"register_read {name} {index}\n{sync}\n")
                self._proc.stdin.flush()
            except OSError as e:
                return self._fail(f"cannot write to it: {e}")
            want = re.compile(rf"{re.escape(name)}\[{index}\]\s*=\s*(\d+)")
            value: Optional[int] = None
            timeout = FIRST_READ_TIMEOUT if first else READ_TIMEOUT
            while True:
                try:
                    line = self._lines.get(timeout=timeout)
                except queue.Empty:
                    return self._fail(f"no answer to register_read {name} {index} within "
                                      f"{timeout:.0f} s")
                if line is None:
                    return self._fail("it exited")
                if sync in line:
                    return value
                m = want.search(line)
                if m:
                    value = int(m.group(1))

    def close(self) -> None:
        """Stop the CLI (a later read starts another)."""
        with self._lock:
            self._stop()

    def _start(self) -> bool:
        self._started += 1
        if self.restarts:
            log.warning("%s: starting it again (restart %d)", " ".join(self.cmd), self.restarts)
        try:
            proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                    start_new_session=True)
        except OSError as e:
            log.error("%s: cannot start it: %s", " ".join(self.cmd), e)
            return False
        lines: queue.Queue[Optional[str]] = queue.Queue()
        threading.Thread(target=_pump, args=(proc, lines), daemon=True,
                         name="bmv2-registers").start()
        self._proc, self._lines = proc, lines
        return True

    def _fail(self, why: str) -> None:
        log.error("%s: %s; register reads give None until a fresh CLI answers",
                  " ".join(self.cmd), why)
        self._stop()
        return None

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # the CLI and anything it started
        except ProcessLookupError:
            pass
        proc.wait()
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        # stdout is the pump thread's: it ends at the pipe's end of file


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[Optional[str]]) -> None:
    """The CLI's output, a line at a time, then None once it ends."""
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)
