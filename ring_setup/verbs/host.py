"""This rank's rxe device over pyverbs: the opened device, registered memory, the ring QPs.

Modelled on rdma-core's pyverbs tests (tests/base.py): resources are built in explicit QP
state steps. `RingQPs.__init__` creates both QPs and walks them RESET -> INIT (receives can
be posted from then on); `RingQPs.connect` walks them INIT -> RTR -> RTS once the peers'
QPNs, PSNs and GIDs are known. Runs only where rxe exists (inside the lab).

Never a SIGSEGV: pyverbs passes the NULL handle of a closed CQ, QP, PD or context straight
to libibverbs (poll, query, post, qp_num, query_port, PD(ctx): each measured to kill the
process with SIGSEGV in the lab, rdma-core 44). So every object here shares its device's
`DeviceLife` and checks it before each pyverbs call: after `RdmaHost.close()` they raise
`DeviceClosed` naming the device and the call instead. The context is opened with a short
retry while libibverbs does not list a device that sysfs already shows.
"""
from __future__ import annotations

import ctypes
import random
import time
from types import MappingProxyType
from typing import Mapping

import numpy as np
import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

from flowctl.link import MAX_SGES, LocalBuffer, RemoteBuffer
from flowctl.plan import FlowConfig
from ring_setup.device import (DeviceError, RoceGid, find_roce_gid, hw_counters, netdev_mac,
                               netdev_mtu, roce_ipv4_in)
from ring_setup.endpoints import HostEndpoint, QPEndpoint, RingAddress, RingEndpoint
from ring_setup.verbs.verbs_link import EventCQ, VerbsLink

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
PATH_MTU_ENUM = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
                 2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
RNR_RETRY = 7
MIN_RNR_TIMER = 12
MAX_RD_ATOMIC = 1
HOP_LIMIT = 64
OPEN_RETRY = 10.0     # seconds a device sysfs shows may take to appear in libibverbs' list


class DeviceClosed(DeviceError):
    """A verbs object was used after its device was closed (pyverbs would crash)."""


