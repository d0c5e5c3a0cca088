"""netreduce bench without the lab: sizes and plan, records joined over ranks, statistics,
the SwitchML-style lines, the JSON schema, the figure, the parent's output on synthetic
worker lines, and the worker's jobs on the in-process fabric (tests/fakefabric.py)."""
from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from netreduce.algorithms.switch import SWITCH
from netreduce.tools import cli
from netreduce.tools.bench import runner, tenants
from netreduce.tools.bench.progressbar import Progress
from netreduce.tools.bench.results import (LATENCY, Collector, Record, Result, Summary,
                                           document, gbps,
                                           latency_table, quartiles, ratios, rtt_us, table,
                                           validate)
from netreduce.tools.bench.runplan import (BenchPlan, format_size, parse_algos, parse_iters,
                                           parse_size, parse_sizes)
from netreduce.tools.bench.worker import (AllreduceJob, rank_input, run, size_reference,
                                          spine_link_bytes)
from netreduce.tools.launch import LaunchResult, RankResult
from tests.fakefabric import FakeController, FakeFabric
from tests.ranks import run_ranks
from tests.switchml_lines import JOB_LINE, STAT_LINE, STD_LINE

MiB = 1 << 20


def test_sizes_parse_and_print_in_binary_units() -> None:
    assert parse_sizes("4096, 64K,1M,16MiB,1G") == [4096, 65536, MiB, 16 * MiB, 1 << 30]
    assert [format_size(s) for s in (1000, 65536, 16 * MiB, 1 << 30, 1536)] == \
        ["1000 B", "64 KiB", "16 MiB", "1 GiB", "1536 B"]
    for bad in ("0", "-4", "1T", "abc", ""):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert parse_algos("switch, ring,switch") == ["switch", "ring"]
    with pytest.raises(ValueError, match="always measured"):
        parse_algos("link")


def test_size_ranges_are_nccl_tests_style_and_iters_auto_fits_the_size() -> None:
    assert parse_sizes("4:1K:4") == [4, 16, 64, 256, 1024]
    assert parse_sizes("4:16M:4")[-1] == 16 * MiB and len(parse_sizes("4:16M:4")) == 12
    assert parse_sizes("8:100:2,64,1M") == [8, 16, 32, 64, 1 * MiB]     # each size once
    for bad, words in (("4:1K", "MIN:MAX:FACTOR"), ("1K:4:2", "MIN <= MAX"),
                       ("4:1K:1", "FACTOR >= 2"), ("4:1K:x", "FACTOR >= 2")):
        with pytest.raises(ValueError, match=words):
            parse_sizes(bad)
    assert parse_iters("auto") == 0 and parse_iters("20") == 20
    with pytest.raises(ValueError, match="or auto"):
        parse_iters("0")
    auto = BenchPlan(workers=4, sizes=(4, 64 * 1024, MiB), algos=("ring",), iters=0, rtt=True)
    assert [auto.calls(s) for s in auto.sizes] == [16, 4, 1]
    assert auto.columns == ("link", "ring", "rtt")
    assert BenchPlan.from_json(auto.to_json()) == auto
    assert BenchPlan(workers=2, sizes=(4,), algos=("ring",), iters=3).calls(4) == 3
    with pytest.raises(ValueError, match="round trip needs 2"):
        BenchPlan(workers=1, sizes=(4,), algos=("ring",), rtt=True)


