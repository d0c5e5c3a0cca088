"""Transport faults in the lab (issue 40, docs/transport-faults.md): a rank's QPs moved to
ERROR mid-call on the switch path ("inc") and on the host ring; a host's link dark for
20 s (tc netem 100 % loss on all it sends: data and ACKs) in the middle of 45 calls of 4 MiB with a finite
retry budget. Every call exact on every rank (the worker exits otherwise); the recovery
counted alike and named in rank 0's log. Figures are printed (docs/transport-faults.md).

    scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_transport_faults.py
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from netreduce.tools.launch import LaunchResult, launch
from tests.lab.labhosts import run_in_host
from tests.lab.survive import Cues
from tests.lab.workers import lines, next_port, tree_env

pytestmark = pytest.mark.lab

WORKER = Path(__file__).with_name("fault_worker.py")
N = 4


def figure(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n[transport-faults] {text}")


def run_job(*args: str, out: Cues | None = None, retry_cnt: int | None = None,
            timeout: float = 900) -> LaunchResult:
    env = tree_env()
    if retry_cnt is not None:
        env["NR_RETRY_CNT"] = str(retry_cnt)
    return launch([sys.executable, str(WORKER), *args], N, port=next_port(),
                  timeout=timeout, grace=60, out=out, env=env)


def checked(result: LaunchResult, calls: int) -> tuple[list[str], dict, list[str]]:
    """Every rank printed OK after at least `calls` exact calls, the same routes and
    counts; returns the routes, the stats and rank 0's output."""
    assert result.ok, (result.exit_code, [r.output[-30:] for r in result.ranks])
    routes, stats = [], []
    for r in range(N):
        assert lines(result, r, "OK faults"), result.ranks[r].output[-40:]
        routes.append([c.split()[1] for c in lines(result, r, "CALL ")])
        stats.append(json.loads(lines(result, r, "STATS ")[0]))
    assert len(routes[0]) >= calls and routes == [routes[0]] * N, routes
    counts = [{k: v for k, v in s["transport"].items() if k != "ms_lost"} for s in stats]
    assert counts == [counts[0]] * N, stats
    return routes[0], stats[0], result.ranks[0].output


@pytest.mark.parametrize("ring", ["inc", "ring"])
def test_a_qp_moved_to_error_mid_call_costs_one_call(
        ring: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 2 moves its "inc" QPs (through the switch, algo auto) or its host-ring QPs (no
    switch) to ERROR 0.05 s into call 2 of 12 of 1 MiB: every call exact; one fault settled;
    "inc": calls go on until the job is back on the switch (after the 5 s back-off)."""
    calls = 12
    args = ["--calls", str(calls), "--size", str(1 << 18), "--kill", ring, "--at", "2",
            "--delay", "0.05"]
    args += ["--no-switch"] if ring == "ring" else ["--until-switch", "120"]
    t0 = time.monotonic()
    routes, stats, out = checked(run_job(*args), calls)
    took = time.monotonic() - t0
    t = stats["transport"]
    assert t["faults"] == 1 and t["redone"] == 1, stats
    named = [line for line in out if "transport fault on '" + ring + "'" in line]
    assert named, out[-40:]
    if ring == "inc":
        assert stats["switch"]["fallbacks"] == 1 and stats["switch"]["returns"] == 1, stats
        assert routes[-1] == "switch" and t["rebuilds"] == 1, (routes, stats)
    else:
        assert t["rebuilds"] == 1 and set(routes) == {"ring"}, (routes, stats)
    secs = [float(c.split()[2]) for c in lines_of(out, "CALL ")]
    figure(capsys, f"{ring}: QP to ERROR in call 2: routes {''.join(r[0] for r in routes)}, "
                   f"call 2 {secs[2]:.2f} s vs median {sorted(secs)[len(secs) // 2]:.2f} s; "
                   f"transport {t}; job {took:.0f} s")


def lines_of(output: list[str], prefix: str) -> list[str]:
    return [line[len(prefix):] for line in output if line.startswith(prefix)]


def test_a_host_link_dark_for_20_s_mid_job_costs_no_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """retry_cnt 6 (a NIC's budget: 7 x 67 ms on the host ring): host 2's link drops every
    frame it sends for 20 s from call 10 of 45 of 4 MiB (algo auto, through the switch):
    every call exact on every rank, the fault and its recovery named in rank 0's log, the
    job back on the switch by the end."""
    calls = 45
    out = Cues("AT CALL 10")
    outcome: list[LaunchResult] = []
    job = threading.Thread(target=lambda: outcome.append(run_job(
        "--calls", str(calls), "--until-switch", "600", out=out, retry_cnt=6,
        timeout=1500)))
    job.start()
    t0 = time.monotonic()
    try:
        assert out.seen["AT CALL 10"].wait(600), out.getvalue()[-3000:]
        time.sleep(0.5)
        run_in_host(2, "tc", "qdisc", "add", "dev", "nr0", "root", "netem", "loss", "100%")
        t0 = time.monotonic()
        time.sleep(20)
    finally:
        run_in_host(2, "tc", "qdisc", "del", "dev", "nr0", "root", check=False)
        dark = time.monotonic() - t0
        job.join(timeout=1500)
    (result,) = outcome
    routes, stats, out0 = checked(result, calls)
    t = stats["transport"]
    assert t["faults"] >= 1, stats
    assert routes[-1] == "switch", routes
    named = [line for line in out0 if "transport fault on '" in line]
    assert named, out0[-60:]
    secs = [float(c.split()[2]) for c in lines_of(out0, "CALL ")]
    figure(capsys, f"link dark {dark:.1f} s: routes {''.join(r[0] for r in routes)}, slowest "
                   f"call {max(secs):.1f} s, transport {t}, switch {stats['switch']}; "
                   f"rank 0 named: {named[0][:300]}")
