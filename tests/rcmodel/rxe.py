"""A packet-level model of one Soft-RoCE (rxe) device: RC requester, completer, responder.

Every packet is a real RoCEv2 frame (switch.dataplane.packets.build_frame: IPv4, UDP 4791, BTH,
RETH/ImmDt/AETH, payload, ICRC) and every received frame is parsed and ICRC-checked. What
it reproduces, from drivers/infiniband/sw/rxe (Linux 7.x, the lab's kernel):

- rxe_req.c, `rxe_requester`: PSNs +1 per packet, 24-bit wrap (`psn_compare`, rxe_hdr.h);
  the send stops only when `psn_compare(req.psn, comp.psn + RXE_MAX_UNACKED_PSNS) > 0`,
  RXE_MAX_UNACKED_PSNS = 128: 129 PSNs may be unacknowledged (`MAX_UNACKED_PSNS`).
- rxe_req.c, `init_req_packet`: AckReq on the last packet of a message (RXE_END_MASK) and
  when `noack_pkts++ > RXE_MAX_PKT_PER_ACK` (64), i.e. on the 66th consecutive non-last
  packet; the counter resets whenever AckReq is set, and keeps running across a retry.
- rxe_req.c, `next_opcode_rc`: an RDMA WRITE WITH IMMEDIATE is ONLY_WITH_IMM (one packet)
  or FIRST, MIDDLE..., LAST_WITH_IMM; RETH on FIRST/ONLY (VA, R_Key, DMA length), ImmDt on
  the last; `req_retry` goes back to comp.psn, mid-message if need be (a retried packet has
  the opcode of its position, so a retry from the middle starts with MIDDLE).
- rxe_req.c `update_state` / rxe_comp.c `rxe_completer` (COMPST_EXIT): the retransmit
  timer (4.096 us x 2^timeout) is started by a send when not pending and pushed back when
  the completer finishes with packets still unacknowledged; `retransmit_timer` firing with
  something outstanding starts a retry (COMPST_ERROR_RETRY): counter `completer_retry_err`,
  retry_cnt decremented unless it is 7 ("forever"), at 0 the WQE completes with
  IBV_WC_RETRY_EXC_ERR (`retry_exceeded_err`) and the QP goes to ERROR (the rest flushed).
- rxe_comp.c `check_psn` / `check_ack`: ACKs are cumulative (an ACK at PSN p completes every
  WQE whose last PSN <= p, in order, and moves comp.psn past p); older ACKs are ignored; a
  NAK PSN sequence error at p acknowledges everything before p (`rcvd_seq_err`) and starts a
  retry from p, unless a retry started by a NAK is already under way (`started_retry`,
  cleared when a WQE completes: `reset_retry_counters`).
- rxe_resp.c `check_psn`: a request at the expected PSN executes; a later one draws ONE NAK
  PSN sequence error carrying the expected PSN (`out_of_seq_request`, `sent_psn_nak`), the
  following ones are dropped silently until the expected PSN arrives; an earlier one is a
  duplicate (`duplicate_request`): not executed again, re-ACKed with `ack_psn - 1`
  (`duplicate_request`, C9-105, every duplicate SEND/WRITE).
- rxe_resp.c `acknowledge`: an ACK only for a packet with AckReq (the responder itself
  coalesces nothing else: one ACK per AckReq); `check_op_seq` / `check_length` /
  `check_rkey`: MIDDLE/LAST without FIRST, a FIRST/MIDDLE payload other than the path MTU,
  a LAST/ONLY longer than it, a message whose packets do not add up to the RETH length
  -> NAK invalid request; a bad R_Key or a write outside the region -> NAK remote access
  error; both put the responder QP in ERROR and complete the requester's WQE with the
  matching error status.
- rxe_recv.c `rxe_rcv` / rxe_icrc.c: a frame with a bad ICRC, for another MAC, for an
  unknown QPN, or whose IP source is not the QP's remote address is dropped silently;
  `rcvd_pkts` counts the frames that pass, `sent_pkts` every frame sent (ACKs included).
- WRITE WITH IMMEDIATE consumes a posted receive and completes it with the immediate
  (`rdma_recvs`). `ack_deferred` (RXE_CNT_COMPLETER_SCHED) moves once per ACK/NAK the
  completer receives: what every call recorded in the lab showed (rcmodel/lab_calls.json).

Not modelled (see docs/rcmodel.md): RNR NAKs (a write with immediate finding no posted
receive is a `ModelError`), READ/atomics/SEND, the skb in-flight limit, CPU time.
"""
from __future__ import annotations

