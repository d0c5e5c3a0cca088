"""In-network allreduce on real rxe through the switch (algo="switch"): one process per lab
host, started by netreduce.tools.launch running allreduce_worker.py; the switch's counters of
the registered "inc" ring prove the sums were formed in the switch.

Inside the lab:
    scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_switch_allreduce.py
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.lab.labhosts import ROOT, host_loss, switch_counters
from tests.lab.switchruns import (RECUT_CALLS, check_recut_run, check_retransmissions_seen,
                                  check_switch_run, run_recut, show_run)
from tests.lab.workers import in_background, lines, run_worker

pytestmark = pytest.mark.lab

BIG = 4 * 2**20                       # int32 elements: 16 MiB


@pytest.mark.parametrize("n", [2, 3, 4])
def test_in_network_allreduce_matches_numpy(n: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Sizes: 1 element, 1000 elements (4000 B, not a multiple of the MTU), 256 (1 KiB), and
    at 4 ranks 16 MiB, timed (int32 and float32: their goodput printed; `netreduce bench`
    compares the algorithms: docs/benchmarks.md)."""
    sizes = [1, 1000, 256] + ([BIG] if n == 4 else [])
    args = ["--sizes", ",".join(map(str, sizes)), "--timed", str(BIG) if n == 4 else "0"]
    result = run_worker(n, "switch", *args, timeout=900)
    counters = check_switch_run(result, n, sizes)
    if n == 4:
        times = lines(result, 0, "TIME ")
        assert len(times) == 2 and all("algo=switch" in t for t in times), times
        with capsys.disabled():
            print(f"\n[switch allreduce, no loss] counters {counters}")
            for t in times:
                print(f"[switch allreduce] {t}")


@pytest.fixture
def lossy_hosts() -> Iterator[None]:
    """1% loss on every host's lab link (see `host_loss`)."""
    with host_loss("1%"):
        yield


def test_in_network_allreduce_survives_one_percent_loss(lossy_hosts: None,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """4 ranks, 4 MiB int32 and float32 (+1 element) with 1% of every host's frames dropped: the
    results are right, every contribution still counted once, and the switch saw the
    retransmissions (served from emitted slots, or dropped as duplicates/stale). The odd
    count makes the calls in place."""
    sizes = [2**20 + 1]
    result = run_worker(4, "switch", "--sizes", str(sizes[0]), "--timed", str(sizes[0]),
                        timeout=900)
    counters = check_switch_run(result, 4, sizes)
    check_retransmissions_seen(counters)
    show_run(capsys, "switch allreduce, 1% loss", result, counters)


def test_ib_write_bw_passes_unchanged_while_a_ring_is_registered(tmp_path: Path) -> None:
    """perftest between h0 and h1 while the 'inc' ring of ranks on h0 and h1 is registered:
    it completes, and none of the ring's counters moved (its QPs are not the ring's)."""
    with in_background(2, "hold", until=tmp_path / "done", marker="REGISTERED ") as (watch,
                                                                                    outcome):
        (ring_id,) = re.findall(r"REGISTERED (\S+)", watch.getvalue())
        before = switch_counters()["rings"][ring_id]
        perf = subprocess.run([str(ROOT / "scripts" / "ib_write_bw_pair.sh"), "0", "1", "65536",
                               "300"], capture_output=True, text=True, timeout=300)
        after = switch_counters()["rings"][ring_id]
    assert perf.returncode == 0, perf.stdout + perf.stderr
    assert re.search(r"ib_write_bw h0->h1: [\d.]+ Gbit/s", perf.stdout), perf.stdout
    assert after == before
    (result,) = outcome
    assert result.ok and all(lines(result, r, "OK hold") for r in range(2)), watch.getvalue()


def test_floats_nan_under_auto_avg_and_16_bit_through_switch_and_ring() -> None:
    """Issue 22, one 4-rank job (allreduce_worker.py floats): algo="auto" with NaN and +inf
    in two ranks' data returns the ring's result on every rank (last_algo "ring", fallback
    "non-finite"; rank 0 warns once); a float32 sum over the switch mixing blocks of 1e-6
    and 1e4 within the per-block bound (and 2^-20 of each block's largest sum); op="avg" of
    float32/float16/bfloat16 and op="sum" of float16/bfloat16 over the switch and over the
    ring at 1000 elements (the out= path) and 65537 (in place, two messages), each within
    its bound; every rank counted the same routes."""
    sizes = [1000, 65537]
    result = run_worker(4, "floats", "--sizes", ",".join(map(str, sizes)), timeout=900)
    assert result.ok, f"exit {result.exit_code}"
    calls = 5 * len(sizes)                   # (op, dtype) pairs x sizes, per algorithm
    for r in range(4):
        output = result.ranks[r].output
        assert lines(result, r, "OK nan: auto ran the ring") and lines(result, r, "OK floats"), \
            output
        assert lines(result, r, "OK blocks: 1e-6 next to 1e4"), output
        (stats,) = lines(result, r, "STATS ")
        assert json.loads(stats) == {"calls": {"ring": calls + 2, "switch": calls + 1},
                                     "fallbacks": {"non-finite": 1},
                                     "switch": {"fallbacks": 0, "returns": 0, "recovered": 0},
                                     "transport": {"faults": 0, "rebuilds": 0, "redone": 0,
                                                   "ms_lost": 0}}, stats
        warned = [line for line in output if "runs over the host ring although the switch is "
                  "registered: the data holds NaN or infinity" in line]
        assert len(warned) == (1 if r == 0 else 0), output


def test_a_re_cut_stream_is_followed(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 sends, between calls, what rxe's retry race sends (docs/roce.md): its last
    message again as an empty WRITE WITH IMMEDIATE, every later packet one PSN late. The
    switch passes it on and follows (rule 7a), rank 2 skips the empty arrival: all calls
    exact, counted on both sides."""
    ring = check_recut_run(run_recut(4, 1, timeout=600), 4, 1)
    with capsys.disabled():
        print(f"\n[recut] software switch: {RECUT_CALLS - 1} re-cuts of rank 1's stream "
              f"followed, {RECUT_CALLS} calls exact; ring {ring}")
