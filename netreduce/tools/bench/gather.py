"""What a bench run's launches print, gathered: `RankLines` joins the ranks' records into
jobs and results, `meta` describes the run for the JSON document."""
from __future__ import annotations

import io
import os
import platform
import re
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

from netreduce.tools.bench.runplan import BenchPlan, format_size
from netreduce.tools.bench.progressbar import Progress
from netreduce.tools.bench.results import Collector, Record, Result

ROOT = Path(__file__).resolve().parents[3]
_RANK_LINE = re.compile(r"\[rank (\d+)\] (.*)")


class RankLines(io.TextIOBase):
    """What netreduce.tools.launch writes ("[rank I] line"): records are joined into jobs, shown
    and collected; anything else goes to stderr as it came."""

    def __init__(self, plan: BenchPlan, progress: Progress, label: str = "") -> None:
        self.plan, self.progress, self.label = plan, progress, label
        self.collector = Collector(plan.workers)
        self.results = {(algo, size): Result(algo, size, plan.workers, dtype=plan.dtype)
                        for size in plan.sizes for algo in plan.columns}
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        return len(text)

    def _line(self, line: str) -> None:
        m = _RANK_LINE.fullmatch(line)
        record = Record.parse(m.group(2)) if m else None
        if m is None or record is None:
            self.progress.print(self.label + line, err=True)
            return
        job = self.collector.add(int(m.group(1)), record)
        if job is None:
            return
        result = self.results[(job.algo, job.size)]
        result.add(job)
        self.progress.advance(f"{self.label}{format_size(job.size)} round {job.job}")
        if len(result.jobs) == self.plan.jobs:
            self.progress.print(f"{self.label}== {job.algo}, {format_size(job.size)} "
                                f"{self.plan.dtype}, {self.plan.workers} workers ==")
            for line in result.job_lines() + result.summary_lines():
                self.progress.print(self.label + line)

    def measured(self) -> list[Result]:
        return [r for r in self.results.values() if r.jobs]


def _git(*args: str) -> str | None:
    """`git args` in this checkout, its stdout; None if git is missing or fails."""
    try:
        p = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def meta(plan: BenchPlan, started_at: datetime) -> dict[str, Any]:
    return {"workers": plan.workers, "dtype": plan.dtype, "mtu": plan.mtu,
            "window": plan.window, "msg_size": plan.msg_size,
            "ack_timeout": plan.ack_timeout, "kernel": platform.release(),
            "git_commit": _git("rev-parse", "HEAD"),
            "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "started_at": started_at.isoformat(timespec="seconds"),
            "sizes": list(plan.sizes), "algos": list(plan.algos), "jobs": plan.jobs,
            "warmup": plan.warmup, "seed": plan.seed, "in_flight": plan.in_flight,
            "lab": {k: v for k, v in os.environ.items() if k.startswith("NR_")}}