import itertools
import struct
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

import ctypes

from flowctl.link import Completion, Gather, LocalBuffer, RemoteBuffer, sges
from nr_contract.spec import PSN_MASK
from switch.dataplane.packets import (BTH_OFF, EXT_OFF, ICRC_LEN, IP_OFF, UDP_OFF, EXT_LEN, Op,
                                      build_frame, icrc, parse, payload_len, reth)
from tests.rcmodel.sim import Simulation

MAX_UNACKED_PSNS = 129          # comp.psn .. comp.psn + RXE_MAX_UNACKED_PSNS (128)
MAX_PKT_PER_ACK = 64            # RXE_MAX_PKT_PER_ACK
RETRY_FOREVER = 7               # retry_cnt 7: rxe_comp.c never decrements it
AETH_ACK = 0x1F                 # syndrome of an ACK with credits "unlimited" (rxe: 0x1F)
AETH_NAK_SEQ = 0x60             # NAK PSN sequence error
AETH_NAK_INVALID = 0x61         # NAK invalid request
AETH_NAK_ACCESS = 0x62          # NAK remote access error
WC_STATUS = {AETH_NAK_INVALID: "remote invalid request error (status 9, vendor_err 0)",
             AETH_NAK_ACCESS: "remote access error (status 10, vendor_err 0)",
             "retry": "transport retry counter exceeded (status 12, vendor_err 0)",
             "flush": "Work Request Flushed Error (status 5, vendor_err 0)"}
IMM_OPS = frozenset({Op.WRITE_LAST_WITH_IMM, Op.WRITE_ONLY_WITH_IMM})
CONTINUE_OPS = frozenset({Op.WRITE_MIDDLE, Op.WRITE_LAST, Op.WRITE_LAST_WITH_IMM})
START_OPS = frozenset({Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_WITH_IMM})
END_OPS = frozenset({Op.WRITE_LAST, Op.WRITE_LAST_WITH_IMM, Op.WRITE_ONLY,
                     Op.WRITE_ONLY_WITH_IMM})
_AETH = struct.Struct("!I")


class ModelError(AssertionError):
    """Something the model does not reproduce happened (e.g. an RNR condition)."""


def psn_compare(a: int, b: int) -> int:
    """rxe_hdr.h psn_compare: < 0, 0, > 0 as a is before, at, after b in 24-bit serial order."""
    diff = (a - b) & PSN_MASK
    return diff - (1 << 24) if diff & 0x800000 else diff


@dataclass
class Region:
    """Registered memory (LOCAL_WRITE | REMOTE_WRITE): `key` is its L_Key and R_Key.
    Implements netreduce.workspace.RegisteredMemory."""

    device: "Device"
    addr: int
    key: int
    nbytes: int
    array: np.ndarray

    def local(self) -> LocalBuffer:
        return LocalBuffer(self.addr, self.key, self.nbytes)

    def remote(self) -> RemoteBuffer:
        return RemoteBuffer(self.addr, self.key, self.nbytes)

    def view(self) -> np.ndarray:
        return self.array

    def close(self) -> None:
        self.device.regions.pop(self.key, None)


class UserRegion(Region):
    """The caller's memory registered in place for local reads (RdmaHost.register_user):
    a WRITE's source reads that memory itself; never a WRITE's target."""

    def remote(self) -> RemoteBuffer:
        raise ModelError("a region of the caller's memory has no remote key")


