"""Benchmark results: the records ranks send, jobs aggregated over ranks, statistics, the
SwitchML-style lines, the summary table, the JSON document and its schema.

Units: durations in ns, rates in Gbit/s (decimal: bytes * 8 / ns; SwitchML's lines and the
rates table) and in GB/s (decimal: bytes / ns = Gbit/s / 8; nccl-tests' unit, the latency
table). A job's duration is the longest any rank took from the barrier that started it,
divided by the calls it made (a job of several calls back to back, `Record.calls`, reports
its time per call). algbw = M / median time per call; busbw = algbw * 2(n-1)/n for an
allreduce (what a ring moves per rank) and = algbw for the link (one plain transfer per
rank). The "rtt" column is one RC round trip of RTT_BYTES between ranks 0 and 1 whatever the
row's size (no rate): the reference the other columns' time per call is counted in.

As nccl-tests, each row has a `type`, a `redop` and a `#wrong`: an allreduce column's type
is the benchmark's dtype, its redop "sum", its count M / itemsize elements; the link's are
"uint8", "none" and M bytes; the rtt's "uint64", "none" and 1 (the ping number). #wrong
counts the elements that came out wrong (an allreduce: outside the bound of its algorithm,
netreduce.tools.reference; int32 not exact), summed over every rank and job (warmup
included); a result is verified when it is 0.

The JSON document (`document`; `validate` checks its shape): {"meta": META_KEYS, "results":
[RESULT_KEYS, one per column and size, with the rxe counters, the lab's CPU shares and, on
a fabric, "spine_bytes_per_call"; with --in-flight, "latency_us"], "link_gbps", "rtt_us",
"ratios": [RATIO_KEYS per size]}.
"""
from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from netreduce.tools.bench.runplan import LINK, RTT, RTT_BYTES, format_size
from netreduce.tools.reference import SWITCH_PER_CALL

PREFIX = "NRBENCH "        # a worker's stdout line carrying one Record
CPU = "cpu_"               # Record.counters keys holding CPU time by state
SPINE = "spine_bytes"      # Record.counters key: bytes over a fabric's ToR-spine links
LATENCY = "latency_ns"     # Record.counters key: the job's calls' latencies, summed (in flight)


def gbps(nbytes: int, ns: float) -> float:
    """Gbit/s."""
    return nbytes * 8 / ns if ns > 0 else 0.0


def gigabytes(gbit_per_s: float) -> float:
    """GB/s (decimal, nccl-tests' unit) of a rate in Gbit/s."""
    return gbit_per_s / 8


LINK_TYPE = ("uint8", "none")       # the link's row: bytes, no reduction
RTT_TYPE = ("uint64", "none")       # the rtt's row: the 8-byte ping number


