"""In-network allreduce through a one-armed aggregator on a plain L2 network (issue 42): the
hosts on a kernel bridge, the aggregator a server with one port that each host's "inc" ring
is routed through (scripts/lab.sh --aggregators 1: 10.78.0.0/24 via 10.77.0.200, the ring on
NR_INC_ADDR). The hosts' verbs and rxe are stock; the aggregator's counters of the "inc"
ring prove the sums were formed there, numpy's the results (allreduce_worker.py).

    scripts/lab.sh --aggregators 1 -- python -m pytest -q -m lab tests/lab/test_aggregator_lab.py
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.lab.labhosts import host_loss
from tests.lab.labswitch import restart_aggregator
from tests.lab.survive import check_survived, survive_job
from tests.lab.switchruns import check_retransmissions_seen, check_switch_run, show_run
from tests.lab.workers import run_worker

pytestmark = pytest.mark.lab

SIZES = [1, 1000, 256, 2**20 + 1]          # elements; the odd ones make the calls in place


@pytest.fixture(autouse=True)
def aggregator_lab() -> None:
    if int(os.environ.get("NR_LAB_AGGREGATORS", "0")) < 1:
        pytest.fail("this module needs the aggregator lab: scripts/lab.sh --aggregators 1")


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
    the aggregator again."""
    size, calls = 1 << 18, 16
    t0 = time.monotonic()
    result, took = survive_job(tmp_path, lambda: restart_aggregator(0), "--size", str(size),
                               "--big", str(1 << 20), "--calls", str(calls), "--gil", "0")
    got = check_survived(result, 4, calls, size)
    with capsys.disabled():
        print(f"\n[one-armed aggregator restarted twice (took {took[0]:.1f}, {took[1]:.1f} s)] "
              f"{calls} calls exact, job {time.monotonic() - t0:.0f} s; routes "
              f"{''.join(a[0] for a in got['routes'])}; stats {got['stats']}")