class DeviceLife:
    """Whether device `name` is still open; every object opened on it checks before each
    pyverbs call. Invariant: once `closed`, never open again."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def check(self, what: str) -> None:
        if self.closed:
            raise DeviceClosed(f"{what}: device {self.name} is closed (its QPs, CQs and "
                               f"memory are gone)")


def open_context(name: str, retry: float = OPEN_RETRY) -> Context:
    """Open device `name`, retrying for `retry` s while libibverbs does not list it yet
    (a device just created or still settling), then a `DeviceError` naming what it lists."""
    deadline = time.monotonic() + retry
    while True:
        try:
            return Context(name=name)
        except PyverbsRDMAError as exc:
            if time.monotonic() >= deadline:
                try:
                    listed = ", ".join(d.name.decode() for d in get_device_list()) or "none"
                except PyverbsError as list_exc:
                    listed = f"unknown ({list_exc})"
                raise DeviceError(f"cannot open RDMA device {name} for {retry:g}s: {exc} "
                                  f"(libibverbs lists: {listed}; /dev/infiniband and the rxe "
                                  f"provider must see it from this namespace)") from exc
            time.sleep(0.2)


class RegisteredBuffer:
    """A memory region registered LOCAL_WRITE | REMOTE_WRITE (its buffer allocated by
    pyverbs), or (`address`) the caller's memory registered in place for local reads only:
    a WRITE's source, never written by the NIC nor reachable by a peer (no R_Key is
    published); pinned until `close`, never freed by it (the caller keeps it alive
    meanwhile: netreduce/regcache.py). Invariant: `view()` arrays are valid only until
    `close()`."""

    def __init__(self, pd: PD, nbytes: int, life: DeviceLife, address: int | None = None) -> None:
        self._life = life
        life.check(f"registering {nbytes} bytes")
        try:
            self._mr = MR(pd, nbytes, ACCESS) if address is None else \
                MR(pd, nbytes, 0, address=address)
        except PyverbsError as exc:
            raise DeviceError(f"cannot register {nbytes} bytes: {exc} (RLIMIT_MEMLOCK?)") from exc
        self.nbytes = nbytes
        self.addr: int = self._mr.buf
        self.lkey: int = self._mr.lkey
        self.rkey: int = self._mr.rkey

    def local(self) -> LocalBuffer:
        return LocalBuffer(self.addr, self.lkey, self.nbytes)

    def remote(self) -> RemoteBuffer:
        return RemoteBuffer(self.addr, self.rkey, self.nbytes)

    def view(self) -> np.ndarray:
        """The whole region as uint8, without copying."""
        self._life.check("viewing registered memory")
        return np.ctypeslib.as_array((ctypes.c_ubyte * self.nbytes).from_address(self.addr))

    def close(self) -> None:
        if not self._life.closed:
            self._mr.close()


class RdmaHost:
    """The opened rxe device holding `ip` as a RoCEv2 GID (or the named `device`), its PD,
    and what peers need to reach it. Checks that the port is active and fits `config.mtu`.
    `ring_addrs`: rings whose QPs use another address of the same device and port (ring
    name -> IPv4 address, or a network naming this device's one address in it; its RoCEv2
    GID must exist: DeviceError names what is missing)."""

    def __init__(self, ip: str, device: str | None, config: FlowConfig,
                 ring_addrs: Mapping[str, str] = MappingProxyType({})) -> None:
        gid = find_roce_gid(ip, device)
        self.ip = ip
        self.mac = netdev_mac(gid.netdev)
        self.roce_gid: RoceGid = gid
        self.ring_addrs: dict[str, str] = {}
        self.ring_gids: dict[str, RoceGid] = {}
        for ring, addr in ring_addrs.items():
            if "/" in addr:                         # a network: this device's one address in it
                addr = roce_ipv4_in(addr, gid.device)
            other = find_roce_gid(addr, gid.device)
            if other.port != gid.port:
                raise DeviceError(f"ring {ring!r}: address {addr} is on {other.device} port "
                                  f"{other.port}, not on port {gid.port} with {ip}")
            self.ring_addrs[ring], self.ring_gids[ring] = addr, other
        self.life = DeviceLife(gid.device)
        self.ctx = open_context(gid.device)
        try:
            port = self.ctx.query_port(gid.port)
            if port.state != e.IBV_PORT_ACTIVE:
                raise DeviceError(f"{gid.device} port {gid.port} is not active "
                                  f"(netdev {gid.netdev} down?)")
            if PATH_MTU_ENUM[config.mtu] > port.active_mtu:
                raise DeviceError(
                    f"path MTU {config.mtu} is more than {gid.device}'s active RoCE MTU "
                    f"{256 << (port.active_mtu - 1)} (netdev {gid.netdev} MTU "
                    f"{netdev_mtu(gid.netdev)}; RoCE MTU 4096 needs a netdev MTU >= 4176)")
            self.pd = PD(self.ctx)
        except BaseException:
            self.close()
            raise

    @property
    def device(self) -> str:
        return self.roce_gid.device

    @property
    def gid(self) -> str:
        return self.roce_gid.gid

    def register(self, nbytes: int) -> RegisteredBuffer:
        return RegisteredBuffer(self.pd, nbytes, self.life)

    def register_user(self, address: int, nbytes: int) -> RegisteredBuffer:
        """Register `nbytes` of the caller's memory at `address` in place (no copy; the
        caller keeps that memory alive until the region's `close`)."""
        return RegisteredBuffer(self.pd, nbytes, self.life, address)

    def ring_address(self, ring: str) -> RingAddress | None:
        """Ring `ring`'s own address (None: the host's)."""
        gid = self.ring_gids.get(ring)
        return None if gid is None else RingAddress(self.ring_addrs[ring], netdev_mac(gid.netdev),
                                                    gid.gid)

    def create_ring(self, name: str, config: FlowConfig) -> "RingQPs":
        self.life.check(f"creating ring {name!r}")
        return RingQPs(self, name, config)

    def counters(self) -> dict[str, int]:
        return hw_counters(self.device, self.roce_gid.port)

    def close(self) -> None:
        """Destroys everything opened on the device (QPs, CQs, MRs, PD) with the context;
        from then on every object opened on it raises `DeviceClosed`. Idempotent."""
        if self.life.closed:
            return
        self.life.closed = True
        try:
            self.ctx.close()
        except PyverbsError as exc:
            raise DeviceError(f"closing device {self.device}: {exc}") from exc


