"""The registered memory allreduce works in, reused across calls."""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from flowctl.link import LocalBuffer, RemoteBuffer

MIN_WORKSPACE = 64 * 1024


class RegisteredMemory(Protocol):
    """Memory registered LOCAL_WRITE | REMOTE_WRITE with the communicator's device."""

    nbytes: int

    def local(self) -> LocalBuffer: ...
    def remote(self) -> RemoteBuffer: ...
    def view(self) -> np.ndarray: ...
    def close(self) -> None: ...


class Workspace:
    """One registered buffer, grown to the largest size any call needed (rounded up to a
    power of two, at least `MIN_WORKSPACE`), never shrunk, so that registration is paid once
    rather than per call. Invariant: the buffer `ensure` returns stays registered until a
    later `ensure` grows it or `close`; with `keep=True` a grown-out buffer stays registered
    and untouched (retired) until `release_retired` or `close`: the last switch call's wire
    words may still be needed (netreduce/away.py). Peers learn its address and R_Key per
    call."""

    def __init__(self, register: Callable[[int], RegisteredMemory]) -> None:
        self._register = register
        self._buffer: RegisteredMemory | None = None
        self._retired: list[RegisteredMemory] = []

    def ensure(self, nbytes: int, keep: bool = False) -> RegisteredMemory:
        if self._buffer is None or self._buffer.nbytes < nbytes:
            size = max(MIN_WORKSPACE, 1 << max(0, nbytes - 1).bit_length())
            if keep and self._buffer is not None:
                self._retired.append(self._buffer)
            elif self._buffer is not None:
                self._buffer.close()
            self._buffer = None
            self._buffer = self._register(size)
        return self._buffer

    def release_retired(self) -> None:
        """Deregister the buffers `ensure(keep=True)` retired."""
        while self._retired:
            self._retired.pop().close()

    def close(self) -> None:
        self.release_retired()
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
