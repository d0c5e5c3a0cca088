"""`netreduce bench` at its smallest, on real rxe: 2 workers, two tiny sizes, 2 jobs of 2
calls each and the RC round trip column; checks the output lines' format and the JSON
document's schema (the figures are not judged here).

Inside the lab: scripts/lab.sh --hosts 2 -- python -m pytest -q -m lab tests/lab/test_bench_smoke.py
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from netreduce.tools.bench.results import validate
from tests.lab.labhosts import HOSTS
from tests.switchml_lines import JOB_LINE, STAT_LINE, STD_LINE

pytestmark = pytest.mark.lab


def test_bench_prints_switchml_lines_and_writes_its_json(tmp_path: Path) -> None:
    if HOSTS < 2:
        pytest.fail(f"the lab has {HOSTS} hosts, the test needs 2")
    path = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "netreduce.tools.bench", "--workers", "2", "--sizes",
                        "4K,64K", "--jobs", "2", "--warmup", "0", "--iters", "2", "--rtt",
                        "--port", "29690", "--json", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(path.read_text())
    validate(doc)
    columns = 2 + len(doc["meta"]["algos"])        # the link, each algorithm, the round trip
    lines = p.stdout.splitlines()
    jobs = [line for line in lines if line.startswith("Job(s)")]
    assert len(jobs) == 2 * columns * 2 and all(JOB_LINE.fullmatch(j) for j in jobs), jobs
    assert len([x for x in lines if STAT_LINE.fullmatch(x)]) == 2 * columns * 4
    assert len([x for x in lines if STD_LINE.fullmatch(x)]) == 2 * columns
    assert [(r["algo"], r["size_bytes"]) for r in doc["results"]] == [
        (algo, size) for size in (4096, 65536)
        for algo in ("link", *doc["meta"]["algos"], "rtt")]
    assert all(r["verified"] and len(r["jobs"]) == 2 for r in doc["results"])
    assert [r["calls_per_job"] for r in doc["results"] if r["algo"] != "rtt"] == \
        [2] * (columns - 1) * 2
    assert doc["link_gbps"] > 0 and doc["rtt_us"] > 0 and doc["meta"]["workers"] == 2
    assert all(r["ring_rtts"] > 0 for r in doc["ratios"])
    assert any(line.startswith("Time per call (median; us)") for line in lines), lines
    if "switch" in doc["meta"]["algos"]:                  # paired round by round
        for r in doc["ratios"]:
            assert len(r["per_round"]["switch_over_link"]) == 2, r
        assert "Round by round (each round ran its jobs back to back): median [quartiles]" \
            in lines, lines


def test_two_tenants_at_once_each_exact_under_its_own_principal(tmp_path: Path) -> None:
    """`--tenants 2`: jobs of 2 ranks on h0-h1 and h2-h3 at once through the switch, each
    registered by its own principal (the lab's tenant token files), each result exact."""
    if HOSTS < 4:
        pytest.fail(f"the lab has {HOSTS} hosts, the test needs 4")
    path = tmp_path / "tenants.json"
    p = subprocess.run([sys.executable, "-m", "netreduce.tools.bench", "--workers", "4",
                        "--tenants", "2", "--sizes", "64K", "--algos", "switch", "--jobs", "1",
                        "--warmup", "0", "--port", "29694", "--json", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(path.read_text())
    tokens = [t["meta"]["token_file"] for t in doc["tenants"]]
    assert [Path(f).name for f in tokens] == ["tenant0.token", "tenant1.token"], tokens
    for t, tenant in enumerate(doc["tenants"]):
        validate(tenant)
        assert tenant["meta"]["first_host"] == 2 * t and tenant["meta"]["workers"] == 2
        assert [(r["algo"], r["verified"]) for r in tenant["results"]] == [
            ("link", True), ("switch", True)]
    [switch] = [r for r in doc["sharing"] if r["algo"] == "switch"]
    assert switch["aggregate_gbps"] == pytest.approx(sum(switch["algbw_gbps"]))
    assert sum(switch["shares"]) == pytest.approx(1.0) and 0.5 <= switch["jain"] <= 1.0
    assert doc["overlap"] > 0, "the tenants did not run at the same time"
