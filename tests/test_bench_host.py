"""benchmarks/bench_host.py on the in-process fabric (tests/fakefabric.py): it runs and its
figures are sane (no timed asserts: the targets live in docs/benchmarks.md)."""
from __future__ import annotations

import math

from benchmarks.bench_host import NOT_LIBRARY, copy_bandwidth, main, measure


def test_bench_host_reports_sane_figures_on_the_fake_fabric() -> None:
    rows = measure([4, 64 * 1024, 1 << 20], ["int32", "float32"], ranks=2, budget=0.002, repeat=2)
    assert [(r["dtype"], r["bytes"]) for r in rows] == [
        (d, s) for d in ("int32", "float32") for s in (4, 64 * 1024, 1 << 20)]
    for r in rows:
        assert 5 <= r["calls"] <= 200
        # records, then the data and seal in 256 KiB messages (none for an inline call)
        data_messages = 0 if r["bytes"] <= 128 else -(-(r["bytes"] + 8) // (256 * 1024))
        assert r["messages"] == 1 + data_messages
        assert 0 < r["library_us"] <= r["thread_us"] * 1.5
        assert math.isclose(r["gbps"], r["bytes"] * 8 / (r["library_us"] * 1e3))
        assert r["split_us"]["call"] > 0 and r["split_us"]["transfer"] > 0
        assert set(NOT_LIBRARY) & set(r["split_us"])     # the stand-in NIC was counted apart
    assert rows[2]["split_us"]["deliver"] > 0          # 1 MiB int32: the copy out


def test_copy_bandwidth_is_plausible() -> None:
    assert 1e8 < copy_bandwidth(1 << 20, repeat=2) < 1e12


def test_bench_host_command_prints_a_table_on_the_fake_fabric(capsys) -> None:
    assert main(["--sizes", "4", "--dtypes", "int32", "--budget", "0.001"]) == 0
    out = capsys.readouterr().out
    assert out.count("BENCH_HOST {") == 1 and "one core's copy bandwidth" in out
