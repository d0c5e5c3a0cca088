"""benchmarks.bench_bmv2 without BMv2: its build arguments and what it derives from a run."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_bmv2 import Run, parse_build


def build_dir(tmp_path: Path, program: str = "netreduce") -> Path:
    for name in (f"{program}.json", f"{program}.p4info.txtpb"):
        (tmp_path / name).write_text("{}")
    return tmp_path


def test_a_build_argument_names_its_modes(tmp_path: Path) -> None:
    d = build_dir(tmp_path)
    assert parse_build(f"v1={d}") == ("v1", d, ("forward", "aggregate"))
    assert parse_build(f"l2={d}:forward") == ("l2", d, ("forward",))
    (tmp_path / "tor").mkdir()
    tor = build_dir(tmp_path / "tor", "tor")
    assert parse_build(f"tor={tor}:tor") == ("tor", tor, ("tor",))       # tor.json there


@pytest.mark.parametrize("text, error", [
    ("nobuild", "expected NAME=BUILD_DIR"),
    ("=dir", "expected NAME=BUILD_DIR"),
    ("v1={d}:forward,mirror", r"unknown mode\(s\) \['mirror'\]"),
    ("v1={d}/nowhere", "missing .*nowhere/netreduce.json"),
    ("t={d}:tor", "missing .*/tor.json"),
    ("t={d}:tor,forward", "a role's build runs its role's mode alone"),
])
def test_a_bad_build_argument_says_what_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_build(text.format(d=build_dir(tmp_path)))


def test_a_run_reports_cpu_per_frame_sent_and_per_slot() -> None:
    run = Run("v1", "off", "aggregate", 2048, 2048, 1.6, 1.2288, 2048, 512, 2048)
    assert run.row == "v1/off/aggregate"
    assert run.us_per_frame == pytest.approx(600.0)
    assert run.us_per_slot == pytest.approx(2400.0)
    assert "600.0 us/frame" in run.line() and "1667 frames per CPU-s" in run.line()
    assert "2400.0 us/slot" in run.line() and "aggregated 2048" in run.line()


def test_role_traffic_is_what_the_software_roles_exchange() -> None:
    """300 slots of 2 x 2 (slots reused past 256): ToR 0's two contributions per slot on
    its host ports, the spine's total for it, both ToRs' partials on spine ports 1 and 2."""
    from switch.dataplane.interswitch import Kind, decode, is_interswitch
    from benchmarks.bench_bmv2 import role_traffic
    t = role_traffic(300)
    assert [p for p, _ in t.contributions[:4]] == [1, 2, 1, 2] and len(t.contributions) == 600
    assert [p for p, _ in t.partials[:4]] == [1, 2, 1, 2] and len(t.partials) == 600
    for k in (0, 299):
        total = decode(memoryview(t.totals[k]))
        assert (total.kind, total.tor, total.k) == (Kind.TOTAL, 0, k)
        assert [decode(memoryview(f)).tor for _, f in t.partials[2 * k:2 * k + 2]] == [0, 1]
    assert all(is_interswitch(f) for f in t.totals)
