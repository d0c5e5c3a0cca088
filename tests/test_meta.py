"""Per-call metadata records and the agreement check (pure)."""
from __future__ import annotations

import numpy as np
import pytest

from flowctl.link import RemoteBuffer
from netreduce.meta import (RECORD_STRIDE, AllreduceMismatch, CallMeta, check_agreement,
                            check_dtype, check_op, control_bytes)


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