class RingQPs:
    """This rank's two RC QPs in ring `name`: `send_qp` to the successor and `recv_qp` from
    the predecessor, each with its own CQ and completion channel. The send CQ holds a window
    of signaled WRITEs, the receive CQ `recv_depth` completions (never more receives are
    posted)."""

    def __init__(self, host: RdmaHost, name: str, config: FlowConfig) -> None:
        self.host, self.name, self.config = host, name, config
        self.roce_gid = host.ring_gids.get(name, host.roce_gid)     # the source address
        self.send_cq = EventCQ(host.ctx, config.window, host.life)
        self.recv_cq = EventCQ(host.ctx, config.recv_depth, host.life)
        self.send_qp = self._create_qp(self.send_cq, QPCap(max_send_wr=config.window,
                                                           max_recv_wr=1,
                                                           max_send_sge=MAX_SGES))
        self.recv_qp = self._create_qp(self.recv_cq, QPCap(max_send_wr=1,
                                                           max_recv_wr=config.recv_depth))
        self.send_psn = random.getrandbits(24)
        self.recv_psn = random.getrandbits(24)

    def _create_qp(self, cq: EventCQ, cap: QPCap) -> QP:
        qp = QP(self.host.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq.cq, rcq=cq.cq, cap=cap))
        attr = QPAttr(port_num=self.host.roce_gid.port)
        attr.pkey_index = 0
        attr.qp_access_flags = ACCESS
        qp.to_init(attr)
        return qp

    def local(self) -> RingEndpoint:
        self.host.life.check(f"ring {self.name!r}: reading QP numbers")
        return RingEndpoint(send=QPEndpoint(self.send_qp.qp_num, self.send_psn),
                            recv=QPEndpoint(self.recv_qp.qp_num, self.recv_psn),
                            addr=self.host.ring_address(self.name))

    def connect(self, predecessor: HostEndpoint, successor: HostEndpoint) -> None:
        """INIT -> RTR -> RTS for both QPs: send_qp to the successor's recv QP, recv_qp to
        the predecessor's send QP."""
        self.host.life.check(f"ring {self.name!r}: connecting")
        peer_recv = successor.rings[self.name].recv
        self._to_rts(self.send_qp, successor.address(self.name).gid, peer_recv.qpn,
                     rq_psn=peer_recv.psn, sq_psn=self.send_psn)
        peer_send = predecessor.rings[self.name].send
        self._to_rts(self.recv_qp, predecessor.address(self.name).gid, peer_send.qpn,
                     rq_psn=peer_send.psn, sq_psn=self.recv_psn)

    def _to_rts(self, qp: QP, dgid: str, dest_qpn: int, rq_psn: int, sq_psn: int) -> None:
        gid = self.roce_gid
        attr = QPAttr(port_num=gid.port)
        attr.path_mtu = PATH_MTU_ENUM[self.config.mtu]
        attr.dest_qp_num = dest_qpn
        attr.rq_psn = rq_psn
        attr.max_dest_rd_atomic = MAX_RD_ATOMIC
        attr.min_rnr_timer = MIN_RNR_TIMER
        attr.ah_attr = AHAttr(port_num=gid.port, is_global=1,
                              gr=GlobalRoute(dgid=GID(dgid), sgid_index=gid.index,
                                             hop_limit=HOP_LIMIT))
        qp.to_rtr(attr)
        attr.timeout = self.config.ack_timeout
        attr.retry_cnt = self.config.retry_cnt
        attr.rnr_retry = RNR_RETRY
        attr.sq_psn = sq_psn
        attr.max_rd_atomic = MAX_RD_ATOMIC
        qp.to_rts(attr)

    def to_error(self) -> None:
        """Both QPs to ERROR: outstanding WRs complete flushed, nothing more is executed
        from the wire (a late WRITE of the peer's old QP is dropped, never lands in our
        memory). Used when the switch stopped aggregating "inc" (netreduce/away.py)."""
        self.host.life.check(f"ring {self.name!r}: to ERROR")
        for qp in (self.send_qp, self.recv_qp):
            attr = QPAttr()
            attr.qp_state = e.IBV_QPS_ERR
            qp.modify(attr, e.IBV_QP_STATE)

    def close(self) -> None:
        """Destroy both QPs, then their CQs and completion channels (a peer's packets to
        these QPNs are dropped by rxe from then on). Idempotent; nothing after the device
        closed (it destroyed them already)."""
        if self.host.life.closed or getattr(self, "_closed", False):
            return
        self._closed = True
        for qp in (self.send_qp, self.recv_qp):
            qp.close()
        for cq in (self.send_cq, self.recv_cq):
            cq.cq.close()
            cq.channel.close()

    def link(self, recv_sge: LocalBuffer, successor: int, predecessor: int) -> VerbsLink:
        return VerbsLink(send_qp=self.send_qp, send_cq=self.send_cq, recv_qp=self.recv_qp,
                         recv_cq=self.recv_cq, recv_sge=recv_sge, successor=successor,
                         predecessor=predecessor, life=self.host.life,
                         counters=self.host.counters)
