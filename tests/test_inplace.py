"""int32 switch calls sent from the caller's memory, registered in place (issue 41 item 5):
the gather list's slicing, the registration cache's hits, misses and collections, and whole
communicators on the in-process fabric (tests/fakefabric.py: MRs on user memory read that
memory, never a copy) -- results against numpy sums, a switch lost right after a call
returned while the caller overwrites its buffers, a transport fault on "inc"."""
from __future__ import annotations

import ctypes
import gc
import random
import time
from typing import Any

import numpy as np
import pytest

import netreduce.algorithms.switch as switch
import netreduce.rejoin as rejoin
import netreduce.hostpass as hostpass
from flowctl import FlowConfig
from flowctl.link import Gather, LocalBuffer
from netreduce import Communicator
from netreduce.algorithms.switch import IN_PLACE_BYTES, block_elements, log2_floors
from netreduce.regcache import RegistrationCache, owner_of
from netreduce.tensors import as_ndarray
from tests.fakefabric import FakeController, FakeFabric, FakeHost, FakeUserRegion
from tests.ranks import run_ranks
from tests.rcmodel.calls import data as rc_data, want as rc_want
from tests.rcmodel.fabric import Faults
from tests.rcmodel.world import World

# 20 000 int32 (80 000 bytes, past IN_PLACE_BYTES) + a 3-rank seal in 16 KiB messages: 4
# full ones, then 14 464 bytes of data and the 12-byte seal in one WRITE of two SGEs
CFG = FlowConfig(mtu=256, msg_size=16384, window=4, recv_depth=64, collective_timeout=20.0)
COUNT = 20_000
MESSAGES = 1 + 5        # per call on "inc": the records, then the data and seal
N = 3


@pytest.fixture(autouse=True)
def quick_rejoin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rejoin, "REJOIN_FIRST", 0.3)
    monkeypatch.setattr(rejoin, "REJOIN_POLL", 0.1)


def data(rank: int, call: int) -> np.ndarray:
    return np.arange(COUNT, dtype=np.int32) * (rank + 1) - 7 * call


def want(call: int) -> list[int]:
    return sum(data(r, call).astype(np.int64) for r in range(N)).astype(np.int32).tolist()


def test_a_gather_list_slices_into_plain_buffers_and_spanning_pieces() -> None:
    a, b = LocalBuffer(1000, 7, 100), LocalBuffer(5000, 9, 12)
    g = Gather((a, b))
    assert g.nbytes == 112
    assert g.slice(0, 64) == LocalBuffer(1000, 7, 64)
    assert g.slice(100, 12) == b
    assert g.slice(64, 48) == Gather((LocalBuffer(1064, 7, 36), b))
    assert g.slice(99, 2) == Gather((LocalBuffer(1099, 7, 1), LocalBuffer(5000, 9, 1)))
    for bad in ((0, 113), (-1, 4), (10, 0)):
        with pytest.raises(ValueError, match="outside a 112-byte gather list"):
            g.slice(*bad)
    with pytest.raises(ValueError, match="non-empty parts"):
        Gather((a, LocalBuffer(0, 1, 0)))


class Region:
    """A stand-in region: `closed` once deregistered."""

    def __init__(self, addr: int, nbytes: int) -> None:
        self.addr, self.nbytes, self.closed = addr, nbytes, False

    def local(self) -> LocalBuffer:
        return LocalBuffer(self.addr, 1, self.nbytes)

    def close(self) -> None:
        self.closed = True


def cache(capacity: int = 4) -> tuple[RegistrationCache, list[Region]]:
    made: list[Region] = []

    def register(addr: int, nbytes: int) -> Region:
        made.append(Region(addr, nbytes))
        return made[-1]
    return RegistrationCache(register, capacity), made


def test_the_cache_hits_on_the_same_live_buffer_and_its_views() -> None:
    regs, made = cache()
    x = np.arange(1000, dtype=np.int32)
    first = regs.local(x)
    assert first == LocalBuffer(x.ctypes.data, 1, 4000)
    assert regs.local(x) == first and regs.local(x[:]) == first   # x[:]: the same owner
    assert regs.local(x[:500]) == LocalBuffer(x.ctypes.data, 1, 2000)   # another length
    assert (regs.hits, regs.misses, len(made)) == (2, 2, 2)
    assert owner_of(x[10:].reshape(-1)) is x
    assert regs.local(x[::2]) is None and regs.local(np.empty(0, np.int32)) is None


