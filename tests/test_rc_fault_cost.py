"""Time lost per recovered transport fault (tests/rcmodel/faultcost.py, docs/reliability.md):
the RC model's figures against the closed form, and the clean calls against the scale
study's formulas."""
from __future__ import annotations

import pytest

from flowctl.stream import LIVENESS_POLL
from tests.rcmodel.faultcost import DARK, DARK_SWITCH, bounds, clean_s, measure, table
from tests.rcmodel.scale import CONFIG


@pytest.mark.parametrize("kind,n,size", [("ring", 4, 1 << 16), ("ring", 8, 1 << 20),
                                         ("dark", 4, 1 << 20), ("dark", 8, 1 << 16),
                                         ("inc", 4, 1 << 20), ("inc", 8, 1 << 16)])
def test_a_recovered_fault_costs_what_the_closed_form_says(kind: str, n: int,
                                                           size: int) -> None:
    """Every call exact (measure checks), one fault settled and its call redone; the clean
    call within 3 % of its formula; the time lost within the closed form's bounds."""
    got = measure(kind, n, size)
    assert got.transport["faults"] == 1 and got.transport["redone"] == 1, got
    # the host ring is rebuilt; "inc" is left for the host ring (the return, after the
    # switch's back-off, is not modelled: no controller)
    assert got.transport["rebuilds"] == (0 if kind == "inc" else 1), got
    assert got.clean_s == pytest.approx(clean_s(kind, n, size), rel=0.03)
    least, most = bounds(kind, n, size)
    assert least <= got.lost_s <= most, (got, least, most)


def test_the_closed_form_adds_up() -> None:
    """The dark link's least cost is its outage (DARK budgets of 7 x 67 ms) plus the redo
    less what the clean call had left; a host-ring fault's most is two liveness polls
    more than its least, plus what the clean call had left; the table has every kind at
    8, 64, 256 ranks at 1 and 16 MiB."""
    budget = 7 * 4.096e-6 * 2 ** 14
    assert CONFIG.dark_budget == pytest.approx(budget)
    low, high = bounds("dark", 8, 1 << 20)
    assert DARK * budget < low < DARK * budget + 0.01
    low, high = bounds("ring", 8, 1 << 20)
    assert high - low == pytest.approx(2 * LIVENESS_POLL + 0.7 * clean_s("ring", 8, 1 << 20))
    rows = table()
    assert len(rows) == 2 + 3 and rows[-1].startswith("| dark |") and \
        rows[-1].count(" / ") == 2 * 2, rows


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="fault kind 'nic' is not one of"):
        measure("nic", 4, 1024)


@pytest.mark.xfail(strict=True, reason="open gap: a host's RoCE dark during a switch call "
                   "for longer than NOTICE_GRACE + about two retry budgets (here 12 budgets, "
                   "5.6 s; 8 budgets, 3.75 s, recover) while the store stays reachable: the "
                   "settle's host-ring transfer crosses the dark link and fails, and every "
                   "rank fails (CommunicatorError 'a transport fault while settling'); in the "
                   "lab the store crosses the link too, so the settle waits for it")
def test_a_link_dark_for_seconds_during_a_switch_call_is_recovered() -> None:
    got = measure(DARK_SWITCH, 4, 1 << 16, budgets=12)
    assert got.transport["faults"] >= 1