@dataclass(frozen=True)
class Record:
    """One rank's view of one job, or, joined over the ranks by `Collector`, the job itself:
    the slowest rank's `ns`, `wrong` (elements that came out wrong, module doc) and
    `counters` summed. `job` < 0 is a warmup job. `counters`: what moved during the job: the rank's rxe hw_counters (its barrier
    included: sent_pkts, rcvd_seq_err, completer_retry_err, ...; `calls` the calls the job
    made back to back, `ns` their total) and, from rank 0 only, the
    lab's CPU time by state over the timed part (`CPU` + user/system/softirq/idle/..., clock
    ticks of /proc/stat, which every host namespace shares) and, on a two-tier fabric, the
    bytes that crossed its ToR-spine links (`SPINE`, both directions, as the receiving ends
    counted them: worker.SpineMeter; from just before the job's barrier to after the barrier that follows
    it: a one-element ring allreduce each, ~2 x 60 B per link, in the figure)."""

    algo: str
    size: int
    job: int
    ns: int
    wrong: int
    counters: dict[str, int] = field(default_factory=dict)
    calls: int = 1

    @property
    def warmup(self) -> bool:
        return self.job < 0

    @property
    def ok(self) -> bool:
        return self.wrong == 0

    @property
    def per_call_ns(self) -> int:
        return -(-self.ns // self.calls)

    def line(self) -> str:
        return PREFIX + json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def parse(cls, line: str) -> "Record | None":
        """The record a worker line carries, or None for any other line."""
        if not line.startswith(PREFIX):
            return None
        return cls(**json.loads(line[len(PREFIX):]))


class Collector:
    """Joins the ranks' records of each job; `add` returns the joined record once every
    rank's record of the job is in."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pending: dict[tuple[str, int, int], dict[int, Record]] = {}

    def add(self, rank: int, record: Record) -> Record | None:
        key = (record.algo, record.size, record.job)
        got = self._pending.setdefault(key, {})
        got[rank] = record
        if len(got) < self.workers:
            return None
        del self._pending[key]
        counters: Counter[str] = Counter()
        for r in got.values():
            counters.update(r.counters)
        return Record(record.algo, record.size, record.job, max(r.ns for r in got.values()),
                      sum(r.wrong for r in got.values()), dict(sorted(counters.items())),
                      record.calls)


@dataclass(frozen=True)
class Summary:
    min: float
    max: float
    median: float
    mean: float
    std: float          # sample standard deviation (0 for a single job)

    @classmethod
    def of(cls, values: list[float]) -> "Summary":
        if not values:
            raise ValueError("bench: statistics of no jobs")
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(min(values), max(values), statistics.median(values),
                   statistics.fmean(values), std)


@dataclass
class Result:
    """The timed jobs of one algorithm at one size (one row of the JSON `results`): `jobs`
    holds each timed job's time per call (ns), `per_job` the calls each job made, `wrong`
    the elements that came out wrong in every job (module doc), `dtype` the benchmark's."""

    algo: str
    size_bytes: int
    workers: int
    jobs: list[int] = field(default_factory=list)
    wrong: int = 0                                             # every job, warmup included
    counters: Counter[str] = field(default_factory=Counter)    # summed over every job
    calls: int = 0                                             # every job, warmup included
    per_job: int = 1
    dtype: str = "int32"

    def add(self, job: Record) -> None:
        self.wrong += job.wrong
        self.counters.update(job.counters)
        self.calls += job.calls
        self.per_job = job.calls
        if not job.warmup:
            self.jobs.append(job.per_call_ns)

    @property
    def verified(self) -> bool:
        return self.wrong == 0

    @property
    def type_redop(self) -> tuple[str, str]:
        """nccl-tests' type of the row's elements and its reduction (module doc)."""
        return LINK_TYPE if self.algo == LINK else RTT_TYPE if self.algo == RTT \
            else (self.dtype, "sum")

    @property
    def type(self) -> str:
        return self.type_redop[0]

    @property
    def redop(self) -> str:
        return self.type_redop[1]

    @property
    def count(self) -> int:
        """Elements of `type` one call moves per rank."""
        return self.moved_bytes // np.dtype(self.type).itemsize

    @property
    def rxe(self) -> dict[str, int]:
        """The rxe hw_counters that moved, all ranks, all jobs (warmup included)."""
        return {k: v for k, v in sorted(self.counters.items())
                if not k.startswith(CPU) and k not in (SPINE, LATENCY)}

    @property
    def spine_bytes_per_call(self) -> float | None:
        """Bytes over the ToR-spine links per job (None: not a two-tier fabric)."""
        return self.counters[SPINE] / self.calls if SPINE in self.counters else None

    @property
    def latency_us(self) -> float | None:
        """Calls in flight: a call's mean latency from its submission to its completion,
        every rank and job (None: the calls ran one at a time, latency = time per call)."""
        if LATENCY not in self.counters or not self.calls:
            return None
        return self.counters[LATENCY] / (self.calls * self.workers) / 1e3

    @property
    def vm_cpu(self) -> dict[str, float]:
        """Share of the lab's CPU time by state while jobs ran (timed parts only)."""
        ticks = {k[len(CPU):]: v for k, v in self.counters.items() if k.startswith(CPU) and v}
        total = sum(ticks.values())
        return {k: v / total for k, v in sorted(ticks.items(), key=lambda kv: -kv[1])}

    @property
    def moved_bytes(self) -> int:
        """What one call moves per rank: the row's size, but RTT_BYTES for the rtt column."""
        return RTT_BYTES if self.algo == RTT else self.size_bytes

    def job_lines(self) -> list[str]:
        """One SwitchML allreduce_benchmark line per timed job (its time per call)."""
        return [f"Job(s) #{i}# finished. Duration: #{ns}# ns Goodput: "
                f"#{gbps(self.moved_bytes, ns):.4f}# Gbps." for i, ns in enumerate(self.jobs)]

    @property
    def median_ns(self) -> float:
        return statistics.median(self.jobs)

    @property
    def algbw_gbps(self) -> float:
        return gbps(self.moved_bytes, self.median_ns)

    @property
    def busbw_gbps(self) -> float:
        n = self.workers
        return self.algbw_gbps if self.algo == LINK else self.algbw_gbps * 2 * (n - 1) / n

    @property
    def median_us(self) -> float:
        return self.median_ns / 1e3

    def summary_lines(self) -> list[str]:
        """Min/Max/Median/Mean/Std dev of the durations, and the goodput they mean."""
        s = Summary.of([float(ns) for ns in self.jobs])
        calls = f" of {self.per_job} calls" if self.per_job > 1 else ""
        failed = "" if self.verified else f", VERIFICATION FAILED: #wrong {self.wrong}"
        lines = [f"{self.algo} {format_size(self.size_bytes)} ({len(self.jobs)} jobs{calls}, "
                 f"{self.workers} workers{failed}):"]
        for name, ns in (("Min", s.min), ("Max", s.max), ("Median", s.median),
                         ("Mean", s.mean)):
            lines.append(f"  {name}: #{ns:.0f}# ns Goodput: #{gbps(self.moved_bytes, ns):.4f}# "
                         f"Gbps.")
        lines.append(f"  Std dev: #{s.std:.0f}# ns")
        if self.latency_us is not None:
            lines.append(f"  calls in flight: a call's mean latency {self.latency_us:.1f} us "
                         f"(all jobs and ranks); the times above are the stream's per call")
        if self.rxe:
            lines.append("  rxe counters, all ranks, warmup included: " + " ".join(
                f"{k}={v}" for k, v in self.rxe.items()))
        if self.vm_cpu:
            lines.append("  lab CPU while timed: " + " ".join(
                f"{k} {share:.0%}" for k, share in self.vm_cpu.items()))
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"algo": self.algo, "size_bytes": self.size_bytes, "count": self.count,
                "type": self.type, "redop": self.redop, "jobs": list(self.jobs),
                "calls_per_job": self.per_job,
                "median_ns": self.median_ns, "algbw_gbps": self.algbw_gbps,
                "busbw_gbps": self.busbw_gbps, "algbw_GBps": gigabytes(self.algbw_gbps),
                "busbw_GBps": gigabytes(self.busbw_gbps), "wrong": self.wrong,
                "verified": self.verified,
                "rxe": self.rxe, "vm_cpu": self.vm_cpu,
                "spine_bytes_per_call": self.spine_bytes_per_call,
                "latency_us": self.latency_us}


