"""The scale study's formulas (tests/rcmodel/scale.py, docs/scale.md) against small runs of
the RC model: the time of a call and the bytes per link between tiers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.rcmodel.scale import (Case, formula_ring_spine_link, formula_ring_time_us,
                                 formula_spine_link, formula_switch_time_us, markdown, run)

RESULTS = Path(__file__).parent.parent / "docs" / "figures" / "scale.json"


@pytest.mark.parametrize("case", [Case("1sw", 8, 0.0, "switch", 4),
                                  Case("3t", 8, 0.0, "switch", 4096),
                                  Case("2t", 8, 0.0, "ring", 65536),
                                  Case("3t", 8, 0.0, "ring", 4)])
def test_a_small_run_is_exact_and_follows_the_formulas(case: Case) -> None:
    r = run(case)
    assert r.exact, r.outcome
    formula = formula_switch_time_us if case.algo == "switch" else formula_ring_time_us
    assert r.sim_us == pytest.approx(formula(case.topology, case.size, case.n), rel=0.05)
    if case.topology != "1sw":
        links = formula_spine_link if case.algo == "switch" else formula_ring_spine_link
        for name, got in r.links.items():
            assert got == pytest.approx(links(case.size, case.n), rel=0.03), name


def test_the_committed_study_was_exact_everywhere_and_its_tables_render() -> None:
    runs = json.loads(RESULTS.read_text())["runs"]
    assert len(runs) == 90 and all(r["exact"] for r in runs)
    lines = markdown(runs)
    assert sum(line.startswith("| 1024 |") for line in lines) == 6
