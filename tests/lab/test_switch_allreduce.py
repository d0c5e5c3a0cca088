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
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from flowctl.plan import FlowConfig, MessagePlan
from netreduce.algorithms.switch import INLINE_BYTES
from netreduce.meta import RECORD_STRIDE
from netreduce.tools.launch import LaunchResult
from tests.lab.labhosts import HOSTS, ROOT, run_in_host, switch_counters
from tests.lab.test_allreduce import in_background, lines, run_worker

pytestmark = pytest.mark.lab

CONFIG = FlowConfig()                 # what netreduce.init uses by default
BIG = 4 * 2**20                       # int32 elements: 16 MiB
STRUCTURAL_DROPS = ("drop_wrong_port", "drop_bad_opcode", "drop_bad_length", "drop_overrun",
                    "drop_mismatch", "drop_bad_ipcsum", "drop_fragment", "drop_bad_icrc")


def packets(count: int, config: FlowConfig = CONFIG) -> int:
    """RoCE packets of one switch allreduce of `count` 4-byte elements, per connection."""
    return sum(-(-m.length // config.mtu) for m in MessagePlan(4 * count, config.msg_size))


def meta_packets(n: int, config: FlowConfig = CONFIG) -> int:
    """Packets of one call's metadata exchange through the switch (a bank of n records)."""
    return packets(n * RECORD_STRIDE // 4, config)


def data_packets(count: int, n: int, config: FlowConfig = CONFIG, dtype: str = "int32") -> int:
    """Packets of one call's data: `count` int32 words, then the seal of n words; none
    when the call travels in its records (at most INLINE_BYTES of `dtype` data)."""
    if count * np.dtype(dtype).itemsize <= INLINE_BYTES:     # "bfloat16": netreduce loads ml_dtypes
        return 0
    return packets(count + n, config)


def expected_packets(sizes: list[int], n: int, config: FlowConfig = CONFIG,
                     dtypes: tuple[str, ...] = ("int32", "float32")) -> int:
    """What allreduce_worker.py `switch` sends per connection: a call of each of `dtypes`
    at every size, the refused call (its metadata only), one 5-element int32 call (in its
    records); each call's metadata first."""
    calls = len(dtypes) * len(sizes) + 2
    return (calls * meta_packets(n, config)
            + sum(data_packets(c, n, config, d) for c in sizes for d in dtypes)
            + data_packets(5, n, config))


def check_switch_run(result: LaunchResult, n: int, sizes: list[int],
                     config: FlowConfig = CONFIG,
                     dtypes: tuple[str, ...] = ("int32", "float32"),
                     queue_drops: bool = False) -> dict[str, int]:
    """Every rank passed; the overflow refusal read alike everywhere; the ring's counters
    (the "inc" ring's knobs: `config`; a call of each of `dtypes` per size) show exactly n
    contributions per packet, every slot emitted, no structural drop. `queue_drops`: the
    target may lose a result replica inside itself before counting it (BMv2's egress queues
    overflow under go-back-N storms), so `results_sent` may fall short of n per packet by
    what the retransmissions it served made up."""
    assert result.ok, f"exit {result.exit_code}"
    errors = set()
    for r in range(n):
        assert lines(result, r, "OK switch"), result.ranks[r].output
        (err,) = lines(result, r, "ERROR ")
        errors.add(err)
    (err,) = errors
    assert "the int32 sum may overflow" in err and "conservative" in err, err
    (raw,) = lines(result, 0, "SWITCH_RING ")
    counters = json.loads(raw)
    p = expected_packets(sizes, n, config, dtypes)
    # the other ranks may already have sent the next call's metadata, rank 0 not
    assert n * p <= counters["aggregated"] <= n * p + (n - 1) * meta_packets(n, config), \
        (counters, p)
    assert counters["completed"] == p, (counters, p)
    if queue_drops:
        assert counters["results_sent"] <= n * p \
            <= counters["results_sent"] + counters["retransmits_served"], (counters, p)
    else:
        assert counters["results_sent"] == n * p, (counters, p)
    for drop in STRUCTURAL_DROPS:
        assert counters[drop] == 0, counters
    return counters


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


@contextmanager
def host_loss(loss: str) -> Iterator[None]:
    """`loss` (tc netem, e.g. "1%") on every host's lab link, removed afterwards whatever
    happens; "0%" changes nothing."""
    if loss == "0%":
        yield
        return
    try:
        for i in range(HOSTS):
            run_in_host(i, "tc", "qdisc", "add", "dev", "nr0", "root", "netem", "loss", loss)
        yield
    finally:
        for i in range(HOSTS):
            run_in_host(i, "tc", "qdisc", "del", "dev", "nr0", "root", check=False)


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


def check_retransmissions_seen(counters: dict[str, int]) -> None:
    """The switch saw retransmissions: served from emitted slots, or dropped as
    duplicates/stale."""
    assert counters["retransmits_served"] + counters["drop_duplicate"] \
        + counters["drop_stale"] > 0, counters


def show_run(capsys: pytest.CaptureFixture[str], label: str, result: LaunchResult,
             counters: dict[str, int]) -> None:
    """The ring's counters and rank 0's TIME lines, printed past pytest's capture."""
    with capsys.disabled():
        print(f"\n[{label}] counters {counters}")
        for t in lines(result, 0, "TIME "):
            print(f"[{label}] {t}")


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
                                     "switch": {"fallbacks": 0, "returns": 0, "recovered": 0}}, stats
        warned = [line for line in output if "runs over the host ring although the switch is "
                  "registered: the data holds NaN or infinity" in line]
        assert len(warned) == (1 if r == 0 else 0), output


RECUT_CALLS = 3


def run_recut(n: int, victim: int, **kw: Any) -> LaunchResult:
    """allreduce_worker.py recut: RECUT_CALLS calls of 5000 int32, `victim` re-cutting its
    stream between them."""
    return run_worker(n, "recut", "--victim", str(victim), "--calls", str(RECUT_CALLS),
                      "--size", "5000", **kw)


def check_recut_run(result: LaunchResult, n: int, victim: int) -> dict:
    """`run_recut`: every call exact; the victim's successor skipped one empty arrival per
    re-cut, nobody else any; the switch counted each re-cut and forwarded each empty packet
    on the victim's connection only, and dropped no contribution."""
    assert result.ok, f"exit {result.exit_code}"
    recuts = RECUT_CALLS - 1
    for r in range(n):
        assert lines(result, r, "OK recut"), result.ranks[r].output
        (empty,) = lines(result, r, "EMPTY_RESENDS ")
        assert json.loads(empty)["count"] == (recuts if r == (victim + 1) % n else 0), \
            result.ranks[r].output
    (ring,) = lines(result, 0, "SWITCH_RING ")
    (conns,) = lines(result, 0, "SWITCH_CONNS ")
    ring, conns = json.loads(ring), json.loads(conns)
    assert ring["empties_forwarded"] == recuts, ring
    want = [recuts if r == victim else 0 for r in range(n)]
    assert [c["recuts"] for c in conns] == want, conns
    assert [c["empties_forwarded"] for c in conns] == want, conns
    assert all(ring[d] == 0 for d in STRUCTURAL_DROPS), ring
    return ring


def test_a_re_cut_stream_is_followed(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 sends, between calls, what rxe's retry race sends (docs/roce.md): its last
    message again as an empty WRITE WITH IMMEDIATE, every later packet one PSN late. The
    switch passes it on and follows (rule 7a), rank 2 skips the empty arrival: all calls
    exact, counted on both sides."""
    ring = check_recut_run(run_recut(4, 1, timeout=600), 4, 1)
    with capsys.disabled():
        print(f"\n[recut] software switch: {RECUT_CALLS - 1} re-cuts of rank 1's stream "
              f"followed, {RECUT_CALLS} calls exact; ring {ring}")
