"""What the tests need of the local system around the processes they start: a free TCP port
on localhost and one way to stop a process (signal, bounded wait, SIGKILL past it) so that
no test leaves a child behind."""
from __future__ import annotations

import signal
import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the OS's pick for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0,
                 sig: int = signal.SIGTERM) -> subprocess.CompletedProcess[Any]:
    """Stop `proc` and reap it: `sig` if it still runs, up to `timeout` s for it to exit (its
    pipes read meanwhile, so it never blocks writing them), SIGKILL past that. Returns its
    exit code (negative: the signal that ended it) and what `communicate` read (None for
    a stream that is not a pipe)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
