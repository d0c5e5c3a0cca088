"""The RC round trip of the lab, as the bench's reference column: a ping-pong of small RDMA
WRITE WITH IMMEDIATE between ranks 0 and 1 on a QP pair of their own, through the switch
(which only forwards it: the pair is never registered), with the project's verbs code
(`Host.create_ring`: ring_setup.verbs on a real device).

Rank 0 writes `RTT_BYTES` to rank 1 and waits for rank 1's write back; rank 1 waits for the
ping and answers at once. Both wait the way the library does (arm the CQs, sleep on the
completion channel, `flowctl.link.Link.wait`), so a round trip is what one message each way
costs a communicator here, not a busy-polling ib_write_lat. A round trip is the time per
call of this column; the other columns' time per call over it says how many RC round trips
an allreduce call costs. Like the link probe, it reaches into the communicator for its
device (`_host`) and the peers' endpoints (`_endpoints`): what a public API would give.

Invariants: each side keeps one receive posted whenever the other may write to it (rank 1
re-posts before it answers, rank 0 before its next ping), and at most `window` WRITEs
unacknowledged (their send completions are drained as they come); a job ends with every
WRITE of it acknowledged.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from flowctl.link import Completion, Link, RemoteBuffer
from netreduce.comm import Communicator
from netreduce.tools.bench.runplan import RTT_BYTES   # 8: as the ib_write_lat reference
from netreduce.workspace import RegisteredMemory
from ring_setup.endpoints import QPEndpoint, RingEndpoint

RTT_PINGS = 8                 # round trips per job at least (a job's calls, if more)
RING = "rtt"                  # the QP pair's name (Host.create_ring)
TIMEOUT = 60.0                # s one round trip may take before the job fails (a hang)
PAIR = (0, 1)


class PingPong:
    """Ranks 0 and 1's QP pair (collective: every rank builds it, the others hold nothing).

    Endpoints travel by an int64 sum-allreduce over the host ring used as an all-gather,
    like the link probe's landing addresses; the peer's GID and addresses are its
    communicator endpoint's."""

    def __init__(self, comm: Communicator) -> None:
        n, rank = comm.world_size, comm.rank
        self.rank = rank
        self.active = rank in PAIR and n >= 2
        self.pings = 0
        self._link: Link | None = None
        self._memory: RegisteredMemory | None = None
        table = np.zeros((n, 6), dtype=np.int64)
        config = comm.config
        if self.active:
            qps = comm._host.create_ring(RING, config)
            self._memory = comm._host.register(2 * RTT_BYTES)
            local, landing = qps.local(), self._memory.remote().slice(RTT_BYTES, RTT_BYTES)
            table[rank] = (local.send.qpn, local.send.psn, local.recv.qpn, local.recv.psn,
                           landing.addr, landing.rkey)
        comm.allreduce(table, algo="ring")
        if not self.active:
            return
        self.peer = 1 - rank
        s_qpn, s_psn, r_qpn, r_psn, addr, rkey = (int(v) for v in table[self.peer])
        peer = dataclasses.replace(
            comm._endpoints[self.peer],
            rings={RING: RingEndpoint(QPEndpoint(s_qpn, s_psn), QPEndpoint(r_qpn, r_psn))})
        qps.connect(peer, peer)
        self._link = qps.link(self._memory.local(), self.peer, self.peer)
        self._remote = RemoteBuffer(addr, rkey, RTT_BYTES)
        self._window = config.window
        self._unacked = 0
        self._link.post_recvs(1)
        # the caller's barrier follows: nobody pings before the peer posted its receive

    def run(self, count: int) -> None:
        """`count` round trips (rank 0 pings, rank 1 answers); nothing on other ranks."""
        if not self.active:
            return
        assert self._link is not None and self._memory is not None
        view = self._memory.view()
        for _ in range(count):
            self.pings += 1
            view[:RTT_BYTES] = np.frombuffer(self.pings.to_bytes(RTT_BYTES, "little"),
                                             dtype=np.uint8)
            if self.rank == 0:
                self._write()
                self._await_reply()
                self._link.post_recvs(1)
            else:
                self._await_reply()
                self._link.post_recvs(1)
                self._write()
        deadline = time.monotonic() + TIMEOUT
        while self._unacked:                    # every WRITE of the job acknowledged
            self._progress(deadline, "the last send completion", receive=False)

    def wrong(self) -> int:
        """1 when the last message from the peer did not carry its last ping number, else 0
        (the 8-byte number is the one element checked)."""
        if not self.active:
            return 0
        assert self._memory is not None
        got = self._memory.view()[RTT_BYTES:2 * RTT_BYTES].tobytes()
        return int(int.from_bytes(got, "little") != self.pings)

    def _write(self) -> None:
        assert self._link is not None and self._memory is not None
        deadline = time.monotonic() + TIMEOUT
        while self._unacked >= self._window:
            self._progress(deadline, "a send completion", receive=False)
        self._link.post_write(self.pings, self._memory.local().slice(0, RTT_BYTES),
                              self._remote)
        self._unacked += 1

    def _await_reply(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not self._progress(deadline, f"ping {self.pings} from rank {self.peer}"):
            pass

    def _progress(self, deadline: float, what: str, receive: bool = True) -> bool:
        """Drain send completions, then (`receive`) take a receive if one is there; else
        sleep until the next completion event. True when a receive was taken."""
        link = self._link
        assert link is not None
        for polled in range(2):
            unacked = self._unacked
            self._sent(link.poll_sends(self._window))
            if receive:
                got = link.poll_recvs(1)
                if got:
                    self._received(got[0])
                    return True
            elif self._unacked < unacked:
                return False
            if polled == 0:
                link.arm()          # then poll again: completions already queued raise none
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"bench: rank {self.rank}: no {what} within {TIMEOUT:g}s "
                               f"(RC round trip pair with rank {self.peer}): "
                               f"{link.diagnostics()}")
        link.wait(left)
        return False

    def _sent(self, done: list[Completion]) -> None:
        for c in done:
            if not c.ok:
                raise RuntimeError(f"bench: rank {self.rank}: round trip WRITE {c.index} to "
                                   f"rank {self.peer} failed: {c.status}")
        self._unacked -= len(done)

    def _received(self, c: Completion) -> None:
        if not c.ok or c.index != self.pings:
            raise RuntimeError(f"bench: rank {self.rank}: round trip {self.pings} got "
                               f"message {c.index} from rank {self.peer} ({c.status})")

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
