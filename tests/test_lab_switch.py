"""scripts/lab_switch.sh, lab.sh's switch, with stubs instead of the lab (no VM, no namespace,
no p4c): a BMv2 kind's P4 programs are compiled before the switch's readiness clock starts,
so a fresh clone's first `scripts/lab.sh --racks 2 --switch bmv2` is not cut off mid-compile
(issue 37). The stub python logs each call; as `-m switch.p4.program` it takes longer than
the readiness limit, as a switch it writes its ready file at once."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPILE_SECONDS = 1.5          # the stub p4c's time: longer than the readiness limit below

STUB_PYTHON = """#!/bin/bash
echo "$*" >> "$STUB_CALLS"
if [ "$1 $2" = "-m switch.p4.program" ]; then
  echo "p4program: compiling $3 (stub)" >&2
  sleep "$STUB_COMPILE_SECONDS"
  [ -z "${STUB_P4C_FAIL:-}" ] || exit 1
  exit 0
fi
while [ $# -gt 0 ]; do [ "$1" = --ready-file ] && ready=$2; shift; done
touch "$ready"
exec sleep 60
"""
STUB_IP = """#!/bin/sh
[ "$1 $2" = "netns exec" ] || exit 2
shift 3
exec "$@"
"""
DRIVER = """set -euo pipefail
ports=(--port 1=nrtap0 --port 2=nrtap1)
say() { echo "[lab] $*" >&2; }
. "$ROOT/scripts/lab_switch.sh"
SWITCH_START_TIMEOUT=1
if switch_start "$KIND"; then echo "STARTED $(cat "$LABDIR/switch.kind")"
else echo "FAILED $switch_error"; fi
switch_stop
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def start(tmp_path: Path, kind: str, fail: bool = False) -> tuple[str, str, list[str]]:
    """switch_start KIND through the stubs: its stdout, stderr and the stub python's calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "ip", STUB_IP)
    lab = tmp_path / "lab"
    lab.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ROOT": str(ROOT),
           "PY": str(executable(tmp_path / "python", STUB_PYTHON)), "LABDIR": str(lab),
           "SWNS": "nrxecostub", "hosts": "4", "CTL_IP": "10.77.0.254", "CTL_PORT": "50051",
           "switch": kind, "KIND": kind, "STUB_CALLS": str(tmp_path / "calls"),
           "STUB_COMPILE_SECONDS": str(COMPILE_SECONDS)}
    if fail:
        env["STUB_P4C_FAIL"] = "1"
    run = subprocess.run(["bash", "-c", DRIVER], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    return run.stdout, run.stderr, [" ".join(c.split()[:4]) for c in calls]


@pytest.mark.parametrize("kind, compiles, module", [
    ("bmv2", ["-m switch.p4.program --progress"], "-m labswitches.bmv2_lab --port 1=nrtap0"),
    ("racks:2:0:bmv2:bmv2", ["-m switch.p4.program --tor --progress",
                             "-m switch.p4.program --spine --progress"],
     "-m labswitches.fabric_lab --port 1=nrtap0"),
    ("racks:2:0:bmv2", ["-m switch.p4.program --spine --progress"],
     "-m labswitches.fabric_lab --port 1=nrtap0"),
    ("racks:2", [], "-m labswitches.fabric_lab --port 1=nrtap0"),
    ("soft", [], "-m switch --port 1=nrtap0"),
])
def test_a_bmv2_kind_compiles_its_programs_before_the_readiness_clock_with_stubs(
        tmp_path: Path, kind: str, compiles: list[str], module: str) -> None:
    """Each compile takes 1.5 s, the readiness limit is 1 s: the switch still comes up, so
    the compile is not on its clock; the compiles come first, their progress on stderr."""
    out, err, calls = start(tmp_path, kind)
    assert out == f"STARTED {kind}\n", err
    assert calls == [*compiles, module]
    assert err.count("[lab] p4program: compiling ") == len(compiles), err


def test_the_native_kind_is_the_switch_process_on_the_c_data_plane_with_stubs(
        tmp_path: Path) -> None:
    out, err, calls = start(tmp_path, "native")
    assert out == "STARTED native\n", err
    [call] = (tmp_path / "calls").read_text().splitlines()
    assert call.startswith("-m switch --port 1=nrtap0 --port 2=nrtap1 --target native "
                           "--controller 10.77.0.254:50051 "), call


def test_a_failed_compile_starts_no_switch_and_says_why_with_stubs(tmp_path: Path) -> None:
    out, err, calls = start(tmp_path, "racks:2:0:bmv2:bmv2", fail=True)
    assert out == ("FAILED the racks:2:0:bmv2:bmv2 switch: p4c could not compile switch/p4 "
                   "for the tor (build/p4*/p4c.log)\n"), err
    assert calls == ["-m switch.p4.program --tor --progress"]


def test_lab_sh_starts_its_switch_through_lab_switch_sh() -> None:
    """lab.sh sources lab_switch.sh before its first switch_start and defines no second
    switch_start of its own."""
    text = (ROOT / "scripts/lab.sh").read_text()
    sourced = text.index('. "$ROOT/scripts/lab_switch.sh"')
    assert sourced < text.index('switch_start "$switch"')
    assert "switch_start() {" not in text and "p4_build" not in text