def test_a_job_of_several_calls_reports_its_time_per_call_and_round_trips() -> None:
    """Jobs of 4 calls: the records' ns are totals, the results per call; the latency
    table counts each algorithm's time per call in RC round trips (the rtt column)."""
    assert Record("ring", 4, 0, 4003, 0, calls=4).per_call_ns == 1001
    assert Record.parse(Record("ring", 4, 0, 8, 0, {}, 4).line()).calls == 4
    c = Collector(2)
    c.add(0, Record("switch", 4, 0, 4000, 0, calls=4))
    joined = c.add(1, Record("switch", 4, 0, 6000, 0, calls=4))
    assert joined == Record("switch", 4, 0, 6000, 0, {}, 4)
    results = []
    for algo, per_call in (("link", 500), ("switch", 2000), ("ring", 6000), ("rtt", 1000)):
        r = Result(algo, 4, 4)
        for job in (-1, 0, 1, 2):
            r.add(Record(algo, 4, job, per_call * 8, 0, calls=8))
        results.append(r)
    switch, rtt = results[1], results[3]
    assert switch.jobs == [2000, 2000, 2000] and switch.calls == 32 and switch.per_job == 8
    assert rtt.algbw_gbps == gbps(8, 1000)                  # the 8-byte ping, not the row's size
    assert rtt.job_lines()[0].endswith(f"Goodput: #{gbps(8, 1000):.4f}# Gbps.")
    assert switch.summary_lines()[0] == "switch 4 B (3 jobs of 8 calls, 4 workers):"
    assert switch.to_json()["calls_per_job"] == 8
    (r,) = ratios(results)
    assert (r["switch_rtts"], r["ring_rtts"]) == (2.0, 6.0)
    assert rtt_us(results) == 1.0
    lines = latency_table(results)
    assert lines[1].split() == ["size", "count", "type", "redop", "link", "us", "switch", "us",
                                "algbw", "busbw", "#wrong", "ring", "us", "algbw", "busbw",
                                "#wrong", "rtt", "us", "switch/rtt", "ring/rtt"]
    # GB/s = bytes / ns: 4 B in 2 us = 0.002 GB/s, busbw x 2(n-1)/n = 1.5; 4 B in 6 us
    assert lines[2].split() == ["4", "B", "1", "int32", "sum", "0", "2", "0.0020", "0.0030",
                                "0", "6", "0.0007", "0.0010", "0", "1", "2.0", "6.0"]
    assert all("rtt" not in line for line in table(results))       # no rate for the rtt
    doc = json.loads(json.dumps(document(_meta(), results)))
    validate(doc)
    assert doc["rtt_us"] == 1.0 and doc["ratios"][0]["switch_rtts"] == 2.0


def test_plan_checks_itself_and_travels_as_json() -> None:
    plan = BenchPlan(workers=4, sizes=(MiB, 16 * MiB), algos=("switch", "ring"), jobs=3,
                     warmup=2)
    assert BenchPlan.from_json(plan.to_json()) == plan
    assert plan.columns == ("link", "switch", "ring")
    assert plan.units == 2 * 3 * 5
    assert plan.count(MiB) == MiB // 4
    with pytest.raises(ValueError, match="whole number"):
        BenchPlan(workers=2, sizes=(1002,), algos=("ring",))
    with pytest.raises(ValueError, match="dtype"):
        BenchPlan(workers=2, sizes=(1024,), algos=("ring",), dtype="int64")
    with pytest.raises(ValueError, match="jobs"):
        BenchPlan(workers=2, sizes=(1024,), algos=("ring",), jobs=0)


def test_records_travel_as_prefixed_json_lines() -> None:
    r = Record("ring", 4096, -1, 1234, 0, {"sent_pkts": 3})
    assert r.line().startswith("NRBENCH {")
    assert Record.parse(r.line()) == r
    assert Record.parse("joined Communicator(...)") is None


def test_a_job_is_the_slowest_rank_with_every_ranks_wrong_elements() -> None:
    c = Collector(3)
    assert c.add(0, Record("ring", 8, 0, 100, 0)) is None
    assert c.add(2, Record("ring", 8, 0, 300, 0)) is None
    assert c.add(0, Record("ring", 8, 1, 50, 3)) is None      # another job, in between
    assert c.add(1, Record("ring", 8, 0, 200, 0)) == Record("ring", 8, 0, 300, 0)
    c.add(1, Record("ring", 8, 1, 60, 0, {"sent_pkts": 5, "rcvd_seq_err": 1}))
    joined = c.add(2, Record("ring", 8, 1, 70, 4, {"sent_pkts": 7}))
    assert joined == Record("ring", 8, 1, 70, 7, {"rcvd_seq_err": 1, "sent_pkts": 12})
    assert joined is not None and not joined.ok
    result = Result("ring", 8, 3)
    result.add(Record("ring", 8, 1, 70, 0, {"rcvd_seq_err": 1, "sent_pkts": 12,
                                           "cpu_user": 30, "cpu_idle": 10, "cpu_steal": 0}))
    result.add(Record("ring", 8, 2, 80, 0, {"sent_pkts": 1, "cpu_softirq": 60}))
    assert result.rxe == {"rcvd_seq_err": 1, "sent_pkts": 13}
    assert result.vm_cpu == {"softirq": 0.6, "user": 0.3, "idle": 0.1}
    assert result.summary_lines()[-2:] == [
        "  rxe counters, all ranks, warmup included: rcvd_seq_err=1 sent_pkts=13",
        "  lab CPU while timed: softirq 60% user 30% idle 10%"]