def test_the_cache_misses_when_the_buffer_was_freed_and_its_address_reused() -> None:
    """Two owners of the same memory one after the other (as a freed buffer's address
    handed out again): the first one's collection deregisters its region at once, and the
    second registers anew although address and length are equal."""
    regs, made = cache()
    backing = (ctypes.c_int32 * 1000)()
    addr = ctypes.addressof(backing)

    def buffer() -> np.ndarray:
        owner = (ctypes.c_int32 * 1000).from_address(addr)
        return np.frombuffer(owner, dtype=np.int32)

    x = buffer()
    regs.local(x)
    assert regs.local(x) is not None and regs.hits == 1
    del x
    gc.collect()
    assert made[0].closed and regs.collected == 1 and len(regs) == 0
    y = buffer()
    assert regs.local(y) == LocalBuffer(addr, 1, 4000)
    assert (regs.misses, len(made), made[1].closed) == (2, 2, False)


def test_the_cache_evicts_the_least_recently_used_and_closes_everything() -> None:
    regs, made = cache(capacity=2)
    xs = [np.zeros(100, np.int32) for _ in range(3)]
    regs.local(xs[0]), regs.local(xs[1]), regs.local(xs[0]), regs.local(xs[2])
    assert [r.closed for r in made] == [False, True, False] and regs.evictions == 1
    regs.close()
    assert all(r.closed for r in made) and len(regs) == 0
    del xs
    gc.collect()
    assert regs.collected == 0                  # closed entries have no finalizer left


def test_a_cache_that_cannot_register_copies_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    def refuse(addr: int, nbytes: int) -> Region:
        raise OSError("RLIMIT_MEMLOCK")
    regs = RegistrationCache(refuse)
    assert regs.local(np.zeros(10, np.int32)) is None
    assert regs.local(np.zeros(10, np.int32)) is None and regs.failures == 2
    assert caplog.text.count("cannot be registered in place (RLIMIT_MEMLOCK)") == 1
    assert RegistrationCache(None).local(np.zeros(10, np.int32)) is None
    with pytest.raises(ValueError, match="0 entries"):
        RegistrationCache(refuse, 0)


def test_in_place_and_out_of_place_int32_calls_on_the_fake_fabric_are_exact() -> None:
    """Calls 0-3 out of place, 4-5 in place, from the same two buffers: results exact, the
    inputs of out-of-place calls untouched, sent from the caller's memory (one region per
    buffer, registered once: the cache hits), a small call copied as before."""
    def body(comm: Communicator, host: FakeHost) -> Any:
        x, y = data(comm.rank, 0), np.empty(COUNT, np.int32)
        got = []
        for c in range(6):
            x[:] = data(comm.rank, c)
            result = comm.allreduce(x, out=y if c < 4 else None)
            got.append(((result is y) if c < 4 else (result is x), result.tolist() == want(c),
                        c >= 4 or x.tolist() == data(comm.rank, c).tolist()))
        small = np.arange(40, dtype=np.int32)
        comm.allreduce(small)
        got.append(small.tolist() == (np.arange(40) * N).tolist())
        regions = [(r.addr, r.nbytes) for r in host.user_regions]
        cache = comm._registered
        return got, regions == [(x.ctypes.data, x.nbytes)], (cache.hits, cache.misses)

    fabric = FakeFabric()
    for got in run_ranks(N, body, cfg=CFG, fabric=fabric, controller=FakeController(fabric)):
        assert not isinstance(got, BaseException), got
        assert got == ([(True, True, True)] * 6 + [True], True, (5, 1)), got
    assert COUNT * 4 >= IN_PLACE_BYTES


