"""The registered memory allreduce works in: the scratch reused across calls, and the
caller's own arrays registered for one zero-copy call."""
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
    later `ensure` grows it or `close`; peers learn its address and R_Key per call."""

    def __init__(self, register: Callable[[int], RegisteredMemory]) -> None:
        self._register = register
        self._buffer: RegisteredMemory | None = None

    def ensure(self, nbytes: int) -> RegisteredMemory:
        if self._buffer is None or self._buffer.nbytes < nbytes:
            size = max(MIN_WORKSPACE, 1 << max(0, nbytes - 1).bit_length())
            self.close()
            self._buffer = self._register(size)
        return self._buffer

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None


class UserMemory:
    """The caller's `src` and `dst` arrays registered for ONE call, so that WRITEs read `src`
    and land in `dst` without staging copies: one region when `dst` is `src` (in place),
    else two. Invariant: registered only while the call runs -- the communicator closes it
    when the call returns or raises -- so no registration outlives the memory it pins."""

    def __init__(self, register_array: Callable[[np.ndarray], RegisteredMemory],
                 src: np.ndarray, dst: np.ndarray) -> None:
        self.recv = register_array(dst)
        try:
            self._send = self.recv if same_memory(src, dst) else register_array(src)
        except BaseException:
            self.recv.close()
            raise

    @property
    def send(self) -> LocalBuffer:
        return self._send.local()

    def close(self) -> None:
        if self._send is not self.recv:
            self._send.close()
        self.recv.close()


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Both C-contiguous arrays cover exactly the same bytes."""
    return a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes


def zero_copy_possible(src: np.ndarray, dst: np.ndarray) -> bool:
    """`src` and `dst` (same shape and dtype) can be registered as they are: both
    C-contiguous, and `dst` is `src`'s memory exactly or shares none of it."""
    return (src.flags.c_contiguous and dst.flags.c_contiguous
            and (same_memory(src, dst) or not np.may_share_memory(src, dst)))
