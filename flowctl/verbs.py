"""`Link` over pyverbs: RDMA WRITE WITH IMMEDIATE on a ring's RC QPs (runs only where rxe is).

The immediate travels in network byte order (htonl(message index mod 2^32)), so captures
and the switch see the index as a plain big-endian number.
"""
from __future__ import annotations

import socket
from typing import Callable, Mapping

import pyverbs.enums as e
from pyverbs.cq import CQ, cqe_status_to_str
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QP
from pyverbs.utils import qp_state_to_str
from pyverbs.wr import SGE, RecvWR, SendWR

from flowctl.link import Completion, LocalBuffer, RemoteBuffer
from flowctl.plan import IMM_MODULUS


class VerbsLink:
    """One rank's QP pair in a ring: `send_qp` (requester, to the successor, completions on
    `send_cq`) and `recv_qp` (responder, from the predecessor, completions on `recv_cq`).

    Every WRITE is signaled (one send completion per message). Receives carry one empty
    scatter entry (`recv_sge`, 0 bytes): a WRITE WITH IMMEDIATE places its data by RETH and
    only consumes the receive for its completion.
    """

    def __init__(self, *, send_qp: QP, send_cq: CQ, recv_qp: QP, recv_cq: CQ,
                 recv_sge: LocalBuffer, successor: int, predecessor: int, device: str,
                 counters: Callable[[], Mapping[str, int]]) -> None:
        self.send_qp, self.send_cq = send_qp, send_cq
        self.recv_qp, self.recv_cq = recv_qp, recv_cq
        self._recv_sge = recv_sge
        self.successor, self.predecessor = successor, predecessor
        self.device = device
        self._counters = counters

    def post_write(self, index: int, src: LocalBuffer, dst: RemoteBuffer) -> None:
        wr = SendWR(wr_id=index, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                    sg=[SGE(src.addr, src.nbytes, src.lkey)], send_flags=e.IBV_SEND_SIGNALED,
                    imm_data=socket.htonl(index % IMM_MODULUS))
        wr.set_wr_rdma(dst.rkey, dst.addr)
        self.send_qp.post_send(wr)

    def post_recvs(self, count: int) -> None:
        sge = self._recv_sge
        for _ in range(count):
            self.recv_qp.post_recv(RecvWR(wr_id=0, num_sge=1, sg=[SGE(sge.addr, 0, sge.lkey)]))

    def poll_sends(self, max_count: int) -> list[Completion]:
        _, wcs = self.send_cq.poll(max_count)
        return [Completion(wc.wr_id, wc.status == e.IBV_WC_SUCCESS, _status(wc)) for wc in wcs]

    def poll_recvs(self, max_count: int) -> list[Completion]:
        _, wcs = self.recv_cq.poll(max_count)
        return [Completion(socket.ntohl(wc.imm_data), wc.status == e.IBV_WC_SUCCESS, _status(wc))
                for wc in wcs]

    def diagnostics(self) -> str:
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