def test_a_freed_input_is_deregistered_and_a_new_one_registered_on_the_fake_fabric() -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        results = []
        for c in range(3):
            x = data(comm.rank, c)          # a fresh array each call, the last one freed
            results.append(comm.allreduce(x, out=np.empty_like(x)).tolist() == want(c))
            del x
            gc.collect()
        return results, [r.closed for r in host.user_regions], comm._registered.misses

    fabric = FakeFabric()
    for got in run_ranks(N, body, cfg=CFG, fabric=fabric, controller=FakeController(fabric)):
        assert not isinstance(got, BaseException), got
        assert got == ([True] * 3, [True] * 3, 3), got


@pytest.mark.parametrize("in_place", [False, True])
def test_a_fake_switch_lost_after_a_call_returned_recovers_though_the_caller_overwrote_it(
        in_place: bool) -> None:
    """The fake switch dies while it emits call 1's last message (data tail and seal, two
    SGEs): rank 1 gets the sum (a good seal) and returns; it then overwrites its input and
    output and goes on to call 2. Ranks 0 and 2 (bad seals) finish call 1 from rank 1's
    sum, kept in its workspace and handed over the host ring: exact although rank 1's
    buffers hold garbage by then; their own inputs were never written before the result."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    fabric.switch.cut = lambda ring, index: 1 if index == 2 * MESSAGES - 1 else None

    def body(comm: Communicator, host: FakeHost) -> Any:
        got = []
        for c in range(3):
            x = data(comm.rank, c)
            y = x if in_place else np.full(COUNT, -1, np.int32)
            comm.allreduce(x, out=None if in_place else y)
            got.append((y.tolist() == want(c), comm.last_algo))
            x[:] = 12345                     # the caller reuses its buffers at once
            y[:] = -12345
        return got, comm.stats()["switch"], len(host.user_regions) > 0

    for got in run_ranks(N, body, cfg=CFG, fabric=fabric, controller=controller):
        assert not isinstance(got, BaseException), got
        assert got == ([(True, "switch"), (True, "switch"), (True, "ring")],
                       {"fallbacks": 1, "returns": 0, "recovered": 1}, True), got


@pytest.mark.parametrize("index", [MESSAGES + 2, 2 * MESSAGES - 1, 2 * MESSAGES])
def test_a_fake_switch_lost_amid_k4_in_place_calls_recovers_each_call_once_exact(
        monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    """Four in-place calls in flight, each buffer overwritten as soon as its call is waited
    for; the fake switch dies in call 1's data, at its last message (the two-SGE one), or at
    call 2's records: every call's result is numpy's sum, one fallback on every rank."""
    monkeypatch.setenv("NR_IN_FLIGHT", "4")
    fabric = FakeFabric()
    controller = FakeController(fabric)
    fabric.switch.cut = lambda ring, i: 1 if i == index else None
    calls = 6

    def body(comm: Communicator, host: FakeHost) -> Any:
        xs = [data(comm.rank, c) for c in range(calls)]
        works = [comm.allreduce(x, async_op=True) for x in xs]
        got = []
        for c, w in enumerate(works):
            w.wait(30)
            got.append(xs[c].tolist() == want(c))
            xs[c][:] = 12345                    # the caller reuses its buffer at once
        return got, comm.stats()["switch"]["fallbacks"], len(host.user_regions) > 0

    for got in run_ranks(N, body, cfg=CFG, fabric=fabric, controller=controller):
        assert not isinstance(got, BaseException), got
        assert got == ([True] * calls, 1, True), got


def test_an_inc_fault_at_the_last_message_of_an_in_place_call_on_fake_qps_stays_exact() -> None:
    """Rank 1's "inc" QPs fail the WRITE of call 1's last message (the two-SGE one): no
    rank has a good seal, so "inc" is rebuilt at once and the call redone through the
    switch from the untouched inputs (the callers' memory, registered in place); every
    call exact, every one through the switch, no fallback."""
    fabric = FakeFabric()
    controller = FakeController(fabric)

    def body(comm: Communicator, host: FakeHost) -> Any:
        got = []
        for c in range(5):
            if c == 1 and comm.rank == 1:
                host.rings["inc"].fail_at = host.rings["inc"].delivered + MESSAGES - 1
            x = data(comm.rank, c)
            y = np.empty_like(x)
            comm.allreduce(x, out=y)
            got.append((y.tolist() == want(c), x.tolist() == data(comm.rank, c).tolist(),
                        comm.last_algo))
        return got, comm.stats()["switch"]["fallbacks"]

    for got in run_ranks(N, body, cfg=CFG, fabric=fabric, controller=controller):
        assert not isinstance(got, BaseException), got
        calls, fallbacks = got
        assert all(exact and kept for exact, kept, _ in calls) and fallbacks == 0, got
        assert {a for *_, a in calls} == {"switch"}, got