@dataclass
class Wqe:
    """A posted signaled RDMA WRITE WITH IMMEDIATE and the PSNs it occupies."""

    index: int
    src: LocalBuffer | Gather
    dst: RemoteBuffer
    first_psn: int
    npkts: int

    @property
    def last_psn(self) -> int:
        return (self.first_psn + self.npkts - 1) & PSN_MASK


@dataclass
class QPAttr:
    """What ring setup gives a QP at RTR/RTS (ring_setup/verbs/host.py)."""

    mtu: int
    timeout: int = 14               # 4.096 us x 2^14 = 67 ms
    retry_cnt: int = RETRY_FOREVER

    @property
    def retransmit_s(self) -> float:
        return 4.096e-6 * (1 << self.timeout)


@dataclass
class Peer:
    """The other end of a connected QP."""

    ip: str
    mac: str
    qpn: int


class QP:
    """One RC QP: requester + completer (sending side) and responder (receiving side).

    Invariants: `sq` holds the posted, not yet completed WQEs in posting order, their PSNs
    contiguous from comp_psn's WQE on; req_psn is in [comp_psn, next_psn]; at most
    MAX_UNACKED_PSNS PSNs from comp_psn have been sent; `send_cq`/`recv_cq` are in order.
    """

    def __init__(self, device: "Device", qpn: int, psn0: int, attr: QPAttr) -> None:
        self.device, self.qpn, self.attr = device, qpn, attr
        self.peer: Optional[Peer] = None
        self.error = False
        # requester / completer
        self.sq: deque[Wqe] = deque()
        self.next_psn = self.req_psn = self.comp_psn = psn0
        self.noack_pkts = 0
        self.retry_cnt = attr.retry_cnt
        self.started_retry = False
        self._timer: Optional[int] = None       # token of the pending retransmit timer
        self._tokens = itertools.count()
        self.send_cq: deque[Completion] = deque()
        self.cq_events = 0                      # completions ever queued (send and recv)
        self.on_event: Optional[Callable[[], None]] = None   # called at every one of them
        # responder
        self.resp_psn = self.ack_psn = 0
        self.sent_psn_nak = False
        self.msn = 0
        self.in_message = False
        self.va = self.rkey = self.resid = 0
        self.recv_posted = 0
        self.recv_cq: deque[Completion] = deque()

    def connect(self, peer: Peer, peer_psn0: int) -> None:
        """RTR + RTS: the remote end and the PSN its requester starts at."""
        self.peer = peer
        self.resp_psn = self.ack_psn = peer_psn0

    # --- requester (rxe_req.c) ---------------------------------------------------------
    def post_write(self, index: int, src: LocalBuffer | Gather, dst: RemoteBuffer) -> None:
        npkts = max(1, -(-src.nbytes // self.attr.mtu))
        self.sq.append(Wqe(index, src, dst, self.next_psn, npkts))
        self.next_psn = (self.next_psn + npkts) & PSN_MASK
        if self.error:
            self._flush()
        else:
            self.device.sim.at(0.0, self.pump)

    def pump(self) -> None:
        """Send what the 129-PSN limit allows (rxe_requester's loop)."""
        while (not self.error and self.req_psn != self.next_psn
               and psn_compare(self.req_psn, self.comp_psn + MAX_UNACKED_PSNS - 1) <= 0):
            self._send(self.req_psn)
            self.req_psn = (self.req_psn + 1) & PSN_MASK
            if self._timer is None:          # update_state: start it when not pending
                self._arm_timer()

    def _wqe_of(self, psn: int) -> Wqe:
        for wqe in self.sq:
            if psn_compare(psn, wqe.last_psn) <= 0:
                return wqe
        raise ModelError(f"QP {self.qpn}: PSN {psn} belongs to no posted WQE")

    def _send(self, psn: int) -> None:
        wqe = self._wqe_of(psn)
        i = (psn - wqe.first_psn) & PSN_MASK
        last = i == wqe.npkts - 1
        if wqe.npkts == 1:
            opcode = Op.WRITE_ONLY_WITH_IMM
        else:
            opcode = Op.WRITE_FIRST if i == 0 else (Op.WRITE_LAST_WITH_IMM if last
                                                   else Op.WRITE_MIDDLE)
        ackreq = last or self.noack_pkts > MAX_PKT_PER_ACK
        self.noack_pkts = 0 if ackreq else self.noack_pkts + 1
        mtu = self.attr.mtu
        length = min(mtu, wqe.src.nbytes - i * mtu)
        payload = self.device.read(wqe.src, i * mtu, length)
        assert self.peer is not None
        frame = build_frame(
            dst_mac=self.peer.mac, src_mac=self.device.mac, src_ip=self.device.ip,
            dst_ip=self.peer.ip, dest_qp=self.peer.qpn, psn=psn, opcode=opcode,
            payload=payload, ackreq=ackreq, pad=-length & 3,
            reth_fields=(wqe.dst.addr, wqe.dst.rkey, wqe.dst.nbytes)
            if opcode in START_OPS else None,
            imm=wqe.index % (1 << 32) if opcode in IMM_OPS else None,
            src_port=0xC000 | self.qpn & 0x3FFF)
        self.device.xmit(frame)

    # --- completer (rxe_comp.c) --------------------------------------------------------
    def _arm_timer(self) -> None:
        token = next(self._tokens)
        self._timer = token
        self.device.sim.at(self.attr.retransmit_s, self._timer_fired, token)

    def _outstanding(self) -> bool:
        return psn_compare(self.req_psn, self.comp_psn) > 0

    def _timer_fired(self, token: int) -> None:
        if token != self._timer:
            return
        self._timer = None
        if self.error or not self.sq or not self._outstanding():
            return
        self._retry(timeout=True)

    def _retry(self, timeout: bool) -> None:
        """COMPST_ERROR_RETRY."""
        if self.started_retry and not timeout:
            return
        if self.retry_cnt == 0:
            self.device.counters["retry_exceeded_err"] += 1
            self._fail(WC_STATUS["retry"])
            return
        if self.retry_cnt != RETRY_FOREVER:
            self.retry_cnt -= 1
        if self._outstanding():
            self.device.counters["completer_retry_err"] += 1
            self.started_retry = True
            self.req_psn = self.comp_psn            # req_retry
            self.pump()
        self._exit()

    def _exit(self) -> None:
        """COMPST_EXIT: push the timer back while packets are unacknowledged."""
        if not self.error and self._outstanding():
            self._arm_timer()

    def on_ack(self, syndrome: int, psn: int) -> None:
        if self.error:
            return
        if syndrome >> 5 == 0:                              # ACK
            if psn_compare(psn, self.comp_psn) >= 0:
                self._complete_through(psn)
                self.comp_psn = (psn + 1) & PSN_MASK
                if psn_compare(self.req_psn, self.comp_psn) < 0:
                    self.req_psn = self.comp_psn
                self.pump()
            self._exit()
        elif syndrome == AETH_NAK_SEQ:
            if psn_compare(psn, self.comp_psn) > 0:
                self.device.counters["rcvd_seq_err"] += 1
                self._complete_through((psn - 1) & PSN_MASK)
                self.comp_psn = psn
            self._retry(timeout=False)
        elif syndrome in (AETH_NAK_INVALID, AETH_NAK_ACCESS):
            self._complete_through((psn - 1) & PSN_MASK)
            self._fail(WC_STATUS[syndrome])
        else:
            raise ModelError(f"QP {self.qpn}: AETH syndrome {syndrome:#x} not modelled")

    def _complete_through(self, psn: int) -> None:
        while self.sq and psn_compare(self.sq[0].last_psn, psn) <= 0:
            self._complete(self.send_cq, Completion(self.sq.popleft().index, True))
            self.retry_cnt = self.attr.retry_cnt             # reset_retry_counters
            self.started_retry = False

    def _fail(self, status: str) -> None:
        """The head WQE completes with `status`, the QP goes to ERROR, the rest is flushed."""
        if self.sq:
            self._complete(self.send_cq, Completion(self.sq.popleft().index, False, status))
        self.error = True
        self._timer = None
        self._flush()

    def to_error(self) -> None:
        """ibv_modify_qp(ERROR): outstanding WQEs complete flushed; from then on requests
        are dropped unanswered and nothing is sent (the peer's requester retries)."""
        self.error = True
        self._timer = None
        self._flush()

    def _flush(self) -> None:
        while self.sq:
            self._complete(self.send_cq,
                           Completion(self.sq.popleft().index, False, WC_STATUS["flush"]))

    def _complete(self, cq: deque[Completion], c: Completion) -> None:
        cq.append(c)
        self.cq_events += 1
        if self.on_event is not None:
            self.on_event()

    # --- responder (rxe_resp.c) --------------------------------------------------------
    def on_request(self, frame: bytes, opcode: int, psn: int, ackreq: bool, pad: int,
                   udp_len: int) -> None:
        if self.error:
            return
        diff = psn_compare(psn, self.resp_psn)
        if diff > 0:
            if not self.sent_psn_nak:
                self.sent_psn_nak = True
                self.device.counters["out_of_seq_request"] += 1
                self._ack(AETH_NAK_SEQ, self.resp_psn)
            return
        if diff < 0:
            self.device.counters["duplicate_request"] += 1
            self._ack(AETH_ACK, (self.ack_psn - 1) & PSN_MASK)
            return
        self.sent_psn_nak = False
        plen = payload_len(udp_len, opcode, pad)
        nak = self._check_request(frame, opcode, plen)
        if nak is not None:
            self.error = True
            self._ack(nak, psn)
            return
        start = EXT_OFF + EXT_LEN[opcode]
        self.device.write(self.rkey, self.va, frame[start:start + plen])
        self.va += plen
        self.resid -= plen
        self.in_message = opcode not in END_OPS
        if opcode in IMM_OPS:
            if self.recv_posted == 0:
                raise ModelError(f"QP {self.qpn}: WRITE WITH IMMEDIATE without a posted "
                                 f"receive (RNR) is not modelled")
            self.recv_posted -= 1
            self.device.counters["rdma_recvs"] += 1
            (imm,) = struct.unpack_from("!I", frame, start - 4)
            self._complete(self.recv_cq, Completion(imm, True))
        if opcode in END_OPS:
            self.msn = (self.msn + 1) & PSN_MASK
        self.resp_psn = self.ack_psn = (psn + 1) & PSN_MASK
        if ackreq:
            self._ack(AETH_ACK, psn)

    def _check_request(self, frame: bytes, opcode: int, plen: int) -> Optional[int]:
        """check_op_seq, check_length, check_rkey: the NAK syndrome, or None."""
        mtu = self.attr.mtu
        if (opcode in CONTINUE_OPS) != self.in_message:
            return AETH_NAK_INVALID
        if opcode in START_OPS:
            self.va, self.rkey, self.resid = reth(frame)
        if plen > mtu or (opcode not in END_OPS and plen != mtu) or plen > self.resid \
                or (opcode in END_OPS and plen != self.resid):
            return AETH_NAK_INVALID
        if not self.device.writable(self.rkey, self.va, plen):
            return AETH_NAK_ACCESS
        return None

    def _ack(self, syndrome: int, psn: int) -> None:
        assert self.peer is not None
        self.device.xmit(build_frame(
            dst_mac=self.peer.mac, src_mac=self.device.mac, src_ip=self.device.ip,
            dst_ip=self.peer.ip, dest_qp=self.peer.qpn, psn=psn, opcode=Op.ACKNOWLEDGE,
            payload=_AETH.pack(syndrome << 24 | self.msn), src_port=0xC000 | self.qpn & 0x3FFF))


@dataclass
class Device:
    """One rxe device on one host: its address, memory, QPs and hw_counters.

    `nic(frame)` puts a frame on the host's link; `receive(frame)` is what the link
    delivers. `counters` holds rxe's hw_counters names (sent_pkts, rcvd_pkts, ...).
    """

    name: str
    ip: str
    mac: str
    sim: Simulation
    nic: Callable[[bytes], None] = lambda frame: None
    counters: Counter = field(default_factory=Counter)
    regions: dict[int, Region] = field(default_factory=dict)
    qps: dict[int, QP] = field(default_factory=dict)
    user_regions: int = 0       # regions of the caller's memory registered so far

    def __post_init__(self) -> None:
        self._keys = itertools.count(0x100)
        self._qpns = itertools.count(0x11)
        self._next_addr = 0x7F0000000000

    def register(self, nbytes: int) -> Region:
        addr = self._next_addr
        self._next_addr += -(-max(nbytes, 1) // 4096) * 4096 + 4096
        region = Region(self, addr, next(self._keys), nbytes, np.zeros(nbytes, np.uint8))
        self.regions[region.key] = region
        return region

    def register_user(self, addr: int, nbytes: int) -> UserRegion:
        array = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(addr))
        region = UserRegion(self, addr, next(self._keys), nbytes, array)
        self.regions[region.key] = region
        self.user_regions += 1
        return region

    def create_qp(self, psn0: int, attr: QPAttr) -> QP:
        qp = QP(self, next(self._qpns), psn0, attr)
        self.qps[qp.qpn] = qp
        return qp

    def read(self, src: LocalBuffer | Gather, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of what a WRITE of `src` sends (its SGEs in order)."""
        return b"".join(self._read(part) for part in sges(src.slice(offset, length)))

    def _read(self, src: LocalBuffer) -> bytes:
        region = self.regions.get(src.lkey)
        if region is None or not (region.addr <= src.addr and
                                  src.addr + src.nbytes <= region.addr + region.nbytes):
            raise ModelError(f"{self.name}: local buffer {src} is not registered memory")
        at = src.addr - region.addr
        return region.array[at:at + src.nbytes].tobytes()

    def writable(self, rkey: int, va: int, length: int) -> bool:
        region = self.regions.get(rkey)
        return region is not None and not isinstance(region, UserRegion) \
            and region.addr <= va and va + length <= region.addr + region.nbytes

    def write(self, rkey: int, va: int, data: bytes) -> None:
        region = self.regions[rkey]
        at = va - region.addr
        region.array[at:at + len(data)] = np.frombuffer(data, np.uint8)

    def xmit(self, frame: bytes) -> None:
        self.counters["sent_pkts"] += 1
        self.nic(frame)

    def receive(self, frame: bytes) -> None:
        """rxe_rcv: drop silently what rxe drops, count and dispatch the rest."""
        fields = parse(frame)
        if fields is None or frame[:6] != bytes.fromhex(self.mac.replace(":", "")):
            return
        key, udp_len, opcode, pad, psn, _frag = fields
        end = UDP_OFF + udp_len
        if len(frame) < end or frame[end - ICRC_LEN:end] != icrc(frame[:end - ICRC_LEN]):
            self.counters["model_dropped_icrc"] += 1
            return
        qp = self.qps.get(key & PSN_MASK)
        src_ip = ".".join(str(b) for b in frame[IP_OFF + 12:IP_OFF + 16])
        if qp is None or qp.peer is None or src_ip != qp.peer.ip:
            self.counters["model_dropped_qp"] += 1
            return
        self.counters["rcvd_pkts"] += 1
        ackreq = bool(frame[BTH_OFF + 8] & 0x80)
        if opcode == Op.ACKNOWLEDGE:
            self.counters["ack_deferred"] += 1      # lab: moves once per ACK/NAK received
            (aeth,) = _AETH.unpack_from(frame, EXT_OFF)
            qp.on_ack(aeth >> 24, psn)
        elif Op.WRITE_FIRST <= opcode <= Op.WRITE_ONLY_WITH_IMM:
            qp.on_request(frame, opcode, psn, ackreq, pad, udp_len)
        else:
            raise ModelError(f"{self.name}: opcode {opcode:#x} not modelled")
