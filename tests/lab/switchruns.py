"""What a lab job through the switch must show, from the worker's lines and the switch's
counters of its "inc" ring: how many RoCE packets a call takes (flowctl's message plan at
the FlowConfig's sizes), every contribution counted once, every slot emitted, no structural
drop; the knobs init() fitted the ring to; and the re-cut stream run (rxe's retry race,
docs/roce.md)."""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from flowctl.plan import FlowConfig, MessagePlan
from netreduce.algorithms.switch import IN_PLACE_BYTES, INLINE_BYTES
from netreduce.meta import RECORD_STRIDE
from netreduce.tools.launch import LaunchResult
from tests.lab.workers import lines, run_worker

CONFIG = FlowConfig()                 # what netreduce.init uses by default
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
    in_place = any(4 * size >= IN_PLACE_BYTES for size in sizes) and "int32" in dtypes
    for r in range(n):              # int32 inputs of IN_PLACE_BYTES and up: sent in place
        (raw,) = lines(result, r, "INPLACE ")
        cache = json.loads(raw)
        assert cache["failures"] == 0 and (cache["misses"] >= 1) == in_place, (r, cache)
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


RECUT_CALLS = 3     # calls of the re-cut run: a re-cut between each two


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


def inc_config(result: LaunchResult) -> FlowConfig:
    """The "inc" ring's knobs as init() fitted them to the switch (rank 0's "joined" line)."""
    (joined,) = lines(result, 0, "joined ")
    knobs = re.search(r"inc mtu=(\d+), msg_size=(\d+), window=(\d+), ack_timeout=(\d+)",
                      joined)
    assert knobs, joined
    return FlowConfig(mtu=int(knobs[1]), msg_size=int(knobs[2]), window=int(knobs[3]),
                      ack_timeout=int(knobs[4]))