def test_a_torch_tensors_view_is_not_cached_its_owner_is_a_temporary() -> None:
    torch = pytest.importorskip("torch")
    regs, made = cache()
    assert regs.local(as_ndarray(torch.zeros(100, dtype=torch.int32))) is None and not made


def test_the_fused_range_and_quantize_pass_is_bit_for_bit_the_two_passes() -> None:
    if not hostpass.AVAILABLE:
        pytest.skip("make -C netreduce/native")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(300_000) * np.exp2(rng.integers(-40, 40, 300_000))).astype(np.float32)
    x[:2048] = 0.0
    x[5000], x[70_000] = np.nan, -np.inf
    block = block_elements(x.size)
    wire = np.zeros(x.size, np.int32)
    lows, highs, exps = hostpass.block_ranges_quantize(x, block, 28, wire)
    with np.errstate(invalid="ignore"):
        want_lo = np.minimum.reduceat(x, np.arange(0, x.size, block))
        want_hi = np.maximum.reduceat(x, np.arange(0, x.size, block))
    assert np.array_equal(lows, want_lo, equal_nan=True)
    assert np.array_equal(highs, want_hi, equal_nan=True)
    floors = log2_floors(np.maximum(-want_lo, want_hi)).astype(np.int64)
    bad = {5000 // block, 70_000 // block}
    for b in range(exps.size):
        if b in bad:
            assert exps[b] == np.iinfo(np.int32).min
            continue
        assert exps[b] == 28 - floors[b]
        part = x[b * block:(b + 1) * block].astype(np.float64) * 2.0 ** (28 - floors[b])
        assert np.array_equal(wire[b * block:(b + 1) * block], np.rint(part).astype(np.int32))


def scaled(rank: int, count: int) -> np.ndarray:
    """float32 data whose block floors differ between ranks: block b of rank r scaled by
    2^((r + b) % 3), so each block's largest floor is another rank's."""
    x = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
    block = block_elements(count)
    return x * np.exp2((rank + np.arange(count) // block) % 3).astype(np.float32)


def quantized_sum(inputs: list[np.ndarray]) -> np.ndarray:
    """The switch path's float32 sum from its closed form (module doc of the switch
    algorithm): e_b = 30 - ceil(log2 n) - F_b with F_b = floor(log2 of the block's largest
    |x| over ranks), the sum of rint(x * 2^e_b) times 2^-e_b, rounded once."""
    block = block_elements(inputs[0].size)
    top = np.max([np.abs(x) for x in inputs], axis=0)
    starts = np.arange(0, top.size, block)
    floors = np.floor(np.log2(np.maximum.reduceat(top, starts).astype(np.float64)))
    e = np.repeat(30 - 2 - floors, block)[:top.size]
    total = sum(np.rint(x.astype(np.float64) * np.exp2(e)) for x in inputs)
    return (total * np.exp2(-e)).astype(np.float32)


@pytest.mark.parametrize("same", [True, False])
def test_float32_quantized_ahead_on_the_fake_fabric_is_exactly_the_closed_form(
        same: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 calls quantized in the min/max pass, ahead of the agreement: results are the
    closed form's bits on every rank; when every rank holds the same data, no block is
    quantized again (no quantize pass at all, also after a small call), else only the
    blocks whose largest floor is another rank's."""
    if not hostpass.AVAILABLE:
        pytest.skip("make -C netreduce/native")
    count = 300_000
    passes: list[int] = []
    real, again_real = hostpass.quantize_f32, hostpass.requantize_f32

    def counted(flat: np.ndarray, *args: Any) -> None:
        passes.append(flat.size)
        real(flat, *args)

    def counted_again(flat: np.ndarray, block: int, exps: np.ndarray, ahead: np.ndarray,
                      wire: np.ndarray) -> None:
        sizes = np.diff(np.append(np.arange(0, flat.size, block), flat.size))
        passes.append(int(sizes[exps != ahead].sum()))
        again_real(flat, block, exps, ahead, wire)
    monkeypatch.setattr(hostpass, "quantize_f32", counted)
    monkeypatch.setattr(hostpass, "requantize_f32", counted_again)
    inputs = [scaled(0 if same else r, count) for r in range(N)]

    def body(comm: Communicator, host: FakeHost) -> Any:
        out = np.empty(count, np.float32)
        for _ in range(2):
            comm.allreduce(inputs[comm.rank], out=out)
            comm.allreduce(np.ones(3, np.float32))  # kept next: its records, no sum
        return out, comm.last_algo

    fabric = FakeFabric()
    results = run_ranks(N, body, cfg=CFG, fabric=fabric, controller=FakeController(fabric))
    want = quantized_sum(inputs)
    for got in results:
        assert not isinstance(got, BaseException), got
        assert got[1] == "switch" and np.array_equal(got[0], want)
    # the elements of the blocks where a rank's floor is below another's, twice (2 calls)
    block = 4096                            # block_elements(300 000)
    starts = np.arange(0, count, block)
    floors = np.array([np.floor(np.log2(np.maximum.reduceat(np.abs(x), starts)))
                       for x in inputs])
    sizes = np.diff(np.append(starts, count))
    again = sum(int(sizes[floors[r] < floors.max(axis=0)].sum()) for r in range(N))
    assert sum(passes) == 2 * again and (again == 0) == same, (sum(passes), again)


@pytest.mark.parametrize("later", [COUNT, 30_000])
def test_a_fake_switch_lost_in_a_float_call_recovers_though_the_next_one_quantized_ahead(
        later: int) -> None:
    """float32: the switch dies while it emits call 1's last message; rank 1 (good seal)
    returns and starts call 2, quantizing it ahead into the same workspace -- below the
    kept sum only (`later` = 30 000: its words would reach into it, so it is not quantized
    ahead) -- before the others' settle takes rank 1's sum of call 1: every call exact."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    fabric.switch.cut = lambda ring, index: 1 if index == 2 * MESSAGES - 1 else None
    counts = (COUNT, COUNT, later)
    inputs = [[scaled(r, n) + np.float32(c) for r in range(N)] for c, n in enumerate(counts)]

    def body(comm: Communicator, host: FakeHost) -> Any:
        got = []
        for c, n in enumerate(counts):
            y = np.empty(n, np.float32)
            comm.allreduce(inputs[c][comm.rank], out=y)
            exact = np.array_equal(y, quantized_sum(inputs[c])) if c < 2 else np.allclose(
                y, np.sum(inputs[c], axis=0, dtype=np.float64), rtol=1e-6, atol=1e-6)
            got.append((exact, comm.last_algo))
        return got, comm.stats()["switch"]

    for got in run_ranks(N, body, cfg=CFG, fabric=fabric, controller=controller):
        assert not isinstance(got, BaseException), got
        assert got == ([(True, "switch"), (True, "switch"), (True, "ring")],
                       {"fallbacks": 1, "returns": 0, "recovered": 1}), got


def rc_world_run(monkeypatch: pytest.MonkeyPatch, in_place: bool, faults: Any) -> tuple:
    """3 ranks of the RC model (real switch pipeline, modelled rxe): two int32 calls of
    3000 elements (12 000 bytes and a 12-byte seal in 1 KiB messages: the last one, 736
    data bytes and the seal, is two SGEs in place); every rank's results, the frames the
    hosts sent to the switch, and the regions of the caller's memory each registered."""
    monkeypatch.setattr(switch, "IN_PLACE_BYTES", 4096 if in_place else 1 << 40)
    frames: list[bytes] = []

    def capture(kind: str, frame: bytes) -> bool:
        if kind == "contribution":
            frames.append(frame)
        return faults(kind, frame) if faults is not None else False
    rc_cfg = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64,
                        collective_timeout=2.0)
    world = World(N, rc_cfg, faults=Faults(drop=capture))
    got = world.run(lambda comm: [comm.allreduce(rc_data(comm.rank, 3000) * (c + 1)).tolist()
                                  for c in range(2)])
    users = [c._host.device.user_regions for c in world.comms]
    return got, frames, users


def test_in_place_contributions_on_the_rc_model_are_the_copys_bytes() -> None:
    """Byte for byte the same frames reach the switch whether the input is copied or sent
    from the caller's memory with a two-SGE last message; both sums exact."""
    with pytest.MonkeyPatch.context() as patch:
        copied, copied_frames, copied_users = rc_world_run(patch, False, None)
    with pytest.MonkeyPatch.context() as patch:
        placed, placed_frames, placed_users = rc_world_run(patch, True, None)
    want_sums = [(rc_want(N, 3000) * (c + 1)).tolist() for c in range(2)]
    assert copied == placed == [want_sums] * N
    assert copied_users == [0] * N and placed_users == [2] * N    # a fresh input per call
    assert len(placed_frames) > 100 and placed_frames == copied_frames


def test_in_place_calls_on_the_rc_model_are_exact_under_loss_duplication_and_reordering(
        monkeypatch: pytest.MonkeyPatch) -> None:
    draw = random.Random(7)
    got, _, users = rc_world_run(monkeypatch, True, lambda kind, frame: draw.random() < 0.03)
    assert got == [[(rc_want(N, 3000) * (c + 1)).tolist() for c in range(2)]] * N
    assert users == [2] * N


def test_pinned_stand_in_regions_outlive_capacity_until_unpinned() -> None:
    """Regions a call may still send from (pinned by its seq) are never evicted for room:
    the cache holds more than `capacity` until `unpin` releases their calls, then drops
    the least recently used unpinned ones."""
    regs, made = cache(capacity=1)
    xs = [np.zeros(100, np.int32) for _ in range(4)]
    for seq, x in enumerate(xs):
        regs.local(x, pin=seq)
    assert [r.closed for r in made] == [False] * 4 and len(regs) == 4
    regs.unpin(2)                               # calls 0 and 1 done; 2 and 3 in flight
    assert [r.closed for r in made] == [True, True, False, False] and regs.evictions == 2
    regs.local(xs[2], pin=4)                    # a hit re-pins (call 4 sends from it too)
    regs.unpin(4)
    assert [r.closed for r in made] == [True, True, False, True] and len(regs) == 1
    regs.unpin()
    assert len(regs) == 1 and not made[2].closed    # at capacity: kept for a later hit


def test_k4_fake_calls_in_flight_never_lose_a_region_they_send_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 4 asynchronous in-place calls, each from its own buffer, with a one-entry cache:
    every result exact, no buffer copied for want of a region, and no region deregistered
    before its call completed (the fake fabric would refuse a WRITE from it) although the
    cache evicts for room."""
    monkeypatch.setenv("NR_IN_FLIGHT", "4")
    calls = 8

    def body(comm: Communicator, host: FakeHost) -> Any:
        cache = comm._registered
        cache.capacity = 1
        works: list[Any] = []
        early: list[int] = []
        register = cache._register
        assert register is not None

        def registered(addr: int, nbytes: int) -> FakeUserRegion:
            region, index = register(addr, nbytes), len(host.user_regions) - 1
            close = region.close

            def watched() -> None:
                if not region.closed and not works[index].is_completed():
                    early.append(index)
                close()
            region.close = watched      # type: ignore[method-assign]
            return region
        cache._register = registered
        xs = [data(comm.rank, c) for c in range(calls)]
        ys = [np.empty(COUNT, np.int32) for _ in range(calls)]
        works.extend(comm.allreduce(x, out=y, async_op=True) for x, y in zip(xs, ys))
        for w in works:
            w.wait(30)
        return ([y.tolist() == want(c) for c, y in enumerate(ys)], early, cache.failures,
                len(host.user_regions), cache.evictions > 0)

    fabric = FakeFabric()
    for got in run_ranks(N, body, cfg=CFG, fabric=fabric, controller=FakeController(fabric)):
        assert not isinstance(got, BaseException), got
        assert got == ([True] * calls, [], 0, calls, True), got