def _find(results: list[Result], algo: str, size: int) -> Result | None:
    return next((r for r in results if r.algo == algo and r.size_bytes == size), None)


def _ratio(a: Result | None, b: Result | None) -> float | None:
    if a is None or b is None or not b.algbw_gbps:
        return None
    return a.algbw_gbps / b.algbw_gbps


def _per_round(switch: Result | None, other: Result | None) -> list[float] | None:
    """switch's algbw over `other`'s, round by round: job i of both ran back to back in
    round i, so a slow spell of the lab hits both sides of each ratio alike."""
    if switch is None or other is None or len(switch.jobs) != len(other.jobs):
        return None
    return [theirs / ours for ours, theirs in zip(switch.jobs, other.jobs)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3), inclusive method; one value is all three."""
    if len(values) == 1:
        return (values[0],) * 3
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _rtts(a: Result | None, rtt: Result | None) -> float | None:
    """a's median time per call in RC round trips (rtt's median), or None."""
    if a is None or rtt is None or not rtt.median_ns:
        return None
    return a.median_ns / rtt.median_ns


def ratios(results: list[Result]) -> list[dict[str, Any]]:
    """Per size: in-network over ring, over the link and (float32) per-block over per-call
    quantization (`SWITCH_PER_CALL`), in algbw of the medians (None where one of them was
    not measured), the same ratios round by round, and each algorithm's time per call in
    RC round trips (None without the rtt column)."""
    sizes = sorted({r.size_bytes for r in results})
    out = []
    for size in sizes:
        switch = _find(results, "switch", size)
        ring, link = _find(results, "ring", size), _find(results, LINK, size)
        per_call = _find(results, SWITCH_PER_CALL, size)
        rtt = _find(results, RTT, size)
        out.append({"size_bytes": size,
                    "switch_over_ring": _ratio(switch, ring),
                    "switch_over_link": _ratio(switch, link),
                    "switch_over_per_call": _ratio(switch, per_call),
                    "switch_rtts": _rtts(switch, rtt), "ring_rtts": _rtts(ring, rtt),
                    "per_round": {"switch_over_ring": _per_round(switch, ring),
                                  "switch_over_link": _per_round(switch, link),
                                  "switch_over_per_call": _per_round(switch, per_call)}})
    return out


def rtt_us(results: list[Result]) -> float | None:
    """The RC round trip: the median over every size's rtt jobs, in µs (None: not measured)."""
    times = [ns for r in results if r.algo == RTT for ns in r.jobs]
    return statistics.median(times) / 1e3 if times else None


