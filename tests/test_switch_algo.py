"""The in-network algorithm (netreduce/algorithms/switch.py) and switch registration on the
in-process fabric, whose fake switch sums each message of a registered ring like the real
one sums packets (tests/fakefabric.py): calls through it, small calls in their records, the
refusals every rank makes alike, routing, stalls. Floats' quantization and its bound:
tests/test_switch_floats.py."""
from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest

from flowctl.plan import FlowConfig
from flowctl.stream import StallError
from netreduce import (AllreduceMismatch, AllreduceOverflow, Communicator, NotQuantizable,
                       SwitchRegistrationError)
from netreduce.algorithms.base import DataRange
from netreduce.routing import FAULT_EVENTS
from netreduce.algorithms.switch import INLINE_BYTES, SWITCH, wire_bytes
from netreduce.tools.reference import Reference, rank_input
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.ranks import CFG, messages, rank_data, run_ranks, with_fake_switch


@pytest.mark.parametrize("n", [2, 3, 4])
def test_switch_allreduce_on_the_fake_switch_int32_exact_float32_within_the_bound(n: int) -> None:
    """algo="auto" at several sizes: every call through the fake switch, metadata included;
    int32 numpy's sum, float32 within the README's bound (`Reference`), the same bits on
    every rank."""
    counts = [1, 3, 257, 1000, 20_000]

    def body(comm: Communicator, host: FakeHost) -> dict[str, Any]:
        assert comm.switch.registered
        got: dict[str, Any] = {"algos": []}
        for count in counts:
            for dtype in ("int32", "float32"):
                x = rank_data(comm.rank, count, dtype)
                out = np.empty_like(x)
                assert comm.allreduce(x, out=out) is out             # algo="auto"
                assert np.array_equal(x, rank_data(comm.rank, count, dtype))
                got["algos"].append(comm.last_algo)
                got[dtype, count] = out
        got["ring posted"] = host.rings["ring"].posted
        return got

    results, fabric, controller = with_fake_switch(n, body)
    assert not any(isinstance(r, Exception) for r in results), results
    (spec,) = controller.registered
    assert controller.unregistered == [spec.ring_id] and controller.closed
    calls = 2 * len(counts)         # each: one metadata message, then the data (if not inline)
    assert fabric.switch.messages[spec.ring_id] == calls + 2 * sum(
        messages(wire_bytes(c, n)) for c in counts if 4 * c > INLINE_BYTES)
    for count in counts:
        ints = np.sum([rank_data(r, count, "int32") for r in range(n)], axis=0, dtype=np.int32)
        ref = Reference(rank_data(r, count, "float32") for r in range(n))
        for res in results:
            assert np.array_equal(res["int32", count], ints)
            assert ref.failure(res["float32", count], "switch") is None, count
            assert res["float32", count].tobytes() == results[0]["float32", count].tobytes()
    for res in results:
        assert res["algos"] == ["switch"] * 2 * len(counts)
        assert res["ring posted"] == 0       # the metadata, too, went through the switch


@pytest.mark.parametrize("dtype", ["int32", "float32", "float16", "bfloat16"])
def test_a_small_call_travels_in_its_records_in_one_message(dtype: str) -> None:
    """Calls of at most INLINE_BYTES of data post one message on "inc" (the records carry
    the data; the switch's sum of the banks is every rank's data), larger ones two. Every
    rank writes the same bits: int32 exact, floats the float64 sum in rank order (/ n for
    avg) rounded once, non-contiguous input and output included; then a larger call
    quantizes as before."""
    n, width = 3, np.dtype(dtype).itemsize       # "bfloat16": ml_dtypes is imported
    ops = ["sum"] if dtype == "int32" else ["sum", "avg"]
    most = INLINE_BYTES // width

    def data(rank: int, count: int) -> np.ndarray:
        return rank_input([rank, count], 2 * count, dtype)[::2]        # a strided view

    def body(comm: Communicator, host: FakeHost) -> Any:
        got = []
        for op in ops:
            for count in (1, most, most + 1):
                before = host.rings["inc"].posted
                out = np.zeros(2 * count, dtype=data(0, 1).dtype)[1::2]
                comm.allreduce(data(comm.rank, count), op=op, out=out)
                got.append((out.tobytes(), host.rings["inc"].posted - before, comm.last_algo))
        return got

    results, _, _ = with_fake_switch(n, body)
    assert not any(isinstance(r, BaseException) for r in results), results
    assert all(r == results[0] for r in results), "ranks differ"
    cases = [(op, count) for op in ops for count in (1, most, most + 1)]
    for (op, count), (raw, posted, algo) in zip(cases, results[0]):
        assert algo == "switch" and posted == (1 if count <= most else 2), (op, count, posted)
        inputs = [data(r, count) for r in range(n)]
        got = np.frombuffer(raw, dtype=inputs[0].dtype)
        if count > most:                     # quantized: within the switch's bound
            ref = Reference(inputs, op)
            assert ref.failure(got, "switch") is None
        elif dtype == "int32":
            assert got.tolist() == np.sum(inputs, axis=0, dtype=np.int32).tolist()
        else:
            total = np.add.reduce(np.stack(inputs).astype(np.float64), axis=0)
            want = (total / n if op == "avg" else total).astype(inputs[0].dtype)
            assert raw == want.tobytes(), (op, count)


