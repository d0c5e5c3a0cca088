"""The dtypes allreduce takes, what the 16-bit floats accumulate in, and how a result is
rounded to each: the one home of those facts (algorithms, references and bounds read them).

bfloat16 is numpy's through `ml_dtypes` (the JAX/TensorFlow project's numpy dtype
extension): torch bfloat16 tensors are reduced as views of the same memory with that dtype
(`netreduce.tensors`).

Rounding: a float64 value y rounded to a dtype lands within u * |y| + tiny of y (u: the unit
roundoff, tiny: half the smallest subnormal). numpy rounds float64 to float32 and float16
directly; ml_dtypes rounds float64 to bfloat16 through float32, i.e. twice.
float32 rounds to either 16-bit type once.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)
HALVES = (FLOAT16, BFLOAT16)          # accumulated in float32, rounded once
SUPPORTED_DTYPES = (np.dtype(np.int32), np.dtype(np.int64), FLOAT16, BFLOAT16, FLOAT32,
                    np.dtype(np.float64))
NAMES = {d: d.name for d in SUPPORTED_DTYPES}      # numpy's dtype.name is computed each time

# dtype -> (u, tiny) of one rounding to it
ROUNDING = {np.dtype(np.float64): (2.0**-53, 2.0**-1075), FLOAT32: (2.0**-24, 2.0**-150),
            FLOAT16: (2.0**-11, 2.0**-25), BFLOAT16: (2.0**-8, 2.0**-134)}
FLOATS = tuple(ROUNDING)         # bfloat16 included (its numpy kind is "V", not "f")


def accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype partial results of `dtype` are kept in: float32 for the 16-bit floats,
    else `dtype` itself."""
    return FLOAT32 if dtype in HALVES else dtype
