"""Calls in flight in the RC model (tests/rcmodel/inflight.py): K asynchronous calls
outstanding, every result exact, the time per call against the closed form
`formula_in_flight_us` (K >= 2: the metadata round hidden behind the data)."""
from __future__ import annotations

import pytest

from tests.rcmodel.inflight import formula_in_flight_us, run


@pytest.mark.parametrize("n,size,k", [(4, 65536, 1), (4, 65536, 2), (4, 65536, 4),
                                      (4, 131072, 4), (4, 262144, 4), (64, 65536, 4)])
def test_model_calls_in_flight_follow_the_closed_form(n: int, size: int, k: int) -> None:
    p = run(n, size, k, calls=6)
    assert p.exact
    # within 2 % where the bank is shorter than the data's ACK wait; at 64 ranks (a 16 KiB
    # bank that outlasts it) the model's tail is ~4 % longer than the closed form counts
    assert p.per_call_us == pytest.approx(formula_in_flight_us(size, n, k),
                                          rel=0.02 if n <= 4 else 0.05)
    assert (k - 1) * p.per_call_us <= p.latency_us <= 1.05 * k * p.per_call_us


def test_model_k4_hides_the_metadata_round_at_64_kib() -> None:
    """At 64 KiB on 4 ranks the round is ~13 % of a call: K = 4 gains it all."""
    one, four = run(4, 65536, 1, calls=6), run(4, 65536, 4, calls=6)
    bank_round = formula_in_flight_us(65536, 4, 1) - formula_in_flight_us(65536, 4, 4)
    assert bank_round > 10.0
    assert one.per_call_us - four.per_call_us == pytest.approx(bank_round, rel=0.1)