def test_statistics_and_the_switchml_lines() -> None:
    s = Summary.of([4.0, 1.0, 3.0, 2.0])
    assert (s.min, s.max, s.median, s.mean) == (1.0, 4.0, 2.5, 2.5)
    assert s.std == pytest.approx(1.2909944)
    assert Summary.of([7.0]).std == 0.0
    line = Result("ring", 16 * MiB, 4, jobs=[7, 1_000_000_000]).job_lines()[1]
    m = JOB_LINE.fullmatch(line)
    assert m and m.groups() == ("1", "1000000000", "0.1342"), line
    result = Result("ring", 1000, 4, jobs=[1000, 2000, 4000])
    lines = result.summary_lines()
    assert lines[0] == "ring 1000 B (3 jobs, 4 workers):"
    assert [STAT_LINE.fullmatch(x).groups() for x in lines[1:5]] == [   # type: ignore[union-attr]
        ("Min", "1000", "8.0000"), ("Max", "4000", "2.0000"), ("Median", "2000", "4.0000"),
        ("Mean", "2333", "3.4286")]
    assert STD_LINE.fullmatch(lines[5])


def test_rates_busbw_and_ratios() -> None:
    assert gbps(1000, 8000) == 1.0
    results = [Result("link", MiB, 4, [1000]), Result("ring", MiB, 4, [3000, 2000, 9000]),
               Result("switch", MiB, 4, [1250, 1250]), Result("ring", 2 * MiB, 4, [5000])]
    link, ring, switch, ring2 = results
    assert link.algbw_gbps == link.busbw_gbps == gbps(MiB, 1000)
    assert ring.median_ns == 3000 and ring.busbw_gbps == pytest.approx(ring.algbw_gbps * 1.5)
    assert ratios(results) == [
        {"size_bytes": MiB, "switch_over_ring": pytest.approx(2.4),
         "switch_over_link": pytest.approx(0.8), "switch_over_per_call": None,
         "switch_rtts": None, "ring_rtts": None, "per_round":
         {"switch_over_ring": None, "switch_over_link": None,          # 2 jobs vs 3 and 1
          "switch_over_per_call": None}},
        {"size_bytes": 2 * MiB, "switch_over_ring": None, "switch_over_link": None,
         "switch_over_per_call": None, "switch_rtts": None, "ring_rtts": None,
         "per_round": {"switch_over_ring": None, "switch_over_link": None,
                       "switch_over_per_call": None}}]
    rows = table(results)
    assert "switch/ring" in rows[0] and rows[1].split()[:2] == ["1", "MiB"]
    assert rows[1].split()[-2:] == ["2.400", "0.800"]
    assert rows[2].split()[-2:] == ["-", "-"]
    assert len(rows) == 3                       # no round-by-round block without pairs


def test_per_block_over_per_call_quantization_is_a_ratio_of_its_own() -> None:
    """The "switch-call" column (one scale per call) against "switch" (per block): the
    medians' ratio and round by round, in the table's round-by-round block."""
    results = [Result("link", MiB, 4, [1000, 1000, 1000]),
               Result("switch", MiB, 4, [2000, 4000, 2100]),
               Result("switch-call", MiB, 4, [1900, 4000, 2100])]
    (r,) = ratios(results)
    assert r["switch_over_per_call"] == pytest.approx(2100 / 2100)
    assert r["per_round"]["switch_over_per_call"] == pytest.approx([0.95, 1.0, 1.0])
    rows = table(results)
    assert rows[-1].split()[:4] == ["1", "MiB", "switch/per_call", "1.000"]


def test_switch_call_is_a_float32_column_that_needs_the_switch() -> None:
    plan = BenchPlan(workers=4, sizes=(MiB,), algos=("switch-call",), dtype="float32")
    assert plan.needs_switch and plan.columns == ("link", "switch-call")
    assert not BenchPlan(workers=4, sizes=(MiB,), algos=("ring",)).needs_switch
    with pytest.raises(ValueError, match="switch-call compares the float quantizers: use "
                                         "--dtype float32"):
        BenchPlan(workers=4, sizes=(MiB,), algos=("switch", "switch-call"))
    assert parse_algos("switch,switch-call") == ["switch", "switch-call"]


