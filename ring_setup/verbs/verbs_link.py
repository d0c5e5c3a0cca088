"""`Link` over pyverbs: RDMA WRITE WITH IMMEDIATE on a ring's RC QPs (runs only where rxe is).

The immediate travels in network byte order (htonl(message index mod 2^32)), so captures
and the switch see the index as a plain big-endian number. Every pyverbs call is preceded by
the device's `life.check` (ring_setup.verbs.host.DeviceLife): a closed CQ or QP raises, never
reaches libibverbs (where it is a SIGSEGV).
"""
from __future__ import annotations

import os
import select
import socket
from typing import Callable, Mapping, Protocol

import pyverbs.enums as e
from pyverbs.cq import CQ, CompChannel, cqe_status_to_str
from pyverbs.device import Context
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QP
from pyverbs.utils import qp_state_to_str
from pyverbs.wr import SGE, RecvWR, SendWR

from flowctl.link import Completion, Gather, LocalBuffer, RemoteBuffer, sges
from flowctl.plan import IMM_MODULUS


class Life(Protocol):
    """Whether the device is still open (ring_setup.verbs.host.DeviceLife)."""

    name: str
    closed: bool

    def check(self, what: str) -> None: ...


class EventCQ:
    """A CQ with a completion channel of its own, so its poller can sleep until the next
    completion (`fd` turns readable when the armed CQ raises its event).

    Invariants: at most one event is outstanding (verbs disarm a CQ when they raise its
    event, and `arm` re-arms only a disarmed one); every event taken is acknowledged at
    once, so destroying the CQ never blocks on unacknowledged events.
    """

    def __init__(self, ctx: Context, cqe: int, life: Life) -> None:
        self.life = life
        self.channel, self.fd = _open_channel(ctx)
        self.cq = CQ(ctx, cqe, None, self.channel, 0)
        self.armed = False

    def arm(self) -> None:
        if not self.armed:
            self.life.check("arming a CQ")
            self.cq.req_notify()
            self.armed = True

    def take_event(self) -> None:
        """Consume the raised event (call only when `fd` polled readable: it would block)."""
        self.life.check("taking a CQ event")
        self.channel.get_cq_event(self.cq)
        self.cq.ack_events(1)
        self.armed = False


_EVENT_FD = "anon_inode:[infinibandevent]"


def _open_channel(ctx: Context) -> tuple[CompChannel, int]:
    """A completion channel and its file descriptor, which pyverbs keeps to itself: the
    one [infinibandevent] descriptor that appeared while the channel was created."""
    before = _open_fds()
    channel = CompChannel(ctx)
    new = [fd for fd, target in _open_fds().items()
           if target == _EVENT_FD and before.get(fd) != target]
    if len(new) != 1:
        channel.close()
        raise RuntimeError(f"flowctl: cannot tell the completion channel's descriptor "
                           f"({len(new)} new {_EVENT_FD} descriptors)")
    return channel, new[0]


