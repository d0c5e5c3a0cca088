"""Per-call metadata records, the agreement check, and the switch's per-block exponents
they carry (pure)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flowctl.link import RemoteBuffer
from netreduce.algorithms.switch import MIN_BLOCK, block_elements, block_exponents, local_blocks
from netreduce.meta import (MAX_BLOCK_BYTES, RECORD_STRIDE, AllreduceMismatch, CallMeta,
                            check_agreement, check_dtype, check_op, control_bytes)


def meta(rank: int, seq: int = 0, count: int = 10, dtype: str = "int32") -> CallMeta:
    return CallMeta(rank, seq, count, dtype, "sum", "ring", RemoteBuffer(0x7F00 + rank, 99, 4096))


def test_record_round_trip_fits_its_slot() -> None:
    m = CallMeta(3, 2**40, 2**33, "float64", "max", "switch",
                 RemoteBuffer(2**47, 2**32 - 1, 2**35), lo=-(2.0**31), hi=3.4028234663852886e38)
    raw = m.pack()
    assert len(raw) <= RECORD_STRIDE
    assert CallMeta.unpack(raw + bytes(RECORD_STRIDE - len(raw))) == m
    with pytest.raises(ValueError, match="not a call record"):
        CallMeta.unpack(bytes(RECORD_STRIDE))
    assert control_bytes(4) == 3 * 4 * RECORD_STRIDE
    longest = CallMeta(0, 1, 2, "bfloat16", "avg", "auto", RemoteBuffer(1, 2, 3))   # 8 bytes
    assert CallMeta.unpack(longest.pack()) == longest


def test_agreeing_records_pass() -> None:
    check_agreement([meta(r) for r in range(4)])


def test_disagreement_message_depends_only_on_the_records() -> None:
    records = [meta(0), meta(1, count=11), meta(2), meta(3, dtype="float32")]
    with pytest.raises(AllreduceMismatch) as err:
        check_agreement(records)
    assert str(err.value) == ("allreduce call #0: ranks disagree: int32[10] op=sum algo=ring on "
                              "ranks 0, 2; int32[11] op=sum algo=ring on rank 1; float32[10] "
                              "op=sum algo=ring on rank 3")


def test_ranks_out_of_step() -> None:
    with pytest.raises(AllreduceMismatch, match="out of step: ranks 0, 2 at call #4; rank 1 at call #5"):
        check_agreement([meta(0, seq=4), meta(1, seq=5), meta(2, seq=4)])


def test_dtype_and_op_checks() -> None:
    assert check_dtype(np.dtype("float32")) == np.float32
    with pytest.raises(TypeError, match="dtype complex64 is not supported"):
        check_dtype(np.dtype("complex64"))
    assert check_op("sum", np.dtype("int32")) is np.add
    assert check_op("avg", np.dtype("float16")) is np.add
    with pytest.raises(ValueError, match="op=.avg. takes floating-point arrays, not int32"):
        check_op("avg", np.dtype("int32"))
    with pytest.raises(ValueError, match="op 'prod' is not supported"):
        check_op("prod", np.dtype("float32"))


def test_block_bytes_ride_in_the_record_up_to_its_room() -> None:
    full = CallMeta(1, 7, 2**22, "float32", "sum", "auto", RemoteBuffer(1, 2, 3), lo=-1.0,
                    hi=2.0, blocks=bytes(range(MAX_BLOCK_BYTES)))
    raw = full.pack()
    assert len(raw) <= RECORD_STRIDE == 256 and MAX_BLOCK_BYTES == 128
    assert CallMeta.unpack(raw + bytes(RECORD_STRIDE - len(raw))) == full
    with pytest.raises(ValueError, match="128 block bytes at most, not 129"):
        CallMeta(0, 0, 1, "float32", "sum", "auto", RemoteBuffer(1, 2, 3),
                 blocks=bytes(MAX_BLOCK_BYTES + 1)).pack()


@pytest.mark.parametrize("nbytes, blocks", [(1 << 10, 1), (1 << 20, 128), (16 << 20, 128)])
def test_metadata_bytes_per_call(nbytes: int, blocks: int) -> None:
    """A float32 call of 1 KiB, 1 MiB, 16 MiB publishes 1, 128, 128 exponents (blocks of
    1 Ki, 2 Ki, 32 Ki elements); every call exchanges n records of RECORD_STRIDE bytes,
    whatever its size (4 ranks: 1 KiB per rank per call)."""
    count = nbytes // 4
    published = local_blocks(np.ones(count, dtype=np.float32)).blocks
    assert len(published) == blocks == -(-count // block_elements(count))
    assert control_bytes(4) == 3 * 4 * 256


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 2**40))
def test_blocks_are_the_smallest_power_of_two_that_fits_the_record(count: int) -> None:
    block = block_elements(count)
    assert block >= MIN_BLOCK and block & (block - 1) == 0
    assert -(-count // block) <= MAX_BLOCK_BYTES
    assert block == MIN_BLOCK or -(-count // (block // 2)) > MAX_BLOCK_BYTES


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 32), blocks=st.integers(0, MAX_BLOCK_BYTES), data=st.data())
def test_every_rank_derives_the_same_exponents_from_the_bank_the_switch_sums(
        n: int, blocks: int, data: st.DataObject) -> None:
    """Each rank writes its record (any per-block floors) in its own slot of a zeroed bank;
    the switch's wrapping int32 sum of the n banks is their concatenation, so every rank
    unpacks every record unchanged and derives the same exponents, whatever the order it
    folds the ranks in: the largest floor per block."""
    floors = data.draw(hnp.arrays(np.int8, (n, blocks)))
    records = [CallMeta(r, 5, blocks * MIN_BLOCK, "float32", "sum", "auto",
                        RemoteBuffer(r, 2, 3), blocks=floors[r].tobytes()) for r in range(n)]
    banks = np.zeros((n, n * RECORD_STRIDE), dtype=np.uint8)
    for r, record in enumerate(records):
        raw = record.pack()
        banks[r, r * RECORD_STRIDE:r * RECORD_STRIDE + len(raw)] = np.frombuffer(raw, np.uint8)
    summed = banks.view("<i4").sum(axis=0, dtype=np.int64).astype("<i4").view(np.uint8)
    got = [CallMeta.unpack(summed[r * RECORD_STRIDE:(r + 1) * RECORD_STRIDE].tobytes())
           for r in range(n)]
    assert got == records
    order = data.draw(st.permutations(range(n)))
    exponents = block_exponents(n, [got[r].blocks for r in order])
    assert np.array_equal(exponents, block_exponents(n, [m.blocks for m in records]))
    c = (n - 1).bit_length()
    assert np.array_equal(exponents, 30 - c - floors.astype(np.int32).max(axis=0, initial=-128))