def refused(n: int, make: Any, algo: str = "switch") -> tuple[list[Any], FakeFabric]:
    """Every rank calls with make(rank) and then, to show the communicator still works,
    with ones; returns (error text, data untouched, the next sum, messages posted on inc by
    the refused call: 1, its metadata, and no data)."""
    def body(comm: Communicator, host: FakeHost) -> Any:
        x = make(comm.rank)
        before = x.copy()
        try:
            comm.allreduce(x, algo=algo)
        except (AllreduceOverflow, NotQuantizable, AllreduceMismatch) as exc:
            err = f"{type(exc).__name__}: {exc}"
        else:
            return "no error"
        inc_posted = host.rings["inc"].posted
        # the refused call's records were acknowledged before it raised: their send area
        # is free for the next call's
        assert comm._streams["inc"].settled
        y = np.ones(5, dtype=np.int32)
        comm.allreduce(y, algo="switch")
        assert comm._streams["inc"].settled
        return err, np.array_equal(x, before, equal_nan=True), int(y[0]), inc_posted

    results, fabric, _ = with_fake_switch(n, body)
    return results, fabric


def test_an_int32_sum_that_may_overflow_is_refused_on_every_rank_before_any_data_moves() -> None:
    results, _ = refused(3, lambda r: np.array([2**30, -5, r], dtype=np.int32))
    assert {r[1:] for r in results} == {(True, 3, 1)}
    (err,) = {r[0] for r in results}
    assert err.startswith("AllreduceOverflow: allreduce call #0: the int32 sum may overflow: "
                          "the ranks' maxima add up to 3221225472 and their minima to -15")
    assert "conservative" in err


@pytest.mark.parametrize("hi, lo, ok", [
    ((2**30, 2**30 - 1), (0, 0), True),            # maxima add up to exactly 2^31 - 1
    ((2**30, 2**30), (0, 0), False),
    ((0, 0), (-(2**30), -(2**30)), True),          # minima add up to exactly -2^31
    ((0, 0), (-(2**30), -(2**30) - 1), False),
])
def test_the_overflow_bound_is_the_int32_range(hi: tuple, lo: tuple, ok: bool) -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        x = np.array([lo[comm.rank], hi[comm.rank]], dtype=np.int32)
        try:
            return comm.allreduce(x, algo="switch").tolist()
        except AllreduceOverflow:
            return "overflow"

    results, _, _ = with_fake_switch(2, body)
    want = [sum(lo), sum(hi)] if ok else "overflow"
    assert results == [want, want]


def test_nan_or_infinity_cannot_be_quantized() -> None:
    def make(rank: int) -> np.ndarray:
        return np.array([1.0, np.nan if rank == 1 else 2.0, np.inf if rank == 2 else 0.0],
                        dtype=np.float32)

    results, _ = refused(3, make)
    assert {r[1:] for r in results} == {(True, 3, 1)}
    (err,) = {r[0] for r in results}
    assert err.startswith("NotQuantizable: allreduce call #0: algo='switch' quantizes float32 "
                          "to int32 and cannot carry NaN or infinity (in the data of ranks 1, 2)")


