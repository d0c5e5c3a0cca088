"""The lab's switch-restart job (allreduce_worker.py survive) and its checks: what the switch
restart tests of tests/lab/test_faults.py and the aggregator's of test_aggregator_lab.py share."""
from __future__ import annotations

import io
import json
import re
import statistics
import threading
from pathlib import Path
from typing import Any, Callable

from flowctl.plan import FlowConfig
from netreduce.away import STALL_PROBE
from netreduce.tools.launch import LaunchResult
from tests.lab.switchruns import STRUCTURAL_DROPS, data_packets, meta_packets
from tests.lab.workers import lines, run_worker, why


class Cues(io.StringIO):
    """Output sink that sets `seen[marker]` once a line containing it was written."""

    def __init__(self, *markers: str) -> None:
        super().__init__()
        self.seen = {m: threading.Event() for m in markers}

    def write(self, s: str) -> int:
        for marker, event in self.seen.items():
            if marker in s:
                event.set()
        return super().write(s)


def survive_job(tmp_path: Path, restart: Callable[[], float], *args: str,
                n: int = 4) -> tuple[LaunchResult, list[float]]:
    """allreduce_worker.py survive (see there) as n ranks; `restart()` (returns the
    seconds it took) during its big call and again between calls."""
    cue = tmp_path / "cue"
    out = Cues("RESTART DURING CALL", "RESTART WHILE IDLE")
    outcome: list[LaunchResult] = []
    job = threading.Thread(target=lambda: outcome.append(run_worker(
        n, "survive", "--until", str(cue), *args, timeout=1800, out=out, grace=120)))
    job.start()
    took = []
    try:
        for marker in out.seen:
            assert out.seen[marker].wait(900), out.getvalue()[-5000:]
            took.append(restart())
        Path(f"{cue}.idle").touch()
    finally:
        Path(f"{cue}.idle").touch()
        job.join(timeout=1800)
    (result,) = outcome
    return result, took


def check_survived(result: LaunchResult, n: int, calls: int, size: int,
                   exact: bool = True) -> dict[str, Any]:
    """Every rank exact on every call (the worker exits otherwise), alike; two fallbacks
    and two returns logged once each by rank 0 and counted alike; the first fallback at
    the big call; the last calls through the switch, whose counters show (`exact`: one
    switch, no loss inside it) exactly the packets of the calls since the ring was
    registered the second time, with the "inc" ring's knobs rank 0 printed."""
    assert result.ok, f"exit {result.exit_code}"
    routes, stats = [], []
    for r in range(n):
        assert lines(result, r, "OK survive"), why(result, r)
        routes.append([c.split()[1] for c in lines(result, r, "CALL ")])
        stats.append(json.loads(lines(result, r, "STATS ")[0]))
    assert routes == [routes[0]] * n and stats == [stats[0]] * n, (routes, stats)
    assert len(routes[0]) >= calls and routes[0][-3:] == ["switch"] * 3, routes[0]
    assert stats[0]["switch"]["fallbacks"] == 2 and stats[0]["switch"]["returns"] == 2, stats
    out = result.ranks[0].output
    fell = [line for line in out if "stopped aggregating ring" in line]
    back = [line for line in out if line.startswith("netreduce: back on the switch")]
    assert len(fell) == 2 and len(back) == 2, out
    (big,) = [int(c.split("#")[1]) for c in lines(result, 0, "RESTART DURING CALL ")]
    assert f"fallback 1 at call #{big}:" in fell[0], fell[0]
    assert routes[0][big] in ("switch", "ring")
    (raw,) = lines(result, 0, "SWITCH_RING ")
    ring_id, counters = raw.split(" ", 1)
    counters = json.loads(counters)
    assert f"ring {ring_id} registered" in back[1], (ring_id, back[1])
    last = len(routes[0]) - routes[0][::-1].index("ring")      # switch calls since then
    knobs = re.search(r"inc mtu=(\d+), msg_size=(\d+), window=(\d+)",
                      next(line for line in out if line.startswith("joined ")))
    assert knobs, out[:5]
    config = FlowConfig(mtu=int(knobs[1]), msg_size=int(knobs[2]), window=int(knobs[3]))
    p = (len(routes[0]) - last) * (meta_packets(n, config) + data_packets(size, n, config))
    if exact:
        assert counters["completed"] == p and counters["aggregated"] == n * p, (counters, p)
    else:
        assert counters["completed"] >= p and counters["aggregated"] >= n * p, (counters, p)
    for drop in STRUCTURAL_DROPS:
        assert counters[drop] == 0, counters
    return {"routes": routes[0], "stats": stats[0], "counters": counters, "fell": fell,
            "back": back}


#: a 4 MiB call over lab D's host ring against one through an aggregator, as measured in
#: one boot (docs/hardware.md: 474-492 against 333-341 ms): the time of the cut call's redo
RING_OVER_SWITCH = 1.5


def cut_call(seconds: list[float], cut: int, uncut: list[int]) -> tuple[float, float, str]:
    """Issue 42's done-when, "a restart mid-job costs at most one call's time": the cut
    call's time (`seconds[cut]`) and the median of the uncut calls of its size (indices
    `uncut`, the same run); returns (extra, bound, a line saying them). The cut call is
    noticed after STALL_PROBE s without progress and redone over the host ring: its extra
    is bounded by that detection and one host-ring call, RING_OVER_SWITCH times an uncut
    call's -- the slowest one's: under TCG on a shared machine calls of one size vary by
    +-30 %, and the cut call's redo is one of them."""
    median = statistics.median(seconds[i] for i in uncut)
    slowest = max(seconds[i] for i in uncut)
    extra = seconds[cut] - median
    return extra, STALL_PROBE + RING_OVER_SWITCH * slowest, (
        f"cut call #{cut} {seconds[cut]:.2f} s, median {median:.2f} s of {len(uncut)} "
        f"uncut (slowest {slowest:.2f} s): {extra:+.2f} s ({extra / median:.2f} medians)")