def _open_fds() -> dict[int, str]:
    """This process's descriptors and what they refer to (the listing's own, closed by
    the time it is read, drops out)."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return fds


_WRITE_CACHE = 4096


class VerbsLink:
    """One rank's QP pair in a ring: `send_qp` (requester, to the successor, completions on
    `send_cq`) and `recv_qp` (responder, from the predecessor, completions on `recv_cq`).

    Every WRITE is signaled (one send completion per message). Receives carry one empty
    scatter entry (`recv_sge`, 0 bytes): a WRITE WITH IMMEDIATE places its data by RETH and
    only consumes the receive for its completion.

    Work requests are built once and reposted (verbs copy a WR when it is posted): the one
    receive, and a WRITE per (source SGEs, destination) span -- a communicator sends from and
    to the same workspace (or cached user memory) spans call after call -- of which at most
    `_WRITE_CACHE` are kept. A `Gather` source is one WRITE with one SGE per part.
    Each pyverbs object costs a Python allocation and a logger lookup, per message.
    """

    def __init__(self, *, send_qp: QP, send_cq: EventCQ, recv_qp: QP, recv_cq: EventCQ,
                 recv_sge: LocalBuffer, successor: int, predecessor: int, life: Life,
                 counters: Callable[[], Mapping[str, int]]) -> None:
        self.send_qp, self.send_cq = send_qp, send_cq
        self.recv_qp, self.recv_cq = recv_qp, recv_cq
        self._by_fd = {cq.fd: cq for cq in (send_cq, recv_cq)}
        self._poller = select.poll()
        for fd in self._by_fd:
            self._poller.register(fd, select.POLLIN)
        self._recv_wr = RecvWR(wr_id=0, num_sge=1, sg=[SGE(recv_sge.addr, 0, recv_sge.lkey)])
        self._writes: dict[tuple[int, int, int, int, int], SendWR] = {}
        self.successor, self.predecessor = successor, predecessor
        self.life = life
        self.device = life.name
        self._counters = counters

    def post_write(self, index: int, src: LocalBuffer | Gather, dst: RemoteBuffer) -> None:
        self.life.check(f"posting message {index} to rank {self.successor}")
        key = (src, dst.addr, dst.rkey)
        wr = self._writes.get(key)
        if wr is None:
            if len(self._writes) >= _WRITE_CACHE:
                self._writes.clear()
            parts = sges(src)
            wr = self._writes[key] = SendWR(
                opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=len(parts),
                sg=[SGE(p.addr, p.nbytes, p.lkey) for p in parts],
                send_flags=e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(dst.rkey, dst.addr)
        wr.wr_id = index
        wr.imm_data = socket.htonl(index % IMM_MODULUS)
        self.send_qp.post_send(wr)

    def post_recvs(self, count: int) -> None:
        self.life.check(f"posting receives from rank {self.predecessor}")
        for _ in range(count):
            self.recv_qp.post_recv(self._recv_wr)

    def poll_sends(self, max_count: int) -> list[Completion]:
        self.life.check("polling send completions")
        _, wcs = self.send_cq.cq.poll(max_count)
        return [Completion(wc.wr_id, wc.status == e.IBV_WC_SUCCESS, _status(wc)) for wc in wcs]

    def poll_recvs(self, max_count: int) -> list[Completion]:
        self.life.check("polling receive completions")
        _, wcs = self.recv_cq.cq.poll(max_count)
        return [Completion(socket.ntohl(wc.imm_data), wc.status == e.IBV_WC_SUCCESS, _status(wc),
                           empty=wc.byte_len == 0) for wc in wcs]

    def arm(self) -> None:
        self.send_cq.arm()
        self.recv_cq.arm()

    def wait(self, timeout: float) -> None:
        for fd, _ in self._poller.poll(max(0.0, timeout) * 1000):
            self._by_fd[fd].take_event()

    def diagnostics(self) -> str:
        if self.life.closed:
            return f"{self.device} is closed"
        counters = ", ".join(f"{k}={v}" for k, v in sorted(self._counters().items()))
        return (f"send QP {self.send_qp.qp_num} (to rank {self.successor}) "
                f"{_qp_state(self.send_qp)}, recv QP {self.recv_qp.qp_num} (from rank "
                f"{self.predecessor}) {_qp_state(self.recv_qp)}; {self.device} counters: "
                f"{counters or 'unavailable'}")


def _status(wc: object) -> str:
    status = wc.status  # type: ignore[attr-defined]
    if status == e.IBV_WC_SUCCESS:
        return "success"
    return f"{cqe_status_to_str(status)} (status {status}, vendor_err {wc.vendor_err})"  # type: ignore[attr-defined]


def _qp_state(qp: QP) -> str:
    try:
        attr, _ = qp.query(e.IBV_QP_STATE)
        return qp_state_to_str(attr.qp_state)
    except PyverbsError as exc:
        return f"state unknown ({exc})"