def test_round_by_round_ratios_pair_job_i_of_each_column() -> None:
    """Round i's ratio uses job i of both columns, so a slow round slows both sides: here
    every round's switch/ring is 1.5 although the medians alone would say 1.2."""
    results = [Result("link", MiB, 4, [1000, 3000, 2000, 1000, 1000]),
               Result("switch", MiB, 4, [2000, 6000, 2000, 2000, 2000]),
               Result("ring", MiB, 4, [3000, 9000, 3000, 3000, 3000])]
    (r,) = ratios(results)
    assert r["switch_over_ring"] == pytest.approx(1.5)
    assert r["per_round"]["switch_over_ring"] == pytest.approx([1.5] * 5)
    assert r["per_round"]["switch_over_link"] == pytest.approx([0.5, 0.5, 1.0, 0.5, 0.5])
    assert quartiles([0.5, 0.5, 1.0, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)
    rows = table(results)
    assert rows[2].startswith("Round by round")
    assert rows[3].split() == ["1", "MiB", "switch/ring", "1.500", "[1.500,", "1.500]",
                               "over", "5", "rounds"]
    assert rows[4].split()[2:6] == ["switch/link", "0.500", "[0.500,", "0.500]"]


def _meta() -> dict[str, Any]:
    return {"workers": 4, "dtype": "int32", "mtu": 4096, "window": 8, "msg_size": 65536,
            "kernel": "7.1.0", "git_commit": None, "git_dirty": False, "started_at": "2026-01-01T00:00:00+00:00"}


def test_the_json_document_matches_its_schema() -> None:
    """Each result: nccl-tests' count, type, redop and #wrong, its rates in Gbit/s and in
    GB/s (bytes / ns), verified exactly when nothing was wrong."""
    results = [Result("link", MiB, 4, [1000, 1100]), Result("ring", MiB, 4, [3000]),
               Result("ring", 4 * MiB, 4, [9000], wrong=12, dtype="float32"),
               Result("rtt", MiB, 4, [800])]
    doc = json.loads(json.dumps(document(_meta(), results)))
    validate(doc)
    assert doc["link_gbps"] == pytest.approx(gbps(MiB, 1050))
    assert [(r["algo"], r["count"], r["type"], r["redop"], r["wrong"], r["verified"])
            for r in doc["results"]] == [
        ("link", MiB, "uint8", "none", 0, True), ("ring", MiB // 4, "int32", "sum", 0, True),
        ("ring", MiB, "float32", "sum", 12, False), ("rtt", 1, "uint64", "none", 0, True)]
    ring = doc["results"][1]
    assert ring["algbw_GBps"] == pytest.approx(MiB / 3000)               # bytes per ns
    assert ring["busbw_GBps"] == pytest.approx(MiB / 3000 * 1.5)
    assert ring["algbw_gbps"] == pytest.approx(MiB * 8 / 3000)
    broken: list[dict[str, Any]] = [json.loads(json.dumps(doc)) for _ in range(7)]
    del broken[0]["meta"]["kernel"]
    broken[1]["results"][0]["jobs"] = []
    broken[2]["results"][1]["verified"] = 1
    broken[3]["ratios"][0]["switch_over_ring"] = "fast"
    del broken[4]["ratios"][0]["per_round"]["switch_over_link"]
    broken[5]["results"][2]["verified"] = True                  # with 12 wrong
    del broken[6]["results"][0]["busbw_GBps"]
    for bad in broken:
        with pytest.raises(ValueError, match="bench JSON"):
            validate(bad)


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    results = [Result(a, s, 4, [ns * s // MiB]) for a, ns in (("link", 1000), ("ring", 2500),
                                                              ("switch", 1200))
               for s in (MiB, 4 * MiB)]
    from netreduce.tools.bench.plot import plot
    plot(results, 4, "int32", tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_progress_bar_keeps_logs_readable() -> None:
    out, err = io.StringIO(), io.StringIO()      # not a TTY: a bar line per phase
    p = Progress(4, out, err, width=8)
    p.advance("link 1 MiB")
    p.print("result")
    p.advance("link 1 MiB")
    p.advance("ring 1 MiB")
    p.advance("ring 1 MiB")
    p.close()
    assert out.getvalue() == "result\n"
    assert err.getvalue().splitlines() == ["[##......] 1/4 jobs  link 1 MiB",
                                           "[######..] 3/4 jobs  ring 1 MiB",
                                           "[########] 4/4 jobs  ring 1 MiB"]


def _fake_launch(lines: list[str], code: int = 0) -> Any:
    def fake(cmd: list[str], hosts: int, *, out: io.TextIOBase, **_: Any) -> LaunchResult:
        assert cmd[1:3] == ["-m", "netreduce.tools.bench.worker"]
        plan = BenchPlan.from_json(cmd[cmd.index("--plan") + 1])
        assert plan.workers == hosts == 2 and plan.algos == ("ring",)
        for line in lines:
            out.write(line + "\n")
        return LaunchResult([RankResult(r, code) for r in range(hosts)])
    return fake


def _worker_lines(ok: bool = True) -> list[str]:
    lines = ["[rank 0] joined"]
    for job in (-1, 0, 1):                  # rounds of one job per column
        for algo in ("link", "ring"):
            for rank in (1, 0):
                ns = 1000 * (job + 2) * (1 + rank) * (2 if algo == "ring" else 1)
                good = ok or algo == "link" or rank == 0
                lines.append(f"[rank {rank}] " + Record(algo, MiB, job, ns, 0 if good else 5).line())
    return lines + ["[launch] rank 0: exit 0; rank 1: exit 0"]


def test_the_parent_prints_jobs_statistics_table_and_writes_json_and_png(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "launch", _fake_launch(_worker_lines()))
    code = cli.main(["bench", "--workers", "2", "--sizes", "1M", "--algos", "ring", "--jobs",
                     "2", "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    out, err = capsys.readouterr()
    assert code == 0, err
    jobs = [JOB_LINE.fullmatch(x) for x in out.splitlines() if x.startswith("Job(s)")]
    assert [(m.group(1), m.group(2)) for m in jobs if m] == [
        ("0", "4000"), ("1", "6000"), ("0", "8000"), ("1", "12000")]
    assert "== ring, 1 MiB int32, 2 workers ==" in out
    assert len([x for x in out.splitlines() if STAT_LINE.fullmatch(x)]) == 8
    assert "[rank 0] joined" in err and "[launch] rank 0: exit 0" in err
    doc = json.loads((tmp_path / "b.json").read_text())
    validate(doc)
    assert [(r["algo"], r["jobs"], r["verified"]) for r in doc["results"]] == [
        ("link", [4000, 6000], True), ("ring", [8000, 12000], True)]
    # nccl-tests' columns: 1 MiB of int32 = 262144 elements summed, median 10 us per call:
    # 2^20 B / 10000 ns = 104.8576 GB/s, busbw x 2(n-1)/n = 1 with 2 ranks, 0 wrong
    row = next(x for x in out.splitlines() if x.split()[:3] == ["1", "MiB", "262144"])
    assert row.split()[3:] == ["int32", "sum", "5", "10", "104.8576", "104.8576", "0"]
    assert doc["meta"]["workers"] == 2 and doc["meta"]["algos"] == ["ring"]
    assert (tmp_path / "b.png").stat().st_size > 0


def test_the_parent_fails_on_a_wrong_result_or_a_failed_worker(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--workers", "2", "--sizes", "1M", "--algos", "ring", "--jobs", "2"]
    monkeypatch.setattr(runner, "launch", _fake_launch(_worker_lines(ok=False)))
    assert cli.main(args) == 1
    out = capsys.readouterr().out         # rank 1's 5 wrong elements in each of 3 ring jobs
    assert "ring 1 MiB (2 jobs, 2 workers, VERIFICATION FAILED: #wrong 15):" in out
    row = next(x for x in out.splitlines() if x.split()[:3] == ["1", "MiB", "262144"])
    assert row.split()[-1] == "15"
    monkeypatch.setattr(runner, "launch", _fake_launch([], code=3))
    assert cli.main(args) == 3
    assert "workers failed (exit 3)" in capsys.readouterr().err


def test_bad_options_exit_2_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--sizes", "1002", "--algos", "ring"]) == 2
    assert "not a whole number of int32" in capsys.readouterr().err
    for option, words in (("--algos=bogus", "choose from switch, ring"),
                          ("--sizes=12T", "not a positive byte count")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["bench", option])
        assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_tenants_split_the_hosts_get_their_tokens_and_are_judged_fair(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert tenants.split_hosts(4, 2) == [(0, 2), (2, 2)]
    assert tenants.split_hosts(5, 2) == [(0, 3), (3, 2)]
    assert tenants.split_hosts(6, 3) == [(0, 2), (2, 2), (4, 2)]
    with pytest.raises(ValueError, match="every tenant needs 2 or more hosts"):
        tenants.split_hosts(3, 2)
    monkeypatch.setenv(tenants.TENANT_TOKENS_ENV, "/lab/t0.token:/lab/t1.token:/lab/t2.token")
    assert tenants.tenant_tokens(None, 2) == ["/lab/t0.token", "/lab/t1.token"]
    assert tenants.tenant_tokens("a,b", 2) == ["a", "b"]
    with pytest.raises(ValueError, match="3 tenants but 2 token file"):
        tenants.tenant_tokens("a,b", 3)
    monkeypatch.delenv(tenants.TENANT_TOKENS_ENV)
    assert tenants.tenant_tokens(None, 2) == [None, None]
    assert tenants.jain([1.0, 1.0]) == 1.0 and tenants.jain([1.0, 0.0]) == 0.5


def _fake_tenant_launch(seen: list[dict[str, Any]], fail: int | None = None) -> Any:
    """Each tenant's launch: checks its placement, then answers like _worker_lines with
    tenant t's durations scaled by t + 1 (tenant 0 is the faster)."""
    def fake(cmd: list[str], hosts: int, *, out: io.TextIOBase, port: int, first_host: int,
             env: dict[str, str], **_: Any) -> LaunchResult:
        t = first_host // 2
        seen.append({"tenant": t, "hosts": hosts, "port": port,
                     "token": env.get("NR_CONTROLLER_TOKEN")})
        assert BenchPlan.from_json(cmd[cmd.index("--plan") + 1]).workers == hosts == 2
        for line in _worker_lines():
            prefix, _, text = line.partition("] ")
            rec = Record.parse(text)
            if rec is not None:
                line = f"{prefix}] " + dataclasses.replace(rec, ns=rec.ns * (t + 1)).line()
            out.write(line + "\n")
        return LaunchResult([RankResult(r, 5 if t == fail else 0) for r in range(hosts)])
    return fake


def test_the_parent_runs_tenants_at_once_and_reports_their_shares(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(tenants, "launch", _fake_tenant_launch(seen))
    args = ["bench", "--workers", "4", "--tenants", "2", "--tenant-tokens", "ta,tb",
            "--sizes", "1M", "--algos", "ring", "--jobs", "2", "--port", "29700"]
    code = cli.main([*args, "--json", str(tmp_path / "t.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert sorted(s["tenant"] for s in seen) == [0, 1]
    assert {(s["tenant"], s["port"], s["token"]) for s in seen} == {(0, 29700, "ta"),
                                                                   (1, 29701, "tb")}
    assert "== tenant 0: 2 ranks on h0..h1" in out and "== tenant 1: 2 ranks on h2..h3" in out
    doc = json.loads((tmp_path / "t.json").read_text())
    for t, tenant_doc in enumerate(doc["tenants"]):
        validate(tenant_doc)
        assert tenant_doc["meta"]["tenant"] == t and tenant_doc["meta"]["workers"] == 2
    ring = next(r for r in doc["sharing"] if r["algo"] == "ring")
    assert ring["shares"] == pytest.approx([2 / 3, 1 / 3])       # tenant 1 took twice as long
    assert ring["aggregate_gbps"] == pytest.approx(sum(ring["algbw_gbps"]))
    assert ring["jain"] == pytest.approx(0.9)
    assert "Tenants side by side" in out and "66.7%" in out
    monkeypatch.setattr(tenants, "launch", _fake_tenant_launch([], fail=1))
    assert cli.main(args) == 5
    out, err = capsys.readouterr()
    assert "tenant 1 (h2..h3): its workers failed (exit 5)" in err
    assert "== tenant 0" in out                                  # the other ran to its end
    assert cli.main([*args[:3], "--tenants", "2", "--sizes", "1M", "--plot", "x.png"]) == 2


def test_the_reference_catches_a_wrong_sum() -> None:
    for dtype in ("int32", "float32"):
        plan = BenchPlan(workers=3, sizes=(4096,), algos=("ring",), dtype=dtype)
        ref = size_reference(plan, 3, 4096)
        total = sum(rank_input(plan, r, 4096).astype(np.float64) for r in range(3))
        got = total.astype(plan.dtype)
        assert ref.failure(got, "ring") is None
        got[17] += 1
        assert ref.failure(got, "ring")


def test_a_job_counts_the_elements_outside_its_algorithms_bound() -> None:
    """#wrong of an allreduce job: the elements of its output that are not numpy's sum
    (int32), or farther from it than the ring's bound allows (float32): 2 of 1024 changed."""
    for dtype, off in (("int32", 1), ("float32", 1e-3)):
        plan = BenchPlan(workers=3, sizes=(4096,), algos=("ring",), dtype=dtype)
        x = rank_input(plan, 0, 4096)
        exact = sum(rank_input(plan, r, 4096).astype(np.float64) for r in range(3))
        job = AllreduceJob(None, "ring", x, size_reference(plan, 3, 4096))  # type: ignore[arg-type]
        job.out[:] = exact.astype(dtype)
        assert job.wrong() == 0
        job.out[[5, 700]] += np.asarray(off, dtype=dtype)   # the float bound here: ~1e-6
        assert job.wrong() == 2


def test_the_worker_measures_link_and_ring_and_verifies_on_the_fake_fabric() -> None:
    plan = BenchPlan(workers=3, sizes=(4096, 40000), algos=("ring",), jobs=2, warmup=1)

    def body(comm: Any, host: Any) -> list[Record]:
        records: list[Record] = []
        run(comm, plan, records.append)
        return records

    per_rank = run_ranks(3, body)
    for records in per_rank:
        assert isinstance(records, list), records
        assert [(r.algo, r.size, r.job) for r in records] == [
            (algo, size, job) for size in plan.sizes for job in (-1, 0, 1)
            for algo in ("link", "ring")]
        assert all(r.ok and r.ns > 0 for r in records)


def test_the_worker_runs_both_quantizers_through_the_fake_switch_and_verifies_each() -> None:
    """float32 through the (fake) switch per block and one scale per call ("switch-call"),
    each verified against its own bound, the per-call jobs with no block exponents."""
    plan = BenchPlan(workers=3, sizes=(40000,), algos=("switch", "switch-call"), jobs=1,
                     warmup=1, dtype="float32")
    fabric = FakeFabric()
    published: list[bytes] = []
    per_block = SWITCH.local_range

    def local_range(array: np.ndarray, spare: Any = None) -> Any:
        got = per_block(array, spare)
        if array.size > 1:                   # not the barrier's
            published.append(got.blocks)
        return got

    def body(comm: Any, host: Any) -> list[Record]:
        records: list[Record] = []
        run(comm, plan, records.append)
        return records

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SWITCH, "local_range", local_range)
        per_rank = run_ranks(3, body, fabric=fabric, controller=FakeController(fabric))
    for records in per_rank:
        assert isinstance(records, list), records
        assert [r.algo for r in records] == ["link", "switch", "switch-call"] * 2
        assert all(r.ok for r in records)
    assert [bool(b) for b in published] == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3


def test_spine_link_bytes_are_what_both_ends_of_each_link_received() -> None:
    """A fabric's ports (FabricTarget.counters): the ToRs' uplinks and the spine's ports 1..R
    count; host ports, the spine's controller leg and tx bytes (a BMv2 switch counts a built
    partial's as its carrier's) do not."""
    def port(name: str, rx: int) -> dict[str, Any]:
        return {"ifname": name, "rx_bytes": rx, "tx_bytes": 10**9}
    ports = {str(i + 1): p for i, p in enumerate([
        port("tor0:1", 1), port("tor0:uplink", 100), port("tor1:3", 2), port("tor1:uplink", 200),
        port("spine:1", 1000), port("spine:2", 2000), port("spine:5", 4)])}
    assert spine_link_bytes(ports) == 3300


def test_the_worker_times_several_calls_and_the_round_trip_on_the_fake_fabric() -> None:
    """--iters and --rtt on the in-process fabric: every job makes its calls, the rtt
    column ping-pongs between ranks 0 and 1 (rank 2 only waits) and checks the last ping."""
    plan = BenchPlan(workers=3, sizes=(4, 4096), algos=("ring",), jobs=1, warmup=1, iters=0,
                     rtt=True)

    def body(comm: Any, host: Any) -> list[Record]:
        records: list[Record] = []
        run(comm, plan, records.append)
        return records

    for records in run_ranks(3, body):
        assert isinstance(records, list), records
        assert [(r.algo, r.size, r.calls) for r in records if r.job == 0] == [
            ("link", 4, 16), ("ring", 4, 16), ("rtt", 4, 16),
            ("link", 4096, 16), ("ring", 4096, 16), ("rtt", 4096, 16)]
        assert all(r.ok and r.ns > 0 for r in records)


def test_the_sweep_runs_every_size_with_the_round_trip_and_prints_time_per_call(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[BenchPlan] = []

    def fake(cmd: list[str], hosts: int, *, out: io.TextIOBase, **_: Any) -> LaunchResult:
        plan = BenchPlan.from_json(cmd[cmd.index("--plan") + 1])
        seen.append(plan)
        for size in plan.sizes:
            for job in (-1, 0):
                for column in plan.columns:
                    for rank in range(hosts):
                        calls = plan.calls(size)
                        out.write(f"[rank {rank}] " + Record(column, size, job, 1000 * calls,
                                                             0, {}, calls).line() + "\n")
        return LaunchResult([RankResult(r, 0) for r in range(hosts)])

    monkeypatch.setattr(runner, "launch", fake)
    assert cli.main(["bench", "--workers", "2", "--sweep", "--algos", "ring", "--jobs", "1"]) == 0
    (plan,) = seen
    assert plan.sizes == tuple(4 ** i for i in range(1, 13)) and plan.rtt and plan.iters == 0
    out = capsys.readouterr().out
    assert "Time per call (median; us)" in out
    row = next(x for x in out.splitlines() if x.split()[:3] == ["16", "MiB", "4194304"])
    assert row.split()[-1] == "1.0"                         # ring: one round trip per call
    assert "(1 jobs of 16 calls, 2 workers)" in out


def test_spine_bytes_per_call_in_the_table_the_json_and_the_plot(tmp_path: Path) -> None:
    """On a two-tier fabric rank 0's records carry the bytes over the ToR-spine links: the
    figure is per call (warmup included), ring/switch is their ratio, the plot gets a panel."""
    results = []
    for algo, per_call in (("switch", 2_100_000), ("ring", 3_000_000)):
        r = Result(algo, MiB, 4)
        for job in (-1, 0, 1):
            r.add(Record(algo, MiB, job, 1000 + job, 0,
                         {"spine_bytes": per_call, "sent_pkts": 3}))
        results.append(r)
    assert [r.spine_bytes_per_call for r in results] == [2_100_000, 3_000_000]
    assert results[0].rxe == {"sent_pkts": 9}                  # not mixed with rxe's
    lines = table(results)
    i = lines.index("Bytes over the ToR-spine links per call (both directions, all links):")
    assert lines[i + 1] == "    1 MiB  switch 2,100,000  ring 3,000,000  ring/switch 1.43"
    doc = json.loads(json.dumps(document({}, results)))
    assert [r["spine_bytes_per_call"] for r in doc["results"]] == [2_100_000, 3_000_000]
    assert Result("ring", MiB, 4).spine_bytes_per_call is None       # single switch
    from netreduce.tools.bench.plot import plot
    plot(results, 4, "int32", tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_worker_keeps_k_calls_in_flight_through_the_fake_switch_and_reports_latency(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--in-flight 4: every allreduce job's calls verified, their latencies summed per rank
    (each at least the job's time per call, at most the whole job's)."""
    monkeypatch.setenv("NR_IN_FLIGHT", "4")
    plan = BenchPlan(workers=3, sizes=(4096,), algos=("switch",), jobs=1, warmup=0, iters=12,
                     in_flight=4)
    fabric = FakeFabric()

    def body(comm: Any, host: Any) -> list[Record]:
        records: list[Record] = []
        run(comm, plan, records.append)
        return records

    per_rank = run_ranks(3, body, fabric=fabric, controller=FakeController(fabric))
    for records in per_rank:
        assert isinstance(records, list), records
        link, switch = records
        assert switch.algo == "switch" and switch.ok and switch.calls == 12
        assert LATENCY not in link.counters
        assert switch.per_call_ns * 12 <= switch.counters[LATENCY] <= switch.ns * 12
    result = Result("switch", 4096, 3)
    result.add(per_rank[0][1])              # one rank's record: latency / (calls x workers)
    assert result.latency_us == pytest.approx(per_rank[0][1].counters[LATENCY] / 36 / 1e3)
    with pytest.raises(ValueError, match="in-flight >= 1"):
        BenchPlan(workers=3, sizes=(4096,), algos=("ring",), in_flight=0)
