"""What one benchmark run measures: the plan the parent hands every rank, and sizes.

Sizes are bytes, written plainly or with a binary suffix (`64K`, `1M`, `16M`, `1G`), or as
a range MIN:MAX:FACTOR in the style of nccl-tests' -b/-e/-f (`4:16M:4` = 4 B, 16 B, 64 B,
..., 16 MiB); each must be a whole number of elements of the benchmark's dtype.
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
RTT = "rtt"                       # the RC round trip between ranks 0 and 1 (not an algo)
RTT_BYTES = 8                     # what its ping-pong WRITEs carry, whatever the row's size
SWEEP = "4:16M:4"                 # --sweep's sizes: 4 B to 16 MiB by powers of 4
AUTO_CALLS_BYTES = 256 * 1024     # --iters auto: about this many bytes per job...
AUTO_CALLS_MAX = 16               # ...in at most this many calls
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"(\d+)\s*([KMG]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'16M' -> 16777216; '4096' -> 4096 (binary suffixes K, M, G; 'KiB'/'MB' also read)."""
    m = _SIZE.fullmatch(text.strip())
    if m is None or int(m.group(1)) <= 0:
        raise ValueError(f"bench: size {text!r} is not a positive byte count like 4096, "
                         f"64K or 16M")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def parse_range(text: str) -> list[int]:
    """'4:1K:4' -> [4, 16, 64, 256, 1024]: MIN, then times FACTOR while <= MAX."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"bench: size range {text!r} is not MIN:MAX:FACTOR like 4:16M:4")
    low, high = parse_size(parts[0]), parse_size(parts[1])
    try:
        factor = int(parts[2])
    except ValueError:
        factor = 0
    if factor < 2 or low > high:
        raise ValueError(f"bench: size range {text!r}: need MIN <= MAX and an integer "
                         f"FACTOR >= 2")
    out = [low]
    while out[-1] * factor <= high:
        out.append(out[-1] * factor)
    return out


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes and MIN:MAX:FACTOR ranges, in order, each size once."""
    sizes: list[int] = []
    for item in (s.strip() for s in text.split(",")):
        if item:
            sizes += parse_range(item) if ":" in item else [parse_size(item)]
    return list(dict.fromkeys(sizes))


def parse_iters(text: str) -> int:
    """'auto' -> 0 (calls per job chosen per size, `BenchPlan.calls`), else a count >= 1."""
    if text.strip().lower() == "auto":
        return 0
    try:
        iters = int(text)
    except ValueError:
        iters = 0
    if iters < 1:
        raise ValueError(f"bench: --iters {text!r}: a count of calls per job >= 1, or auto")
    return iters


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
    one job per column: the link, then each algorithm, then (with `rtt`) the RC round trip
    between ranks 0 and 1 (see netreduce.tools.bench.worker). A job makes `calls(size)`
    calls back to back (`iters`; 0 = auto) and reports its time per call; with `in_flight`
    K > 1 an allreduce job keeps K asynchronous calls outstanding (nccl-tests' aggregated
    iterations): its time per call is the stream's pace, each call's latency reported too."""

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
    iters: int = 1                     # calls per job; 0: auto (`calls`)
    rtt: bool = False                  # measure the RC round trip column too
    in_flight: int = 1                 # asynchronous calls outstanding per allreduce job

    def __post_init__(self) -> None:
        if self.workers < 1 or self.jobs < 1 or self.warmup < 0 or self.iters < 0 \
                or self.in_flight < 1:
            raise ValueError(f"bench: need workers >= 1, jobs >= 1, warmup >= 0, iters >= 0, "
                             f"in-flight >= 1 (got {self.workers}, {self.jobs}, {self.warmup}, "
                             f"{self.iters}, {self.in_flight})")
        if self.rtt and self.workers < 2:
            raise ValueError("bench: the RC round trip needs 2 or more workers")
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
        return (LINK, *self.algos, *((RTT,) if self.rtt else ()))

    def calls(self, size: int) -> int:
        """Calls per job at `size`: `iters`, or (auto) enough for ~AUTO_CALLS_BYTES per job,
        1 to AUTO_CALLS_MAX: small calls are timed over several, large ones one by one."""
        if self.iters:
            return self.iters
        return max(1, min(AUTO_CALLS_MAX, AUTO_CALLS_BYTES // size))

    @property
    def needs_switch(self) -> bool:
        return any(a in SWITCH_ALGOS for a in self.algos)

    @property
    def units(self) -> int:
        """Jobs (warmup included) the whole run does: the progress bar's total."""
        return len(self.sizes) * len(self.columns) * (self.warmup + self.jobs)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def count(self, size: int) -> int:
        return size // self.itemsize

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "BenchPlan":
        d = json.loads(text)
        return cls(**{**d, "sizes": tuple(d["sizes"]), "algos": tuple(d["algos"])})
