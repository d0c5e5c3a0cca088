"""In-network allreduce through a one-armed aggregator on a plain L2 network (issue 42): the
hosts on a kernel bridge, the aggregator a server with one port that each host's "inc" ring
is routed through (scripts/lab.sh --aggregators 1: 10.78.0.0/24 via 10.77.0.200, the ring on
NR_INC_ADDR). The hosts' verbs and rxe are stock; the aggregator's counters of the "inc"
ring prove the sums were formed there, numpy's the results (allreduce_worker.py). A test
for k aggregators (1: the single ones, 2: `k2` and k=2) splits every call over the first k
(netreduce/shards.py) of the lab's K: one boot with K = 2 runs them all (lab_suites.sh d).

    scripts/lab.sh --aggregators 2 -- python -m pytest -q -m lab tests/lab/test_aggregator_lab.py
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.lab.labhosts import host_loss
from tests.lab.labswitch import restart_aggregator
from tests.lab.survive import Cues, check_survived, cut_call, survive_job
from tests.lab.switchruns import (STRUCTURAL_DROPS, check_retransmissions_seen,
                                  check_switch_run, show_run)
from tests.lab.workers import lines, run_worker, why

pytestmark = pytest.mark.lab

SIZES = [1, 1000, 256, 2**20 + 1]          # elements; the odd ones make the calls in place
CASES = [1, 1000, 2**20 + 1, 2**22]        # 1 element .. 16 MiB: x int32, float32 = 8 cases
K = int(os.environ.get("NR_LAB_AGGREGATORS", "0"))


@pytest.fixture(autouse=True)
def aggregator_lab(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's k aggregators: the first k of the lab's NR_CONTROLLER and NR_INC_ADDR."""
    if K < 1:
        pytest.fail("this module needs the aggregator lab: scripts/lab.sh --aggregators 2")
    spec = getattr(request.node, "callspec", None)
    k = spec.params["k"] if spec and "k" in spec.params else 2 if "k2" in request.node.name \
        else 1
    if k > K:
        pytest.skip(f"needs {k} aggregators, this lab has {K}")
    for var in ("NR_CONTROLLER", "NR_INC_ADDR"):
        monkeypatch.setenv(var, ",".join(os.environ[var].split(",")[:k]))


@pytest.mark.parametrize("loss", ["0%", "1%"])
@pytest.mark.parametrize("k", [1, 2])
def test_every_case_is_exact_through_k_aggregators(
        k: int, loss: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42's done-when through k aggregators and unchanged user code (the lab's
    NR_CONTROLLER / NR_INC_ADDR): int32 and float32, 1 element to 16 MiB, in place (odd
    sizes) and out of place, exact (float32 within the bound) on every rank at `loss` on
    every host link; with k = 2 each aggregator carries half the bytes (comm.stats())."""
    with host_loss(loss):
        result = run_worker(4, "shards", "--sizes", ",".join(map(str, CASES)), timeout=1500)
    assert result.ok, f"exit {result.exit_code}"
    for r in range(4):
        assert lines(result, r, "OK shards"), why(result, r)
    times = lines(result, 0, "TIME ")
    with capsys.disabled():
        print(f"\n[k={k} aggregator(s), {loss} loss] " + "; ".join(times))
    stats = json.loads(lines(result, 0, "STATS ")[0])
    if k == 1:
        assert stats["calls"] == {"switch": 2 * len(CASES)}, stats
        return
    rows = stats["aggregators"]
    moved = [row["bytes"] for row in rows]
    assert sum(moved) == 2 * 4 * sum(CASES), rows            # int32 and float32, 4 bytes
    assert all(abs(b / sum(moved) - 0.5) < 0.02 for b in moved), moved
    assert all(row["fallbacks"] == 0 and row["ring_bytes"] == 0 for row in rows), rows
    # the aggregators' own counters: each completed about half the slots, no structural drop
    rings = json.loads(lines(result, 0, "AGG_RINGS ")[0])
    done = [ring["completed"] for ring in rings]
    assert all(abs(d / sum(done) - 0.5) < 0.05 for d in done), done
    assert all(ring[drop] == 0 for ring in rings for drop in STRUCTURAL_DROPS), rings
    with capsys.disabled():
        print(f"[k=2] bytes per aggregator {moved}, slots completed {done}")


def test_k2_an_aggregator_restarted_mid_job_costs_at_most_one_call(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Aggregator 1 restarted just before call 2 of a job of 4 MiB int32 calls over 2
    aggregators (the ranks wait 0.5 s for it): every call exact; aggregator 1 falls back
    once (its shard on its host ring) and returns, aggregator 0 never leaves; the cut call
    takes at most one host-ring call more than the median (survive.cut_call)."""
    out = Cues("RESTART DURING CALL")
    outcome: list = []
    job = threading.Thread(target=lambda: outcome.append(run_worker(
        4, "shards", "--sizes", "1", "--calls", "12", "--size", str(2**20), timeout=1500,
        out=out, grace=120)))
    job.start()
    try:
        assert out.seen["RESTART DURING CALL"].wait(900), out.getvalue()[-3000:]
        took = restart_aggregator(1)
    finally:
        job.join(timeout=1500)
    (result,) = outcome
    assert result.ok, f"exit {result.exit_code}"
    calls = [c.split() for c in lines(result, 0, "CALL ")]
    rows = json.loads(lines(result, 0, "STATS ")[0])["aggregators"]
    assert rows[0]["fallbacks"] == 0 and rows[1]["fallbacks"] == 1, rows
    assert rows[1]["returns"] == 1 and rows[1]["ring_bytes"] > 0, rows
    assert calls[-1][1] == "switch", calls
    extra, bound, said = cut_call([float(c[2]) for c in calls], 2,
                                   [i for i in range(len(calls)) if i != 2])
    with capsys.disabled():
        print(f"\n[k=2, aggregator 1 restarted ({took:.1f} s)] {said}; calls "
              f"{' '.join(f'{c[1]}:{c[2]}' for c in calls)}; stats "
              f"{[{k: v for k, v in r.items() if k != 'stats'} for r in rows]}")
    assert extra <= bound, said


