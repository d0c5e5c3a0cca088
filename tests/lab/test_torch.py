"""PyTorch DDP with netreduce's comm hook and process group on real rxe, against DDP over
gloo (netreduce's store port goes through torch's store): one launch per world size.

Inside the lab: scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_torch.py
torch imports slowly under TCG: few, small runs.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from netreduce.tools.launch import LaunchResult, launch
from tests.lab.labhosts import HOSTS, ROOT
from tests.lab.test_allreduce import _ports

pytestmark = pytest.mark.lab

WORKER = Path(__file__).with_name("torch_worker.py")


def run(n: int, script: Path, *args: str, grace: float = 30) -> LaunchResult:
    if n > HOSTS:
        pytest.fail(f"the lab has {HOSTS} hosts, the test needs {n}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return launch([sys.executable, str(script), *args], n, port=next(_ports), timeout=900,
                  grace=grace, env=env)


def test_ddp_with_netreduce_against_gloo() -> None:
    """tests/lab/torch_worker.py on 4 ranks: the hook and the process group train like gloo,
    a NaN bucket goes over the ring like gloo, then rank 2 is killed during backward and the
    others name it. One launch covers it all: the survivors check every mode before the
    victim dies (a clean 2-rank launch proved nothing more, for 4 of CI's minutes; the
    README's DDP snippet runs cleanly on 4 ranks in tests/lab/test_readme.py)."""
    n, victim = 4, 2
    result = run(n, WORKER, "--steps", "5", "--victim", str(victim), grace=120)
    for r in (r for r in range(n) if r != victim):
        out = result.ranks[r].output
        assert result.ranks[r].returncode == 0, "\n".join(out)
        for mode in ("switch", "ring", "backend"):
            assert any(x.startswith(f"OK {mode}: max |param - gloo|") for x in out), out
        line = next(x for x in out if x.startswith("OK nan:"))
        assert f"netreduce: rank {r}: DDP gradient bucket" in line and "holds NaN or Inf" in line
        line = next(x for x in out if x.startswith("OK error:"))
        # DDP re-raises the hook's PeerFailure from C++ (as a RuntimeError): its message
        assert f"rank {victim}: its process died" in line \
            and f"rank {r}: allreduce call" in line, line
    assert result.ranks[victim].returncode == -9


def test_ddp_trains_through_two_switch_restarts() -> None:
    """Issue 24: 200 DDP steps with netreduce's hook next to gloo, the lab's switch
    restarted at steps 40 and 120: no exception, the parameters within 1e-5 of gloo's,
    two fallbacks."""
    result = run(4, WORKER, "--steps", "200", "--restart-at", "40,120", grace=120)
    for r in range(4):
        out = result.ranks[r].output
        assert result.ranks[r].returncode == 0, "\n".join(out[-40:])
        assert any(x.startswith("OK survive: max |param - gloo|") for x in out), out[-40:]
    print("\n".join(x for x in result.ranks[0].output if x.startswith(("OK survive",
                                                                       "netreduce: "))))
