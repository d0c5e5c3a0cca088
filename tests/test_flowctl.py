"""Flow control without RDMA: message plan, credit window, and the stream over a fake link."""
from __future__ import annotations

import time

import numpy as np
import pytest

from flowctl import (CompletionError, CreditWindow, FlowConfig, Message, MessagePlan, Outgoing,
                     SequenceError, StallError, Stream, WindowError)
from flowctl.link import Completion
from flowctl.stream import LIVENESS_POLL
from nr_contract.spec import RingSpec
from tests.fakefabric import FakeFabric, FakeHost, FakeLink


# --- message plan ---------------------------------------------------------------------------

def test_plan_of_nothing_has_no_message() -> None:
    plan = MessagePlan(0, 4096, first_index=7)
    assert len(plan) == 0 and list(plan) == [] and plan.end_index == 7


@pytest.mark.parametrize("nbytes", [1, 4, 4095, 4096, 4097, 3 * 4096, 10 * 4096 + 100])
def test_plan_covers_the_transfer_exactly(nbytes: int) -> None:
    plan = MessagePlan(nbytes, 4096, first_index=5)
    msgs = list(plan)
    assert len(plan) == -(-nbytes // 4096)
    assert [m.index for m in msgs] == list(range(5, 5 + len(msgs)))
    assert msgs[0].offset == 0
    for a, b in zip(msgs, msgs[1:]):
        assert a.length == 4096 and b.offset == a.offset + a.length
    assert msgs[-1].offset + msgs[-1].length == nbytes and 0 < msgs[-1].length <= 4096
    assert plan.end_index == 5 + len(msgs)


def test_plan_indexing_and_slicing() -> None:
    plan = MessagePlan(10_000, 4096)
    assert plan[-1] == Message(2, 8192, 1808)
    assert plan[1:] == [Message(1, 4096, 4096), Message(2, 8192, 1808)]
    with pytest.raises(IndexError):
        plan[3]


def test_immediate_is_the_index_modulo_2_32() -> None:
    assert MessagePlan(8192, 4096, first_index=2**32 - 1)[1].imm == 0
    assert Message(2**32 + 5, 0, 1).imm == 5


def test_plan_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        MessagePlan(-1, 4096)
    with pytest.raises(ValueError):
        MessagePlan(10, 0)


# --- knobs ----------------------------------------------------------------------------------

def test_config_knobs_match_the_ring_spec() -> None:
    cfg = FlowConfig(mtu=4096, msg_size=64 * 1024, window=8)
    assert cfg.packets_per_message == 16 and cfg.window_packets == 128
    spec = RingSpec("r", 0, cfg.mtu, cfg.msg_size, cfg.window, ())
    assert spec.window_packets == cfg.window_packets


@pytest.mark.parametrize("kwargs, words", [
    ({"mtu": 1500}, "path MTU 1500"),
    ({"mtu": 1024, "msg_size": 1536}, "multiple of the path MTU"),
    ({"msg_size": 0}, "positive multiple"),
    ({"window": 0}, "window 0"),
    ({"recv_depth": 0}, "recv_depth"),
    ({"collective_timeout": 0}, "collective_timeout"),
    ({"retry_cnt": 8}, r"retry_cnt 8 must be in 0\.\.7"),
    ({"retry_cnt": -1}, r"retry_cnt -1 must be in 0\.\.7"),
])
def test_config_rejects_bad_knobs(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        FlowConfig(**kwargs)


def test_the_retry_budget_comes_from_the_environment_and_bounds_a_dark_link(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NR_RETRY_CNT", raising=False)
    assert FlowConfig().retry_cnt == 6
    monkeypatch.setenv("NR_RETRY_CNT", "5")
    cfg = FlowConfig()
    assert cfg.retry_cnt == 5
    # IBTA: 4.096 us x 2^14 per ACK timeout, the first try and 5 retries: 6 x 67.1 ms
    assert cfg.dark_budget == pytest.approx(6 * 0.067108864)
    assert FlowConfig(retry_cnt=0, ack_timeout=20).dark_budget == pytest.approx(4.294967296)
    monkeypatch.setenv("NR_RETRY_CNT", "six")
    with pytest.raises(ValueError, match=r"\$NR_RETRY_CNT='six' is not an integer in 0\.\.7"):
        FlowConfig()
    monkeypatch.setenv("NR_RETRY_CNT", "9")
    with pytest.raises(ValueError, match="retry_cnt 9 must be in 0..7"):
        FlowConfig()


# --- credit window --------------------------------------------------------------------------

def test_window_spends_and_returns_credits_in_order() -> None:
    w = CreditWindow(3)
    assert w.available == 3 and w.oldest is None
    for i in (10, 11, 12):
        w.post(i)
    assert w.available == 0 and w.outstanding == (10, 11, 12) and w.oldest == 10
    with pytest.raises(WindowError, match="all 3 credits spent"):
        w.post(13)
    w.complete(10)
    assert w.available == 1 and w.oldest == 11
    w.post(13)
    for i in (11, 12, 13):
        w.complete(i)
    assert w.available == 3 and w.outstanding == ()


def test_window_rejects_out_of_order_and_unknown_completions() -> None:
    w = CreditWindow(2)
    with pytest.raises(WindowError, match="nothing outstanding"):
        w.complete(0)
    w.post(0)
    w.post(1)
    with pytest.raises(WindowError, match="oldest outstanding is 0"):
        w.complete(1)
    with pytest.raises(ValueError):
        CreditWindow(0)


# --- the stream over an in-process link -----------------------------------------------------

CFG = FlowConfig(mtu=256, msg_size=1024, window=3, recv_depth=8, collective_timeout=0.5)


def loopback(cfg: FlowConfig = CFG, fabric: FakeFabric | None = None
             ) -> tuple[Stream, FakeLink, FakeHost]:
    """A one-rank ring: the stream sends to itself."""
    host = FakeHost(fabric or FakeFabric(), 0)
    qps = host.create_ring("ring", cfg)
    qps.dest_qpn = qps.recv_qpn
    link = qps.link(host.register(64).local(), successor=0, predecessor=0)
    return Stream(link, cfg, "rank 0, ring 'ring'"), link, host


@pytest.mark.parametrize("nbytes", [0, 1, 1023, 1024, 5000, 20 * 1024 + 4])
def test_stream_moves_the_bytes_under_the_window(nbytes: int) -> None:
    stream, link, host = loopback()
    src, dst = host.register(max(nbytes, 1)), host.register(max(nbytes, 1))
    src.view()[:] = np.random.default_rng(nbytes).integers(0, 256, src.nbytes, dtype=np.uint8)
    arrived: list[Message] = []
    stream.transfer(Outgoing(src.local().slice(0, nbytes), dst.remote().slice(0, nbytes)),
                    recv_nbytes=nbytes, on_arrival=arrived.append)
    assert np.array_equal(dst.view()[:nbytes], src.view()[:nbytes])
    assert arrived == list(MessagePlan(nbytes, CFG.msg_size))
    assert link.max_in_flight <= CFG.window
    if len(arrived) > CFG.window:
        assert link.max_in_flight == CFG.window      # the window is actually used
    assert stream.window.outstanding == () and link.recv_posted == CFG.recv_depth


def test_stream_indices_run_on_across_transfers() -> None:
    stream, _, host = loopback()
    buf = host.register(4096)
    seen: list[int] = []
    for nbytes in (3000, 0, 1024, 1):
        stream.transfer(Outgoing(buf.local().slice(0, nbytes), buf.remote().slice(0, nbytes)),
                        recv_nbytes=nbytes, on_arrival=lambda m: seen.append(m.index))
    assert seen == list(range(5))
    assert stream.next_send_index == stream.next_recv_index == 5


class LateAcks:
    """A link whose send completions (the responder's ACKs) are held back until `late` is
    cleared; everything else is the fake link's."""

    def __init__(self, link: FakeLink) -> None:
        self.link, self.late, self.held = link, True, []

    def __getattr__(self, name: str) -> object:
        return getattr(self.link, name)

    def poll_sends(self, max_count: int) -> list[Completion]:
        self.held += self.link.poll_sends(CFG.window)
        if self.late:
            return []
        got, self.held = self.held[:max_count], self.held[max_count:]
        return got


def test_an_unsettled_transfer_leaves_its_acks_to_the_next_one() -> None:
    """settle=False returns once the expected messages arrived, its own sends outstanding;
    the next transfer reaps them first, in posting order, then its own; `settle()` waits
    for what is left."""
    stream, link, host = loopback()
    stream.link = late = LateAcks(link)      # type: ignore[assignment]
    src, dst = host.register(4096), host.register(4096)
    src.view()[:] = np.arange(4096) % 251
    stream.transfer(Outgoing(src.local().slice(0, 2000), dst.remote().slice(0, 2000)),
                    recv_nbytes=2000, settle=False)
    assert np.array_equal(dst.view()[:2000], src.view()[:2000])
    assert not stream.settled and stream.window.outstanding == (0, 1)
    late.late = False
    stream.transfer(Outgoing(src.local().slice(2000, 1000), dst.remote().slice(2000, 1000)),
                    recv_nbytes=1000, settle=False)
    assert np.array_equal(dst.view()[:3000], src.view()[:3000])
    assert stream.window.outstanding in ((), (2,))
    stream.settle()
    assert stream.settled and stream.window.outstanding == ()
    stream.transfer(Outgoing(src.local().slice(0, 1), dst.remote().slice(0, 1)), recv_nbytes=1)
    assert stream.settled and stream.next_send_index == stream.next_recv_index == 4


def test_outgoing_sizes_must_match() -> None:
    _, _, host = loopback()
    buf = host.register(100)
    with pytest.raises(ValueError, match="10 bytes sent into a 20-byte"):
        Outgoing(buf.local().slice(0, 10), buf.remote().slice(0, 20))
    with pytest.raises(ValueError, match="outside a 100-byte buffer"):
        buf.local().slice(90, 20)


def test_failed_completion_names_rank_peer_and_message() -> None:
    fabric = FakeFabric()
    fabric.fail_index = 2
    stream, _, host = loopback(fabric=fabric)
    buf = host.register(8192)
    with pytest.raises(CompletionError) as err:
        stream.transfer(Outgoing(buf.local(), buf.remote()), recv_nbytes=8192)
    msg = str(err.value)
    assert "rank 0, ring 'ring'" in msg and "message 2 to rank 0 failed" in msg
    assert "remote access error" in msg and "fake link" in msg


def test_stall_is_reported_after_the_timeout() -> None:
    fabric = FakeFabric()
    fabric.frozen = True
    stream, _, host = loopback(fabric=fabric)
    buf = host.register(8192)
    t0 = time.monotonic()
    with pytest.raises(StallError) as err:
        stream.transfer(Outgoing(buf.local(), buf.remote()), recv_nbytes=8192)
    assert CFG.collective_timeout <= time.monotonic() - t0 < CFG.collective_timeout + 2
    msg = str(err.value)
    assert "nothing moved for 0.5s" in msg
    assert "3 message(s) to rank 0 unacknowledged (oldest: message 0, 5 more not yet posted)" in msg
    assert "message 0 from rank 0 not arrived" in msg


def test_an_idle_stream_arms_then_sleeps_until_the_collective_timeout() -> None:
    """Every sleep follows an arm and a poll after it, and sleeps in the kernel for the
    liveness period or the rest of the collective timeout, whichever is shorter (never a
    spin: a spinning rank starves the kernel's rxe)."""
    fabric = FakeFabric()
    fabric.frozen = True
    stream, link, host = loopback(fabric=fabric)
    buf = host.register(1024)
    with pytest.raises(StallError):
        stream.transfer(Outgoing(buf.local(), buf.remote()), recv_nbytes=1024)
    assert link.waits and link.armed in (len(link.waits), len(link.waits) + 1)
    assert all(0 < t <= min(LIVENESS_POLL, CFG.collective_timeout) for t in link.waits)
    assert link.waits == sorted(link.waits, reverse=True)


def test_a_transfer_left_by_its_liveness_check_leaves_the_stream_interrupted() -> None:
    """On the fake fabric (frozen: nothing moves): a transfer left by an exception (here
    its liveness check's) marks the stream interrupted, and a later completed transfer
    does not clear it (its indices no longer match the peer's: only new QPs help)."""
    fabric = FakeFabric()
    fabric.frozen = True
    stream, _, host = loopback(fabric=fabric)
    buf = host.register(1024)
    assert not stream.interrupted

    def notice() -> None:
        raise RuntimeError("a notice")
    stream.liveness = notice
    with pytest.raises(RuntimeError, match="a notice"):
        stream.transfer(Outgoing(buf.local(), buf.remote()), recv_nbytes=1024)
    assert stream.interrupted
    stream.liveness, fabric.frozen = None, False
    stream.transfer(None)                   # the unacknowledged message completes
    assert stream.interrupted and stream.settled


def test_out_of_step_receiver_is_a_sequence_error() -> None:
    stream, _, host = loopback()
    buf = host.register(1024)
    stream.next_recv_index = 4          # the receiver believes it is further along
    with pytest.raises(SequenceError, match="expected message 4 .* got imm 0"):
        stream.transfer(Outgoing(buf.local(), buf.remote()), recv_nbytes=1024)


def inject_empty(link: FakeLink, after: int, imm: int) -> None:
    """Once message `after` was polled, the next receive completion is an empty write with
    immediate `imm` that took a posted receive (rxe's re-cut stream, docs/roce.md)."""
    poll = link.poll_recvs

    def poll_recvs(max_count: int) -> list[Completion]:
        got = poll(max_count)
        for i, c in enumerate(got):
            if c.index == after and not getattr(link, "injected", False):
                link.injected = True       # type: ignore[attr-defined]
                link.recv_posted -= 1
                return got[:i + 1] + [Completion(imm, True, empty=True)] + got[i + 1:]
        return got
    link.poll_recvs = poll_recvs           # type: ignore[method-assign]


def test_an_arrived_message_sent_again_empty_is_not_a_message() -> None:
    stream, link, host = loopback()
    src, dst = host.register(4096), host.register(4096)
    src.view()[:] = np.arange(4096, dtype=np.uint8)
    inject_empty(link, after=1, imm=1)
    arrived: list[int] = []
    stream.transfer(Outgoing(src.local(), dst.remote()), recv_nbytes=4096,
                    on_arrival=lambda m: arrived.append(m.index))
    assert arrived == [0, 1, 2, 3] and np.array_equal(dst.view(), src.view())
    assert stream.empty_resends == 1 and link.recv_posted == CFG.recv_depth


@pytest.mark.parametrize("imm, error", [(0, "expected message 2 .* got imm 0"),
                                        (2, "message 2 from rank 0 arrived with no bytes")])
def test_an_empty_write_of_another_message_is_a_sequence_error(imm: int, error: str) -> None:
    stream, link, host = loopback()
    buf = host.register(4096)
    inject_empty(link, after=1, imm=imm)
    with pytest.raises(SequenceError, match=error):
        stream.transfer(Outgoing(buf.local(), buf.remote()), recv_nbytes=4096)
    assert stream.empty_resends == 0
