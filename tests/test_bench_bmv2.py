"""tools.bench_bmv2 without BMv2: its build arguments and what it derives from a run."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench_bmv2 import Run, parse_build


def build_dir(tmp_path: Path) -> Path:
    for name in ("netreduce.json", "netreduce.p4info.txtpb"):
        (tmp_path / name).write_text("{}")
    return tmp_path


def test_a_build_argument_names_its_modes(tmp_path: Path) -> None:
    d = build_dir(tmp_path)
    assert parse_build(f"v1={d}") == ("v1", d, ("forward", "aggregate"))
    assert parse_build(f"l2={d}:forward") == ("l2", d, ("forward",))


@pytest.mark.parametrize("text, error", [
    ("nobuild", "expected NAME=BUILD_DIR"),
    ("=dir", "expected NAME=BUILD_DIR"),
    ("v1={d}:forward,mirror", r"unknown mode\(s\) \['mirror'\]"),
    ("v1={d}/nowhere", "missing .*nowhere/netreduce.json"),
])
def test_a_bad_build_argument_says_what_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_build(text.format(d=build_dir(tmp_path)))


def test_a_run_reports_cpu_per_frame_sent() -> None:
    run = Run("v1", "off", "aggregate", 2048, 2048, 1.6, 1.2288, 2048)
    assert run.row == "v1/off/aggregate"
    assert run.us_per_frame == pytest.approx(600.0)
    assert "600.0 us/frame" in run.line() and "1667 frames per CPU-s" in run.line()
    assert "aggregated 2048" in run.line()