def link_gbps(results: list[Result]) -> float | None:
    """The link rate B: the link's algbw at the largest size measured."""
    links = [r for r in results if r.algo == LINK]
    return max(links, key=lambda r: r.size_bytes).algbw_gbps if links else None


def document(meta: dict[str, Any], results: list[Result]) -> dict[str, Any]:
    return {"meta": meta, "results": [r.to_json() for r in results],
            "link_gbps": link_gbps(results), "rtt_us": rtt_us(results),
            "ratios": ratios(results)}


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def spine_lines(results: list[Result], algos: list[str]) -> list[str]:
    """On a two-tier fabric: per size, each column's bytes over the ToR-spine links per call
    and ring/switch, their ratio (nothing when no result has the figure)."""
    spine = [r for r in results if r.spine_bytes_per_call is not None]
    if not spine:
        return []
    out = ["Bytes over the ToR-spine links per call (both directions, all links):"]
    for size in sorted({r.size_bytes for r in spine}):
        per = {a: r.spine_bytes_per_call for a in algos for r in [_find(spine, a, size)] if r}
        ratio = (f"  ring/switch {per['ring'] / per['switch']:.2f}"
                 if per.get("switch") and "ring" in per else "")
        out.append(f"{format_size(size):>9}" + "".join(f"  {a} {v:,.0f}" for a, v in per.items())
                   + ratio)
    return out


def table(results: list[Result]) -> list[str]:
    """Per size: every column's algbw and busbw, then the two ratios."""
    algos = list(dict.fromkeys(r.algo for r in results if r.algo != RTT))
    head = f"{'size':>9}" + "".join(f"{a + ' algbw':>14}{a + ' busbw':>14}" for a in algos)
    lines = [head + f"{'switch/ring':>13}{'switch/link':>13}   (Gbit/s)"]
    per_size = ratios(results)
    for ratio in per_size:
        size = ratio["size_bytes"]
        row = f"{format_size(size):>9}"
        for a in algos:
            r = _find(results, a, size)
            row += f"{_fmt(r and r.algbw_gbps, '.4f'):>14}{_fmt(r and r.busbw_gbps, '.4f'):>14}"
        row += f"{_fmt(ratio['switch_over_ring'], '.3f'):>13}"
        row += f"{_fmt(ratio['switch_over_link'], '.3f'):>13}"
        lines.append(row)
    lines += spine_lines(results, algos)
    paired = [(r["size_bytes"], name, values) for r in per_size
              for name, values in r["per_round"].items() if values]
    if paired:
        lines.append("Round by round (each round ran its jobs back to back): median "
                     "[quartiles]")
        for size, name, values in paired:
            q1, q2, q3 = quartiles(values)
            lines.append(f"{format_size(size):>9}  {name.replace('_over_', '/'):<16}"
                         f"{q2:.3f} [{q1:.3f}, {q3:.3f}]  over {len(values)} rounds")
    return lines


