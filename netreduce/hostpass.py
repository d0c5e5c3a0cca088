"""The switch call's per-byte host passes in one native pass each (netreduce/native/
hostpass.c, `make -C netreduce/native`; issue 41 item 5): the int32 min/max, the float32
per-block min/max, quantize (also fused with that min/max: `block_ranges_quantize`) and
dequantize. numpy needs two passes for a min and a max and
three with temporaries for a quantize or dequantize (scale, round, cast); these read and
write each element once and allocate nothing.

A pass over fewer than HOLD_GIL_BYTES keeps the GIL (the library loaded as `ctypes.PyDLL`):
releasing and taking it back costs more than such a pass while another thread runs Python.

Invariant: each function's result is bit for bit that of the numpy passes it replaces
(netreduce/algorithms/switch.py keeps them for float16 and bfloat16, non-contiguous
arrays, and a machine without the built library: `AVAILABLE` False, logged once and counted,
`fallbacks`).
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

LIBRARY = Path(__file__).resolve().parent / "native" / "libnrhost.so"
_P, _N = ctypes.c_void_p, ctypes.c_size_t
HOLD_GIL_BYTES = 16 * 1024    # passes over fewer bytes keep the GIL (module doc)


def _load(loader: type[ctypes.CDLL] = ctypes.CDLL) -> ctypes.CDLL | None:
    try:
        lib = loader(str(LIBRARY))
    except OSError as exc:
        logger.warning("netreduce: %s not loaded (%s): the switch's host passes run in numpy "
                       "(slower); build it with make -C netreduce/native", LIBRARY.name, exc)
        return None
    lib.nr_range_i32.argtypes = [_P, _N, _P, _P]
    lib.nr_block_ranges_f32.argtypes = [_P, _N, _N, _P, _P]
    lib.nr_quantize_f32.argtypes = [_P, _N, _N, _P, _P]
    lib.nr_dequantize_f32.argtypes = [_P, _N, _N, _P, ctypes.c_int32, _P]
    lib.nr_block_ranges_quantize_f32.argtypes = [_P, _N, _N, ctypes.c_int32, _P, _P, _P, _P]
    lib.nr_requantize_f32.argtypes = [_P, _N, _N, _P, _P, _P]
    for fn in (lib.nr_range_i32, lib.nr_block_ranges_f32, lib.nr_quantize_f32,
               lib.nr_dequantize_f32, lib.nr_block_ranges_quantize_f32,
               lib.nr_requantize_f32):
        fn.restype = None
    return lib


_LIB = _load()
AVAILABLE = _LIB is not None
_HELD = _load(ctypes.PyDLL) if AVAILABLE else None     # the same library, the GIL kept
_fallbacks = 0     # passes that ran in numpy because the library is not built (`fallbacks`)


def address(array: np.ndarray) -> int:
    """Where `array`'s first element lies."""
    return array.__array_interface__["data"][0]




def native(*arrays: np.ndarray) -> bool:
    """Can the native passes take these arrays (built library, C-contiguous, aligned: the
    compiled loops may assume their elements' alignment)? An unbuilt library is a fallback:
    logged once at import, counted (`fallbacks`)."""
    global _fallbacks
    if not AVAILABLE:
        _fallbacks += 1     # a lost increment between threads only undercounts a warned state
        return False
    return all(a.flags.c_contiguous and a.flags.aligned for a in arrays)


def fallbacks() -> int:
    """How many passes of this process ran in numpy because the library is not built (0 on a
    built install; non-contiguous arrays and float16/bfloat16 take numpy by design and do
    not count)."""
    return _fallbacks


def _lib(nbytes: int) -> ctypes.CDLL:
    """The library for a pass over `nbytes` (below HOLD_GIL_BYTES: the GIL kept)."""
    if _LIB is None or _HELD is None:
        raise RuntimeError(f"netreduce: {LIBRARY} is not built (make -C netreduce/native)")
    return _HELD if nbytes < HOLD_GIL_BYTES else _LIB