def test_ranks_disagreeing_on_one_scale_per_call_are_refused_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 as if in `one_scale_per_call` (call-wide min and max, no block exponents: the
    rank threads share SWITCH, so a thread-local stands in for the context), the others
    per block: refused on every rank before any data moves, the communicator usable."""
    mode = threading.local()
    per_block = SWITCH.local_range

    def local_range(array: np.ndarray, spare: Any = None) -> DataRange:
        if getattr(mode, "per_call", False) and array.nbytes > INLINE_BYTES:
            return DataRange(float(array.min()), float(array.max()))
        return per_block(array, spare)
    monkeypatch.setattr(SWITCH, "local_range", local_range)

    def make(rank: int) -> np.ndarray:
        mode.per_call = rank == 1
        return np.arange(3000, dtype=np.float32)

    results, _ = refused(3, make)
    assert {r[1:] for r in results} == {(True, 3, 1)}
    assert {r[0] for r in results} == {
        "AllreduceMismatch: allreduce call #0: ranks disagree on the quantization: one scale "
        "per block on ranks 0, 2, one per call on the others (`one_scale_per_call` is for "
        "benchmarks, entered by every rank alike); nothing moved"}


def test_a_small_call_whose_record_carries_another_size_is_refused_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1's record carries 4 more data bytes than its int32[1] call has (as a broken
    peer would): every rank refuses the call, names the rank, writes nothing, and the
    communicator goes on."""
    broken = threading.local()
    honest = SWITCH.local_range

    def local_range(array: np.ndarray, spare: Any = None) -> DataRange:
        got = honest(array, spare)
        if getattr(broken, "once", False):
            broken.once = False
            return got._replace(blocks=got.blocks + bytes(4))
        return got
    monkeypatch.setattr(SWITCH, "local_range", local_range)

    def make(rank: int) -> np.ndarray:
        broken.once = rank == 1
        return np.array([rank], dtype=np.int32)

    results, _ = refused(3, make)
    assert {r[1:] for r in results} == {(True, 3, 1)}
    assert {r[0] for r in results} == {
        "AllreduceMismatch: allreduce call #0: the records of rank 1 carry [8] data bytes, "
        "not the call's 4 (int32[1]); nothing written"}


def test_ranks_disagreeing_on_the_algorithm_are_a_mismatch() -> None:
    def body(comm: Communicator, host: FakeHost) -> str:
        try:
            comm.allreduce(np.ones(4, dtype=np.int32), algo="ring" if comm.rank else "switch")
        except AllreduceMismatch as exc:
            return str(exc)
        return "no error"

    results, _, _ = with_fake_switch(2, body)
    assert results == ["allreduce call #0: ranks disagree: int32[4] op=sum algo=switch on "
                       "rank 0; int32[4] op=sum algo=ring on rank 1"] * 2


