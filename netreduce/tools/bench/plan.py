"""What one benchmark run measures: the plan the parent hands every rank, and sizes.

Sizes are bytes, written plainly or with a binary suffix (`64K`, `1M`, `16M`, `1G`); each
must be a whole number of elements of the benchmark's dtype.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

import numpy as np

from netreduce.tools.reference import SWITCH_PER_CALL

DTYPES = ("int32", "float32")
ALGOS = ("switch", "ring", SWITCH_PER_CALL)  # what `--algos` may name: netreduce.algorithms,
#   and "switch-call": the switch with one quantization scale per call (float32; the
#   quantizer before per-block scales, netreduce.algorithms.switch.one_scale_per_call)
SWITCH_ALGOS = ("switch", SWITCH_PER_CALL)   # the columns that need a registered switch
LINK = "link"                     # the forwarding-mode ring WRITE measurement (not an algo)
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"(\d+)\s*([KMG]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'16M' -> 16777216; '4096' -> 4096 (binary suffixes K, M, G; 'KiB'/'MB' also read)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None or int(m.group(1)) <= 0:
        raise ValueError(f"bench: size {text!r} is not a positive byte count like 4096, "
                         f"64K or 16M")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def format_size(nbytes: int) -> str:
    """The shortest exact binary spelling: 16777216 -> '16 MiB', 1000 -> '1000 B'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def parse_algos(text: str) -> list[str]:
    algos = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    unknown = [a for a in algos if a not in ALGOS]
    if not algos or unknown:
        raise ValueError(f"bench: --algos {text!r}: choose from {', '.join(ALGOS)} (the link "
                         f"is always measured)")
    return algos


@dataclass(frozen=True)
class BenchPlan:
    """Identical on every rank. For every size: `warmup` untimed then `jobs` timed rounds of
    one job per column: the link, then each algorithm (see netreduce.tools.bench.worker)."""

    workers: int
    sizes: tuple[int, ...]
    algos: tuple[str, ...]
    dtype: str = "int32"
    jobs: int = 5
    warmup: int = 1
    window: int = 2
    msg_size: int = 256 * 1024
    mtu: int = 4096
    seed: int = 1
    ack_timeout: int | None = None     # the QPs' local ACK timeout exponent; None: init's

    def __post_init__(self) -> None:
        if self.workers < 1 or self.jobs < 1 or self.warmup < 0:
            raise ValueError(f"bench: need workers >= 1, jobs >= 1, warmup >= 0 (got "
                             f"{self.workers}, {self.jobs}, {self.warmup})")
        if self.dtype not in DTYPES:
            raise ValueError(f"bench: dtype {self.dtype!r} (choose from {', '.join(DTYPES)})")
        if not self.sizes or not self.algos:
            raise ValueError("bench: no sizes or no algorithms to measure")
        if SWITCH_PER_CALL in self.algos and self.dtype == "int32":
            raise ValueError(f"bench: {SWITCH_PER_CALL} compares the float quantizers: "
                             f"use --dtype float32")
        itemsize = np.dtype(self.dtype).itemsize
        odd = [s for s in self.sizes if s % itemsize]
        if odd:
            raise ValueError(f"bench: size(s) {odd} are not a whole number of {self.dtype} "
                             f"elements ({itemsize} bytes)")

    @property
    def columns(self) -> tuple[str, ...]:
        """What is measured at every size, in order."""
        return (LINK, *self.algos)

    @property
    def needs_switch(self) -> bool:
        return any(a in SWITCH_ALGOS for a in self.algos)

    @property
    def units(self) -> int:
        """Jobs (warmup included) the whole run does: the progress bar's total."""
        return len(self.sizes) * len(self.columns) * (self.warmup + self.jobs)

    def count(self, size: int) -> int:
        return size // np.dtype(self.dtype).itemsize

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "BenchPlan":
        d = json.loads(text)
        return cls(**{**d, "sizes": tuple(d["sizes"]), "algos": tuple(d["algos"])})