def range_int32(array: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty C-contiguous int32 array, in one pass."""
    _check(array, np.int32)
    if array.size == 0:
        raise ValueError("netreduce: the range of an empty array")
    lo, hi = ctypes.c_int32(), ctypes.c_int32()
    lib = _lib(array.nbytes)
    lib.nr_range_i32(address(array), array.size, ctypes.byref(lo), ctypes.byref(hi))
    return lo.value, hi.value


def block_ranges(flat: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block of `block` elements of a C-contiguous float32 array (the last may be
    shorter): its minima and maxima (float32; NaN for a block holding a NaN), one pass."""
    _check(flat, np.float32)
    if block < 1:
        raise ValueError(f"netreduce: blocks of {block} elements")
    blocks = -(-flat.size // block)
    lows, highs = np.empty(blocks, np.float32), np.empty(blocks, np.float32)
    lib = _lib(flat.nbytes)
    lib.nr_block_ranges_f32(address(flat), flat.size, block, address(lows), address(highs))
    return lows, highs


def block_ranges_quantize(flat: np.ndarray, block: int, base: int,
                          wire: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`block_ranges` and, in the same memory pass (each block read again from the cache),
    each block quantized into `wire` with this rank's own exponent base - F (F the block's
    floor, as netreduce.algorithms.switch.log2_floors gives it): (lows, highs, the
    exponents used: int32, INT32_MIN for a block holding NaN or infinity, left
    unquantized)."""
    _check(flat, np.float32)
    _check(wire, np.int32, flat.size)
    if block < 1:
        raise ValueError(f"netreduce: blocks of {block} elements")
    blocks = -(-flat.size // block)
    lows, highs = np.empty(blocks, np.float32), np.empty(blocks, np.float32)
    exps = np.empty(blocks, np.int32)
    lib = _lib(flat.nbytes)
    lib.nr_block_ranges_quantize_f32(address(flat), flat.size, block, base, address(lows),
                                     address(highs), address(exps), address(wire))
    return lows, highs, exps


def requantize_f32(flat: np.ndarray, block: int, exponents: np.ndarray, ahead: np.ndarray,
                   wire: np.ndarray) -> None:
    """`quantize_f32` of the blocks whose exponent differs from `ahead`'s (the exponents
    `block_ranges_quantize` used for `wire`) only, in one call."""
    _check(flat, np.float32)
    _check(wire, np.int32, flat.size)
    exps = _exponents(exponents, flat.size, block)
    used = _exponents(ahead, flat.size, block)
    lib = _lib(flat.nbytes)
    lib.nr_requantize_f32(address(flat), flat.size, block, address(exps), address(used),
                          address(wire))


def quantize_f32(flat: np.ndarray, block: int, exponents: np.ndarray,
                 wire: np.ndarray) -> None:
    """wire[i] = rint(flat[i] * 2^exponents[i // block]) (int32), one pass; the caller's
    exponents keep every |x * 2^e| below 2^31 (netreduce.algorithms.switch.block_exponents)."""
    _check(flat, np.float32)
    _check(wire, np.int32, flat.size)
    exps = _exponents(exponents, flat.size, block)
    lib = _lib(flat.nbytes)
    lib.nr_quantize_f32(address(flat), flat.size, block, address(exps), address(wire))


def dequantize_f32(summed: np.ndarray, block: int, exponents: np.ndarray, divisor: int,
                   dst: np.ndarray) -> None:
    """dst[i] = float32(summed[i] * 2^-exponents[i // block] / divisor), the product exact
    and the division in float64, rounded once; one pass."""
    _check(summed, np.int32)
    _check(dst, np.float32, summed.size)
    if divisor < 1:
        raise ValueError(f"netreduce: divisor {divisor}")
    exps = _exponents(exponents, summed.size, block)
    lib = _lib(summed.nbytes)
    lib.nr_dequantize_f32(address(summed), summed.size, block, address(exps), divisor,
                          address(dst))


def _check(array: np.ndarray, dtype: type, size: int | None = None) -> None:
    if array.dtype != dtype or not (array.flags.c_contiguous and array.flags.aligned):
        raise TypeError(f"netreduce: an aligned C-contiguous {np.dtype(dtype)} array is "
                        f"needed, not {array.dtype} (contiguous: {array.flags.c_contiguous}, "
                        f"aligned: {array.flags.aligned})")
    if size is not None and array.size != size:
        raise ValueError(f"netreduce: {array.size} elements where {size} are needed")


def _exponents(exponents: np.ndarray, count: int, block: int) -> np.ndarray:
    if block < 1:
        raise ValueError(f"netreduce: blocks of {block} elements")
    exps = np.ascontiguousarray(exponents, dtype=np.int32).reshape(-1)
    if exps.size != -(-count // block):
        raise ValueError(f"netreduce: {exps.size} exponents for {count} elements in blocks "
                         f"of {block}")
    return exps