def test_allreduce_through_a_one_armed_aggregator_matches_numpy(
        capsys: pytest.CaptureFixture[str]) -> None:
    """4 ranks, int32 and float32, 1 element to 4 MiB: exact (float32 within its bound),
    every contribution aggregated once in the aggregator."""
    result = run_worker(4, "switch", "--sizes", ",".join(map(str, SIZES)), timeout=900)
    counters = check_switch_run(result, 4, SIZES)
    show_run(capsys, "one-armed aggregator, no loss", result, counters)


def test_one_percent_loss_on_every_host_link_through_the_aggregator(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The same at 1 % loss on every host's link: go-back-N through the router heals it."""
    with host_loss("1%"):
        result = run_worker(4, "switch", "--sizes", str(SIZES[-1]), timeout=900)
    counters = check_switch_run(result, 4, SIZES[-1:])
    check_retransmissions_seen(counters)
    show_run(capsys, "one-armed aggregator, 1% loss", result, counters)


def test_an_aggregator_restarted_during_a_call_and_between_calls_costs_no_call(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: the aggregator restarted during a 4 MiB call and again between calls (the
    lab's supervisor, kind agg:0): 4 ranks, 16 auto calls of 1 MiB int32, every call exact
    on every rank; two fallbacks to the host ring and two returns, the last calls through
    the aggregator again; each cut call (the 4 MiB one, the first after the restart between
    calls) takes at most its detection and one host-ring call of its size more than the
    median of its size (survive.cut_call; the 4 MiB one's: four 4 MiB calls before it)."""
    size, big, calls = 1 << 18, 1 << 20, 16
    t0 = time.monotonic()
    result, took = survive_job(tmp_path, lambda: restart_aggregator(0), "--size", str(size),
                               "--big", str(big), "--calls", str(calls), "--gil", "0",
                               "--reference", "4")
    got = check_survived(result, 4, calls, size)
    seconds = [float(c.split()[2]) for c in lines(result, 0, "CALL ")]
    (during,) = [int(c.split("#")[1]) for c in lines(result, 0, "RESTART DURING CALL ")]
    (idle,) = [int(c.split("#")[1]) + 1 for c in lines(result, 0, "RESTART WHILE IDLE ")]
    cut = {k: cut_call(seconds, k, [i for i in uncut if i not in (during, idle)])
           for k, uncut in ((during, range(4)), (idle, range(4, len(seconds))))}
    with capsys.disabled():
        print(f"\n[one-armed aggregator restarted twice (took {took[0]:.1f}, {took[1]:.1f} s)] "
              f"{calls} calls exact, job {time.monotonic() - t0:.0f} s; "
              f"{'; '.join(said for _, _, said in cut.values())}; routes "
              f"{''.join(a[0] for a in got['routes'])}; stats {got['stats']}")
    for extra, bound, said in cut.values():
        assert extra <= bound, said
