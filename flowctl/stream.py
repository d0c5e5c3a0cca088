"""The flow-control stream: messages out to the successor under the credit window, messages
in from the predecessor, progressed together in one thread.

Invariants of a `Stream`:
- message indices run on per direction across transfers (0, 1, 2, ...); every message is
  an RDMA WRITE WITH IMMEDIATE whose immediate is its index mod 2^32, and the receiver
  checks each arrival carries the next index;
- at most `config.window` messages are outstanding (posted, not yet completed);
- `config.recv_depth` receives are posted on the receiving QP outside `transfer`; each
  consumed receive is reposted, and receive completions are polled at most as many as the
  current transfer still expects, so early arrivals of the next transfer stay queued;
- a transfer reaps the send completions an earlier transfer left outstanding (in posting
  order, before its own) and, unless called with `settle=False`, returns only when
  nothing is outstanding. An unsettled transfer returns once every expected message has
  arrived and every message of its own is posted: its sources must stay unchanged until a
  later transfer or `settle()` reaps their completions (go-back-N re-reads them). A
  transfer's `then` part is posted behind its own messages (the next call's records
  behind this call's data) and is never waited for: it stays unsettled;
- a receive that wrote no bytes and carries the immediate of the message that arrived last
  is not a message: rxe sends a message again as one zero-length packet after a retry race
  (docs/roce.md); it is counted (`empty_resends`), logged and its receive reposted;
- an idle stream sleeps in the kernel, never spins: after an empty poll it arms completion
  events (`Link.arm`), polls once more, and only then waits for an event (`Link.wait`) for
  at most `LIVENESS_POLL` seconds. Spinning would take the CPU from the kernel's rxe, which
  does the actual work on the same cores;
- liveness is separate from progress: while idle, the stream calls its `liveness` check at
  least every `liveness_poll` s (default `LIVENESS_POLL`; `last_progress` says since when
  the transfer has waited; it raises when a peer died or aborted: the caller's error,
  naming the peer, propagates as is), and only `config.collective_timeout` s without any
  completion while the check passes is a `StallError`. A slow but live peer is waited for;
- a transfer left by an exception leaves the stream `interrupted` for good: its indices and
  window no longer match the peer's, so only new QPs carry anything again.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from flowctl.link import Completion, Gather, Link, LocalBuffer, RemoteBuffer
from flowctl.plan import IMM_MODULUS, FlowConfig, Message, MessagePlan
from flowctl.window import CreditWindow, WindowError

LIVENESS_POLL = 0.25     # seconds an idle stream sleeps before it checks its peers again

log = logging.getLogger(__name__)


class FlowError(RuntimeError):
    """A transfer failed: the message names rank, peer, message, QP states and counters."""


class CompletionError(FlowError):
    """A work completion came back with an error status (`status`, on the stream `label`
    names: a transport fault, netreduce/transport_fault.py)."""

    def __init__(self, message: str, status: str = "", label: str = "") -> None:
        super().__init__(message)
        self.status, self.label = status, label


class StallError(FlowError):
    """Nothing completed within the collective timeout while work was pending and every
    peer was alive."""


class SequenceError(FlowError):
    """A completion named another message than the one due: the ranks are out of step."""


@dataclass(frozen=True)
class Outgoing:
    """`src` (local: one region, or a `Gather` of several) is written to `dst` (the
    successor's memory), both of the same size."""

    src: LocalBuffer | Gather
    dst: RemoteBuffer

    def __post_init__(self) -> None:
        if self.src.nbytes != self.dst.nbytes:
            raise ValueError(f"flowctl: {self.src.nbytes} bytes sent into a "
                             f"{self.dst.nbytes}-byte destination")


OnArrival = Callable[[Message], None]
Liveness = Callable[[], None]        # raises when a peer is known to have failed


class Stream:
    """A flow-controlled message stream over one `Link` (see the module's invariants)."""

    def __init__(self, link: Link, config: FlowConfig, label: str,
                 liveness: Liveness | None = None) -> None:
        self.link = link
        self.config = config
        self.label = label            # who we are in error messages, e.g. "rank 1, ring 'ring'"
        self.liveness = liveness
        self.liveness_poll = LIVENESS_POLL
        self.last_progress = time.monotonic()   # the running transfer's last completion
        self.window = CreditWindow(config.window)
        self.next_send_index = 0
        self.next_recv_index = 0
        self.empty_resends = 0        # zero-length repeats of an arrived message (rxe's race)
        self.interrupted = False      # a transfer was left by an exception (module doc)
        link.post_recvs(config.recv_depth)

    @property
    def settled(self) -> bool:
        """Nothing is outstanding (every message sent so far is acknowledged)."""
        return not self.window.pending

    def settle(self) -> None:
        """Wait for the acknowledgements an unsettled transfer left outstanding."""
        if not self.settled:
            self.transfer(None)

    def transfer(self, send: Outgoing | None, recv_nbytes: int = 0,
                 on_arrival: OnArrival | None = None, settle: bool = True,
                 then: Outgoing | None = None) -> None:
        """Send `send` to the successor while `recv_nbytes` arrive from the predecessor;
        `on_arrival(message)` runs for each arrived message, in order. Returns when every
        expected message has arrived and every message is posted and, with `settle`, every
        message sent so far but `then`'s acknowledged (see the module's invariants); `then`
        is posted behind `send`, as messages of its own."""
        out = MessagePlan(send.src.nbytes if send else 0, self.config.msg_size,
                          self.next_send_index)
        parts, end_index = [(m, send) for m in out], out.end_index
        if then is not None:
            behind = MessagePlan(then.src.nbytes, self.config.msg_size, out.end_index)
            parts, end_index = parts + [(m, then) for m in behind], behind.end_index
        unsettled = len(parts) - len(out)     # `then`'s messages: never waited for here
        inc = list(MessagePlan(recv_nbytes, self.config.msg_size, self.next_recv_index))
        recv_end = self.next_recv_index + len(inc)
        posted = arrived = 0
        to_post, expected = len(parts), len(inc)
        armed = False
        last_progress = self.last_progress = time.monotonic()
        window, link = self.window, self.link
        was, self.interrupted = self.interrupted, True      # until the loop ends normally
        while (settle and window.pending > unsettled) or posted < to_post \
                or arrived < expected:
            progressed = False
            while posted < to_post and window.available:
                (index, offset, length), part = parts[posted]
                assert part is not None
                link.post_write(index, part.src.slice(offset, length),
                                part.dst.slice(offset, length))
                window.post(index)
                posted += 1
                progressed = True
            pending = window.pending
            if pending:
                for c in link.poll_sends(pending):
                    self._send_completed(c)
                    progressed = True
            if arrived < expected:
                got = link.poll_recvs(expected - arrived)
                for c in got:
                    m = inc[arrived]
                    if c.empty and self._empty_resend(c, m.index):
                        continue
                    self._check_arrival(c, m)
                    arrived += 1
                    if on_arrival is not None:
                        on_arrival(m)
                if got:
                    link.post_recvs(len(got))
                    progressed = True
            if progressed:
                last_progress = self.last_progress = time.monotonic()
                armed = False
                continue
            if self.liveness is not None:
                self.liveness()
            idle_for = time.monotonic() - last_progress
            if idle_for > self.config.collective_timeout:
                pending_recv = inc[arrived] if arrived < expected else None
                raise StallError(self._stall_message(len(parts) - posted, pending_recv))
            elif not armed:
                link.arm()
                armed = True
            else:
                link.wait(min(self.liveness_poll, self.config.collective_timeout - idle_for))
                armed = False
        self.next_send_index = end_index
        self.next_recv_index = recv_end
        self.interrupted = was

    def _send_completed(self, c: Completion) -> None:
        if not c.ok:
            raise CompletionError(f"flowctl: {self.label}: RDMA WRITE of message {c.index} to "
                                  f"rank {self.link.successor} failed: {c.status}; "
                                  f"{self.link.diagnostics()}", c.status, self.label)
        try:
            self.window.complete(c.index)
        except WindowError as exc:
            raise SequenceError(f"{exc} ({self.label}, to rank {self.link.successor}); "
                                f"{self.link.diagnostics()}") from exc

    def _empty_resend(self, c: Completion, due: int) -> bool:
        """Is `c` the message before message `due` sent again empty (see the invariants)?"""
        if not (c.ok and c.empty and due > 0 and c.index == (due - 1) % IMM_MODULUS):
            return False
        self.empty_resends += 1
        log.info("flowctl: %s: message %d from rank %d came again as an empty write (rxe "
                 "re-cut its stream after a retry; %d so far): not a message, receive reposted",
                 self.label, due - 1, self.link.predecessor, self.empty_resends)
        return True

    def _check_arrival(self, c: Completion, m: Message) -> None:
        if not c.ok:
            raise CompletionError(f"flowctl: {self.label}: receive of message {m.index} from "
                                  f"rank {self.link.predecessor} failed: {c.status}; "
                                  f"{self.link.diagnostics()}", c.status, self.label)
        if c.index != m.imm:
            raise SequenceError(f"flowctl: {self.label}: expected message {m.index} (imm "
                                f"{m.imm}) from rank {self.link.predecessor}, got imm {c.index}: "
                                f"the ranks posted different message sequences; "
                                f"{self.link.diagnostics()}")
        if c.empty:
            raise SequenceError(f"flowctl: {self.label}: message {m.index} from rank "
                                f"{self.link.predecessor} arrived with no bytes (no message is "
                                f"empty); {self.link.diagnostics()}")

    def _stall_message(self, unposted: int, pending_recv: Message | None) -> str:
        waits = []
        if self.window.outstanding:
            waits.append(f"{len(self.window.outstanding)} message(s) to rank "
                         f"{self.link.successor} unacknowledged (oldest: message "
                         f"{self.window.oldest}, {unposted} more not yet posted)")
        if pending_recv is not None:
            waits.append(f"message {pending_recv.index} from rank {self.link.predecessor} "
                         f"not arrived")
        return (f"flowctl: {self.label}: nothing moved for {self.config.collective_timeout:g}s "
                f"(the collective timeout; every peer alive): {'; '.join(waits)}; "
                f"{self.link.diagnostics()}")