def test_auto_uses_the_ring_for_what_the_switch_cannot_reduce_and_switch_refuses_it() -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        algos = []
        for x, op in ((np.ones(3, dtype=np.float64), "sum"), (np.ones(3, dtype=np.int64), "sum"),
                      (np.ones(3, dtype=np.int32), "max"), (np.ones(3, dtype=np.float32), "sum")):
            comm.allreduce(x, op=op)
            algos.append(comm.last_algo)
        errors = []
        posted = host.rings["ring"].posted
        for x, op in ((np.ones(3, dtype=np.float64), "sum"), (np.ones(3, dtype=np.int32), "min")):
            try:
                comm.allreduce(x, op=op, algo="switch")
            except (TypeError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        assert host.rings["ring"].posted == posted            # refused before any exchange
        return algos, errors

    results, _, _ = with_fake_switch(2, body)
    for algos, errors in results:
        assert algos == ["ring", "ring", "ring", "switch"]
        assert errors == [
            "TypeError: allreduce: algo='switch' reduces int32, float32, float16 and bfloat16 "
            "only (the switch adds int32), not float64: use algo='ring'",
            "ValueError: allreduce: algo='switch' supports op='sum' and op='avg' only, not "
            "'min': use algo='ring'"]


def test_a_refused_registration_is_an_error_on_every_rank_naming_the_controller() -> None:
    fabric = FakeFabric()
    controller = FakeController(fabric, refuse="INVALID_ARGUMENT: ring x: 128 slots < 2 x 128")
    results = run_ranks(3, lambda comm, host: "connected", fabric=fabric, controller=controller)
    assert all(isinstance(r, SwitchRegistrationError) for r in results), results
    (err,) = {str(r) for r in results}
    assert err.startswith("netreduce: the switch controller at fake-controller:1 did not "
                          "register the 'inc' ring nr-10.99.0.1-")
    assert err.endswith("(3 ranks, 16 packets in flight per connection): INVALID_ARGUMENT: "
                        "ring x: 128 slots < 2 x 128")


def test_without_a_switch_or_alone_auto_runs_the_ring() -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        comm.allreduce(np.ones(3, dtype=np.int32))
        return comm.switch, comm.last_algo

    (alone,), _, controller = with_fake_switch(1, body)
    assert controller.registered == [] and alone[1] == "ring"
    assert alone[0].describe() == ("no switch: a single rank has nothing to aggregate; "
                                   "algo='auto' runs the host ring")
    plain = run_ranks(2, body)
    assert [algo for _, algo in plain] == ["ring", "ring"]
    assert plain[0][0].describe() == ("no switch: no address given (netreduce.init(switch="
                                      "HOST:PORT) or $NR_CONTROLLER); algo='auto' runs the "
                                      "host ring")
    ((status, _), _), _, _ = with_fake_switch(2, body)
    assert status.describe().startswith("'inc' ring nr-10.99.0.1-") and status.describe() \
        .endswith(" registered with the switch at fake-controller:1 (256 slots; software "
                  "target: path MTU 256): algo='auto' aggregates in the network")


def test_outputs_in_place_strided_or_overlapping_the_input_all_get_the_sum() -> None:
    """The output may be the input, a separate array, a strided view, or overlap the input
    at an offset: every rank gets the sum in every case (sizes span several messages)."""
    count = 5 * CFG.msg_size // 4 + 3

    def body(comm: Communicator, host: FakeHost) -> dict[str, np.ndarray]:
        x = rank_data(comm.rank, count, "int32")
        got = {"in place": comm.allreduce(x.copy())}
        got["separate"] = comm.allreduce(x, out=np.empty_like(x))
        got["strided"] = comm.allreduce(x, out=np.empty(2 * count, np.int32)[::2]).copy()
        buf = np.empty(count + 1, np.int32)
        buf[:count] = x
        got["overlapping"] = comm.allreduce(buf[:count], out=buf[1:]).copy()
        return got

    results, _, _ = with_fake_switch(3, body)
    want = np.sum([rank_data(r, count, "int32") for r in range(3)], axis=0, dtype=np.int32)
    for res in results:
        for how, got in res.items():
            assert np.array_equal(got, want), how


def test_auto_routes_nan_to_the_ring_on_every_rank_counts_it_and_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """One rank's NaN and another's Inf: "auto" runs the ring on every rank (bit-identical
    to algo="ring" on the same data, NaN where gloo puts it), only the metadata crossed the
    switch, the fallback is counted alike everywhere, rank 0 warns once; finite calls, and a
    float64 one (counted as a dtype fallback), go on."""
    n, count = 3, 1000

    def data(rank: int) -> np.ndarray:
        x = rank_data(rank, count, "float32")
        if rank == 1:
            x[3] = np.nan
        if rank == 2:
            x[7] = np.inf
        return x

    def body(comm: Communicator, host: FakeHost) -> Any:
        inc = host.rings["inc"].posted
        got = comm.allreduce(data(comm.rank))
        routed = comm.last_algo, comm.last_fallback, host.rings["inc"].posted - inc
        ring = comm.allreduce(data(comm.rank), algo="ring")
        again = comm.allreduce(data(comm.rank))                # a second fallback: no warning
        finite = comm.allreduce(rank_data(comm.rank, count, "float32"))
        after = comm.last_algo, comm.last_fallback
        comm.allreduce(np.ones(4, dtype=np.float64))
        return got, routed, ring, again, finite, after, comm.last_fallback, comm.stats()

    with caplog.at_level(logging.WARNING, logger="netreduce.comm"):
        results, _, _ = with_fake_switch(n, body)
    assert not any(isinstance(r, Exception) for r in results), results
    inputs = np.stack([data(r) for r in range(n)]).astype(np.float64)
    exact = inputs.sum(axis=0)
    for got, routed, ring, again, finite, after, f64, stats in results:
        assert routed == ("ring", "non-finite", 1)           # 1: the metadata message only
        assert got.tobytes() == ring.tobytes() == again.tobytes() == results[0][0].tobytes()
        assert np.isnan(got[3]) and np.isposinf(got[7])
        ok = np.isfinite(exact)
        bound = n * 2.0**-24 * np.abs(inputs).sum(axis=0)    # the ring's rounding
        assert np.all(np.abs(got[ok] - exact[ok]) <= bound[ok])
        assert after == ("switch", None) and f64 == "dtype"
        assert stats == {"calls": {"ring": 4, "switch": 1},
                         "fallbacks": {"non-finite": 2, "dtype": 1},
                         "switch": {"fallbacks": 0, "returns": 0, "recovered": 0},
                         "transport": dict.fromkeys(FAULT_EVENTS, 0)}
    warned = [r.getMessage() for r in caplog.records if r.name == "netreduce.comm"]
    assert warned == [
        "netreduce: allreduce call #0 (float32[1000] op=sum algo=auto) runs over the host ring "
        "although the switch is registered: the data holds NaN or infinity, which the "
        "switch's quantization cannot carry (logged once per reason; comm.stats() counts them)",
        "netreduce: allreduce call #4 (float64[4] op=sum algo=auto) runs over the host ring "
        "although the switch is registered: the switch does not add this dtype (logged once "
        "per reason; comm.stats() counts them)"]


def stall_through_the_fake_switch(ring_counters: dict | Exception, caller: int) -> tuple[str, str]:
    """The ring's id and the StallError of rank `caller`'s call through the switch that
    stops moving (the fake controller answering Counters with `ring_counters`), the other
    rank alive and idle meanwhile: one rank times out, so it never hears another's abort
    first (a PeerFailure, not a stall)."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    controller.ring_counters = ring_counters
    cfg = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=0.5)
    both = threading.Barrier(2)

    def body(comm: Communicator, host: FakeHost) -> str:
        comm.allreduce(np.ones(10, dtype=np.int32), algo="switch")
        both.wait()
        fabric.frozen = True
        error = ""
        if comm.rank == caller:
            with pytest.raises(StallError) as stall:
                comm.allreduce(np.ones(10, dtype=np.int32), algo="switch")
            error = str(stall.value)
        both.wait()
        return error

    errors = run_ranks(2, body, cfg=cfg, fabric=fabric, controller=controller)
    return controller.registered[0].ring_id, errors[caller]


def test_a_stall_through_the_fake_switch_names_what_it_counted() -> None:
    """Rank 0's StallError of a call through the switch names the switch's view of the
    ring: next_emit and the nonzero counters of the ring and of each connection (a
    connection whose packets a switch keeps dropping is the stall's cause); another rank's
    points to it; a controller that cannot answer leaves the stall error whole."""
    counters = {
        "next_emit": 379, "counters": {"aggregated": 12, "drop_mismatch": 3, "completed": 0},
        "connections": [{"rank": 0, "counters": {"aggregated": 6}},
                        {"rank": 1, "counters": {"aggregated": 6, "drop_mismatch": 3}}]}
    ring, error = stall_through_the_fake_switch(counters, caller=0)
    assert "rank 0, ring 'inc': nothing moved for 0.5s" in error
    assert error.endswith(
        f"; what the switch counted for ring {ring}: next_emit 379, {{'aggregated': 12, "
        f"'drop_mismatch': 3}}; rank 0's connection {{'aggregated': 6}}; rank 1's "
        f"connection {{'aggregated': 6, 'drop_mismatch': 3}}"), error
    _, error = stall_through_the_fake_switch(counters, caller=1)
    assert "rank 1, ring 'inc': nothing moved for 0.5s" in error
    assert error.endswith("; what the switch counted: in rank 0's error"), error
    ring, error = stall_through_the_fake_switch(RuntimeError("UNAVAILABLE: gone"), caller=0)
    assert error.endswith(f"; what the switch counted for ring {ring}: unavailable "
                          f"(UNAVAILABLE: gone)"), error
