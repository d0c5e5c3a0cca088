"""Host ring allreduce on real rxe: one process per lab host, started by netreduce.tools.launch.

Inside the lab: scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_allreduce.py
"""
from __future__ import annotations

import json
import re

import pytest

from nr_contract.spec import RingSpec
from tests.lab.labhosts import host_ip
from tests.lab.workers import lines, run_worker

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_allreduce_matches_numpy(n: int) -> None:
    """Sizes: 1 element, 1000 elements (4000 B, not a multiple of the MTU), 1 KiB, and 16 MiB
    at 4 ranks, 4 MiB at 2 and 3 (6 to 8 messages of 256 KiB per ring step there: past the
    window of 2 as at 16 MiB, for a quarter of the emulated CPU);
    int32 exactly numpy's sum, float32 within float rounding of a float64 reference."""
    result = run_worker(n, "correctness", *(() if n == 4 else ("--sizes", "1,1000,256,1048576",
                                                                 "--timed", "0")))
    assert result.ok, f"exit {result.exit_code}"
    assert result.cold == 0, "the lab's fork servers did not start every rank"  # docs/lab.md
    for r in range(n):
        assert lines(result, r, "OK correctness "), result.ranks[r].output
        (counters,) = lines(result, r, "COUNTERS ")
        counters = json.loads(counters)
        # RDMA WRITE WITH IMMEDIATE over pyverbs RC QPs through the switch: the data is the
        # sum checked above, every immediate was the expected message index (flowctl raises
        # SequenceError otherwise), and rxe saw the packets arrive.
        assert counters.get("sent_pkts", 0) > 0 and counters.get("rcvd_pkts", 0) > 0, counters
        for bad in ("rcvd_rnr_err", "send_rnr_err", "retry_exceeded_err"):
            assert counters.get(bad, 0) == 0, counters      # receives always posted in time


def test_a_single_rank_rings_itself() -> None:
    """World size 1: the QPs loop back through the rank's own rxe device; allreduce = copy."""
    result = run_worker(1, "correctness", "--sizes", "1,1000", "--timed", "0", timeout=600)
    assert result.ok and lines(result, 0, "OK correctness "), result.ranks[0].output


@pytest.mark.parametrize("what", ["count", "dtype"])
def test_mismatched_calls_fail_on_every_rank(what: str) -> None:
    result = run_worker(3, "mismatch", what, timeout=600)
    assert result.ok, f"exit {result.exit_code}"
    errors = {e for r in range(3) for e in lines(result, r, "ERROR ")}
    assert len(errors) == 1, errors                      # the same message everywhere
    assert "ranks disagree" in errors.pop()
    assert all(lines(result, r, "OK mismatch") for r in range(3))


def test_a_rank_that_never_joins_is_named_by_the_others() -> None:
    result = run_worker(3, "missing-rank", "--timeout", "10", timeout=300)
    assert result.ok, f"exit {result.exit_code}"
    for r in (0, 1):
        (err,) = lines(result, r, "ERROR ")
        assert re.fullmatch(r"rendezvous: rank 2 never joined within 10s \(waiting at "
                            r"10\.77\.0\.1:\d+\)", err), err


def test_a_stall_names_rank_peer_message_qp_states_and_counters() -> None:
    """Rank 2 is alive but never calls: after the collective timeout (5 s here) a waiting
    rank reports the stall; the first to do so aborts the communicator, so the other one
    reports either its own stall or that rank's."""
    result = run_worker(3, "stall", "--collective-timeout", "5", timeout=600)
    assert result.ok, f"exit {result.exit_code}"
    stalled = []
    for r in (0, 1):
        (err,) = lines(result, r, "ERROR ")
        if "PeerFailure" in err:
            assert re.search(rf"rank {1 - r}: .*nothing moved for 5s", err), err
            continue
        stalled.append(r)
        # the lab's switch registers "inc", so the metadata exchange (where it stalls) is there
        assert (f"flowctl: rank {r}, ring 'inc': nothing moved for 5s (the collective timeout; "
                f"every peer alive)") in err, err
        assert re.search(r"message \d+ from rank \d not arrived", err), err
        assert re.search(rf"send QP \d+ \(to rank {r + 1}\) RTS, recv QP \d+ \(from rank "
                         rf"{(r - 1) % 3}\) RTS; rxe{r} counters: .*sent_pkts=\d+", err), err
    assert stalled
    assert lines(result, 2, "OK idle")


def test_inc_ring_spec_is_the_same_on_every_rank() -> None:
    result = run_worker(3, "inc-spec", timeout=600)
    assert result.ok, f"exit {result.exit_code}"
    specs = {s for r in range(3) for s in lines(result, r, "SPEC ")}
    assert len(specs) == 1, specs
    spec = RingSpec.from_json(specs.pop())
    assert spec.world_size == 3 and spec.mtu == 4096
    for r, c in enumerate(spec.connections):
        assert (c.src_ip, c.dst_ip) == (host_ip(r), host_ip((r + 1) % 3))
        assert c.src_mac == f"02:4e:52:00:00:{r + 1:02x}"
        assert c.src_qpn > 0 and c.dst_qpn > 0 and 0 <= c.psn0 < 2**24
    assert json.loads(spec.to_json())["connections"][0]["rank"] == 0
