"""The lab's torch fork server: one process that imports torch, torch.distributed,
torch._dynamo (DDP's constructor imports it) and netreduce.torch once and serves every host
(`netreduce.tools.forkserver --enter-netns`), so a torch launch's ranks fork with those
imports done instead of paying them each (~7 minutes of emulated CPU for 4 ranks:
docs/tests.md).

tests/lab/conftest.py starts it as soon as pytest has collected a torch test, so its
~3 minutes of imports run beside the lab tests before it, which leave the VM's CPUs idle
about a third of the time (waiting on timers, switch restarts, RC retries); the torch test then
waits for it (`TorchForkServer.ready`).
"""
from __future__ import annotations

import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Optional

from tests.processes import stop_process

#: what the server imports beyond the fork server's defaults
TORCH_PRELOAD = "torch,torch.distributed,torch._dynamo,netreduce.torch"


class TorchForkServerError(RuntimeError):
    pass


class TorchForkServer:
    """One server process, started by `start`, serving in a directory of its own: its socket
    `torch.sock`, its stderr in `torch.log` and, once `ready`, the links hI.sock that
    `netreduce launch --forkservers` looks for. Invariant: `ready` returns only once the
    server listens (it printed its socket's path), else raises naming its log; `stop` ends
    the process and removes the directory."""

    def __init__(self) -> None:
        self.where = Path(tempfile.mkdtemp(prefix="nr-torch-"))
        self.sock = self.where / "torch.sock"
        self.log = self.where / "torch.log"
        self._proc: Optional[subprocess.Popen[str]] = None
        self._started = 0.0
        self._listening: Optional[float] = None

    def start(self) -> None:
        with self.log.open("w") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "netreduce.tools.forkserver", str(self.sock),
                 "--also", TORCH_PRELOAD, "--enter-netns"],
                stdout=subprocess.PIPE, stderr=err, text=True)
        self._started = time.monotonic()

    def ready(self, hosts: int, timeout: float = 900) -> float:
        """Wait (at most `timeout` s from the start) until the server listens; link it as
        hosts h0..h(hosts-1)'s server; return how many seconds after its start it listened."""
        if self._proc is None:
            raise TorchForkServerError("the torch fork server was never started")
        if self._listening is None:
            out: IO[str] | None = self._proc.stdout
            assert out is not None
            left = max(0.0, self._started + timeout - time.monotonic())
            readable, _, _ = select.select([out], [], [], left)
            if not readable or out.readline().strip() != str(self.sock):
                raise TorchForkServerError(
                    f"the torch fork server did not listen within {timeout:.0f} s of its "
                    f"start: {self.log.read_text()[-4000:]}")
            self._listening = time.monotonic() - self._started
        for i in range(hosts):
            link = self.where / f"h{i}.sock"
            if not link.is_symlink():
                link.symlink_to(self.sock)
        return self._listening

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc, timeout=60)
            self._proc = None
        shutil.rmtree(self.where, ignore_errors=True)