def latency_table(results: list[Result]) -> list[str]:
    """nccl-tests style, per size: elements, their type and the reduction, the link's time
    per call (µs), each algorithm's time per call (µs), algbw and busbw in GB/s (nccl-tests'
    unit) and #wrong, and with the rtt column the RC round trip (µs) and each algorithm's
    time per call in round trips."""
    algos = list(dict.fromkeys(r.algo for r in results if r.algo not in (LINK, RTT)))
    has_link = any(r.algo == LINK for r in results)
    has_rtt = any(r.algo == RTT for r in results)
    head = f"{'size':>9}{'count':>10}{'type':>9}{'redop':>6}"
    head += f"{'link us':>12}" if has_link else ""
    head += "".join(f"{a + ' us':>12}{'algbw':>10}{'busbw':>10}{'#wrong':>7}" for a in algos)
    if has_rtt:
        head += f"{'rtt us':>10}" + "".join(f"{a + '/rtt':>12}" for a in algos)
    lines = ["Time per call (median; us), rates in GB/s (nccl-tests' unit: Gbit/s / 8), "
             "#wrong: elements outside the bound, all ranks and jobs; rtt: one RC round "
             "trip of 8 B, rank 0 <-> rank 1, through the switch:", head]
    for size in sorted({r.size_bytes for r in results}):
        first = next((r for a in algos for r in [_find(results, a, size)] if r), None)
        row = f"{format_size(size):>9}{_fmt(first and first.count, 'd'):>10}"
        row += f"{first.type if first else '-':>9}{first.redop if first else '-':>6}"
        if has_link:
            link = _find(results, LINK, size)
            row += f"{_fmt(link and link.median_us, ',.0f'):>12}"
        for a in algos:
            r = _find(results, a, size)
            row += (f"{_fmt(r and r.median_us, ',.0f'):>12}"
                    f"{_fmt(r and gigabytes(r.algbw_gbps), '.4f'):>10}"
                    f"{_fmt(r and gigabytes(r.busbw_gbps), '.4f'):>10}"
                    f"{_fmt(r and r.wrong, 'd'):>7}")
        if has_rtt:
            rtt = _find(results, RTT, size)
            row += f"{_fmt(rtt and rtt.median_us, ',.0f'):>10}"
            row += "".join(f"{_fmt(_rtts(_find(results, a, size), rtt), '.1f'):>12}"
                           for a in algos)
        lines.append(row)
    return lines


META_KEYS = {"workers": int, "dtype": str, "mtu": int, "window": int, "msg_size": int,
             "kernel": str, "git_commit": (str, type(None)), "git_dirty": bool,
             "started_at": str}
RESULT_KEYS = {"algo": str, "size_bytes": int, "count": int, "type": str, "redop": str,
               "jobs": list, "median_ns": (int, float), "algbw_gbps": float,
               "busbw_gbps": float, "algbw_GBps": float, "busbw_GBps": float, "wrong": int,
               "verified": bool, "rxe": dict, "vm_cpu": dict}
RATIO_KEYS = {"size_bytes": int, "switch_over_ring": (float, type(None)),
              "switch_over_link": (float, type(None)),
              "switch_over_per_call": (float, type(None)), "switch_rtts": (float, type(None)),
              "ring_rtts": (float, type(None)), "per_round": dict}
PER_ROUND_KEYS = {"switch_over_ring": (list, type(None)), "switch_over_link": (list, type(None)),
                  "switch_over_per_call": (list, type(None))}


def _check(obj: Any, keys: dict[str, Any], where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"bench JSON: {where} is not an object")
    for key, kind in keys.items():
        if key not in obj:
            raise ValueError(f"bench JSON: {where} lacks {key!r}")
        if not isinstance(obj[key], kind) or isinstance(obj[key], bool) and kind is not bool:
            raise ValueError(f"bench JSON: {where}.{key} = {obj[key]!r} has the wrong type")


def validate(doc: Any) -> None:
    """Raise ValueError unless `doc` has the shape `document` writes."""
    _check(doc, {"meta": dict, "results": list, "link_gbps": (float, type(None)),
                 "rtt_us": (float, type(None)), "ratios": list}, "the document")
    _check(doc["meta"], META_KEYS, "meta")
    for i, r in enumerate(doc["results"]):
        _check(r, RESULT_KEYS, f"results[{i}]")
        if not r["jobs"] or not all(isinstance(ns, int) and ns > 0 for ns in r["jobs"]):
            raise ValueError(f"bench JSON: results[{i}].jobs must be positive ns: {r['jobs']}")
        if r["verified"] != (r["wrong"] == 0):
            raise ValueError(f"bench JSON: results[{i}]: verified {r['verified']} with "
                             f"#wrong {r['wrong']}")
    for i, r in enumerate(doc["ratios"]):
        _check(r, RATIO_KEYS, f"ratios[{i}]")
        _check(r["per_round"], PER_ROUND_KEYS, f"ratios[{i}].per_round")
