"""PyTorch DDP with netreduce's comm hook and process group on real rxe, against DDP over
gloo (netreduce's store port goes through torch's store), in one launch of 4 ranks
(tests/lab/torch_worker.py) that both tests read: each launch imports torch on every rank,
minutes of emulated CPU.

Inside the lab: scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_torch.py
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
    return launch([sys.executable, str(script), *args], n, port=next(_ports), timeout=1800,
                  grace=grace, env=env)


#: the rank that kills itself during backward at the end of the launch
VICTIM = 2


@pytest.fixture(scope="module")
def ddp_job() -> LaunchResult:
    """The one launch: 5 steps of every mode against gloo, the bf16 and NaN checks, 200
    steps through two restarts of the lab's switch, then rank VICTIM dies."""
    result = run(4, WORKER, "--steps", "5", "--restart-at", "40,120", "--survive-steps", "200",
                 "--victim", str(VICTIM), grace=120)
    print("\n".join(x for x in result.ranks[0].output if x.startswith(("OK", "FAIL"))))
    return result


def test_ddp_with_netreduce_against_gloo(ddp_job: LaunchResult) -> None:
    """The hook and the process group train like gloo, one step of the bf16 hook through
    the switch like torch's bf16_compress_hook over gloo, a NaN bucket goes over the ring
    like gloo, then rank 2 is killed during backward and the others name it (the README's
    DDP snippet runs cleanly on 4 ranks in tests/lab/test_readme.py)."""
    for r in (r for r in range(4) if r != VICTIM):
        out = ddp_job.ranks[r].output
        assert ddp_job.ranks[r].returncode == 0, "\n".join(out[-40:])
        for mode in ("switch", "ring", "backend"):
            assert any(x.startswith(f"OK {mode}: max |param - gloo|") for x in out), out
        assert any(x.startswith("OK bf16 gradients: switch") for x in out), out
        line = next(x for x in out if x.startswith("OK nan:"))
        assert f"netreduce: rank {r}: DDP gradient bucket" in line and "holds NaN or Inf" in line
        line = next(x for x in out if x.startswith("OK error:"))
        # DDP re-raises the hook's PeerFailure from C++ (as a RuntimeError): its message
        assert f"rank {VICTIM}: its process died" in line \
            and f"rank {r}: allreduce call" in line, line
    assert ddp_job.ranks[VICTIM].returncode == -9


def test_ddp_trains_through_two_switch_restarts(ddp_job: LaunchResult) -> None:
    """Issue 24: 200 DDP steps with netreduce's hook next to gloo, the lab's switch
    restarted at steps 40 and 120: no exception, the parameters within 1e-5 of gloo's,
    two fallbacks (every rank, the victim included: it dies only after)."""
    for r in range(4):
        out = ddp_job.ranks[r].output
        assert any(x.startswith("OK survive: max |param - gloo|") for x in out), out[-40:]
    print("\n".join(x for x in ddp_job.ranks[0].output if x.startswith(("OK survive",
                                                                        "netreduce: "))))
