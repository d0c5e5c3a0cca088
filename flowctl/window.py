"""The credit window: how many messages one sender may have outstanding.

Pure accounting, unit-tested without RDMA. A message is outstanding from the moment its
RDMA WRITE is posted until its send completion arrives, which on an RC QP means the
responder acknowledged all of it. Send completions of one QP arrive in posting order.
"""
from __future__ import annotations

from collections import deque


class WindowError(RuntimeError):
    """The window's accounting was violated: a bug in the caller or an out-of-order completion."""


class CreditWindow:
    """At most `size` messages outstanding.

    Invariants: 0 <= len(outstanding) <= size; `outstanding` holds message indices in
    posting order; a completion must name the oldest outstanding message.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"flowctl: window of {size} messages")
        self.size = size
        self._outstanding: deque[int] = deque()

    @property
    def available(self) -> int:
        """Credits left: how many more messages may be posted now."""
        return self.size - len(self._outstanding)

    @property
    def pending(self) -> int:
        """How many messages are outstanding."""
        return len(self._outstanding)

    @property
    def outstanding(self) -> tuple[int, ...]:
        return tuple(self._outstanding)

    @property
    def oldest(self) -> int | None:
        return self._outstanding[0] if self._outstanding else None

    def post(self, index: int) -> None:
        """Spend one credit on message `index`."""
        if not self.available:
            raise WindowError(f"flowctl: message {index} posted with all {self.size} credits "
                              f"spent (outstanding {self.outstanding})")
        self._outstanding.append(index)

    def complete(self, index: int) -> None:
        """Return the credit of message `index`, which must be the oldest outstanding one."""
        if not self._outstanding:
            raise WindowError(f"flowctl: completion for message {index} with nothing outstanding")
        if index != self._outstanding[0]:
            raise WindowError(f"flowctl: completion for message {index} while the oldest "
                              f"outstanding is {self._outstanding[0]}")
        self._outstanding.popleft()
