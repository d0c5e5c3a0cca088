"""How a buffer becomes RDMA WRITE messages: the flow-control knobs and the message plan.

Pure logic (no verbs), so it is unit-tested without RDMA. The switch depends on these knobs:
every rank of a ring posts the same message sequence, one message is
`packets_per_message` packets of at most `mtu` bytes, and at most `window` messages are
outstanding per connection, so an aggregator pool of N slots needs N >= 2 * window_packets.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Sequence, overload

from nr_contract.spec import DEFAULT_ACK_TIMEOUT, MAX_ACK_TIMEOUT, PATH_MTUS

IMM_MODULUS = 1 << 32   # the immediate carries the message index modulo 2^32
RETRY_CNT_ENV = "NR_RETRY_CNT"
DEFAULT_RETRY_CNT = 6   # finite everywhere: rxe reads 7 as "forever", a NIC as 7 retries
                        # (NCCL's); 6 is a NIC's budget that rxe honours too
MAX_RETRY_CNT = 7       # a 3-bit field


def default_retry_cnt() -> int:
    """The QPs' RC retry budget: $NR_RETRY_CNT (0..7) when set, else DEFAULT_RETRY_CNT."""
    text = os.environ.get(RETRY_CNT_ENV, "").strip()
    if not text:
        return DEFAULT_RETRY_CNT
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"flowctl: ${RETRY_CNT_ENV}={text!r} is not an integer in "
                         f"0..{MAX_RETRY_CNT}") from None


def ack_timeout_seconds(ack_timeout: int) -> float:
    """The local ACK timeout exponent in seconds (IBTA: 4.096 us x 2^ack_timeout)."""
    return 4.096e-6 * (1 << ack_timeout)


@dataclass(frozen=True)
class FlowConfig:
    """Flow-control knobs of one communicator (identical on every rank).

    Invariants: `mtu` is a RoCE path MTU; `msg_size` is a positive multiple of `mtu`;
    `window` >= 1; `recv_depth` >= 1 receives stay posted per receiving QP;
    `collective_timeout` > 0 seconds without any completion, while every peer is alive, is
    an error (a dead or failed peer is reported at once by the stream's liveness check);
    `ack_timeout` in 1..31 is the QPs' local ACK timeout exponent (see DEFAULT_ACK_TIMEOUT);
    `retry_cnt` in 0..7 the QPs' RC retry budget (default $NR_RETRY_CNT, else 6): a QP whose
    packets stay unacknowledged through `dark_budget` seconds goes to the error state
    (docs/roce.md, "The retry budget"), except that rxe never gives up at 7.
    """

    mtu: int = 4096
    msg_size: int = 256 * 1024
    window: int = 2
    recv_depth: int = 1024
    collective_timeout: float = 1800.0
    ack_timeout: int = DEFAULT_ACK_TIMEOUT
    retry_cnt: int = field(default_factory=default_retry_cnt)

    def __post_init__(self) -> None:
        if self.mtu not in PATH_MTUS:
            raise ValueError(f"flowctl: path MTU {self.mtu} is not one of {PATH_MTUS}")
        if self.msg_size <= 0 or self.msg_size % self.mtu:
            raise ValueError(f"flowctl: message size {self.msg_size} must be a positive "
                             f"multiple of the path MTU {self.mtu}")
        if self.window < 1:
            raise ValueError(f"flowctl: window {self.window} must be at least 1 message")
        if self.recv_depth < 1:
            raise ValueError(f"flowctl: recv_depth {self.recv_depth} must be at least 1")
        if not self.collective_timeout > 0:
            raise ValueError(f"flowctl: collective_timeout {self.collective_timeout} must be "
                             f"> 0 s")
        if not 1 <= self.ack_timeout <= MAX_ACK_TIMEOUT:
            raise ValueError(f"flowctl: ack_timeout {self.ack_timeout} must be in "
                             f"1..{MAX_ACK_TIMEOUT} (4.096 us x 2^ack_timeout)")
        if not 0 <= self.retry_cnt <= MAX_RETRY_CNT:
            raise ValueError(f"flowctl: retry_cnt {self.retry_cnt} must be in "
                             f"0..{MAX_RETRY_CNT} (RC retries before a QP fails; "
                             f"${RETRY_CNT_ENV})")

    @property
    def dark_budget(self) -> float:
        """Seconds a link may be dark before a QP with unacknowledged packets fails on an
        IB/RoCE NIC: the first try and `retry_cnt` retries, one ACK timeout each (the NIC
        may take up to 4x longer per timeout; rxe retries forever at 7)."""
        return (self.retry_cnt + 1) * ack_timeout_seconds(self.ack_timeout)

    @property
    def packets_per_message(self) -> int:
        return self.msg_size // self.mtu

    @property
    def window_packets(self) -> int:
        """Most packets one connection can have unacknowledged: the switch needs 2x this."""
        return self.window * self.packets_per_message


class Message(NamedTuple):
    """One RDMA WRITE WITH IMMEDIATE: `length` bytes at `offset` of its transfer (a tuple:
    a transfer makes one per message, on the hot path)."""

    index: int    # position in the stream of its direction; the immediate is index mod 2^32
    offset: int
    length: int

    @property
    def imm(self) -> int:
        return self.index % IMM_MODULUS


class MessagePlan(Sequence[Message]):
    """A transfer of `nbytes` cut into messages of `msg_size` bytes (the last one shorter).

    Invariants: messages are contiguous and in order, cover [0, nbytes) exactly, every one
    but the last has `msg_size` bytes, none is empty (0 bytes -> no message), and their
    indices run from `first_index` up by one. Sender and receiver build the same plan from
    the same (nbytes, msg_size, first_index), which is how the receiver knows what arrives.
    """

    def __init__(self, nbytes: int, msg_size: int, first_index: int = 0) -> None:
        if nbytes < 0:
            raise ValueError(f"flowctl: transfer of {nbytes} bytes")
        if msg_size <= 0:
            raise ValueError(f"flowctl: message size {msg_size}")
        self.nbytes = nbytes
        self.msg_size = msg_size
        self.first_index = first_index
        self._count = -(-nbytes // msg_size)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> Message: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Message]: ...

    def __getitem__(self, i: int | slice) -> Message | Sequence[Message]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"message {i} of a {self._count}-message plan")
        offset = i * self.msg_size
        return Message(self.first_index + i, offset, min(self.msg_size, self.nbytes - offset))

    def __iter__(self) -> Iterator[Message]:
        first, size, nbytes = self.first_index, self.msg_size, self.nbytes
        return (Message(first + i, offset, min(size, nbytes - offset))
                for i, offset in enumerate(range(0, nbytes, size)))

    @property
    def end_index(self) -> int:
        """The index the message after this plan gets."""
        return self.first_index + self._count

    def __repr__(self) -> str:
        return (f"MessagePlan(nbytes={self.nbytes}, msg_size={self.msg_size}, "
                f"first_index={self.first_index}, messages={self._count})")
