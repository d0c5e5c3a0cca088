"""PyTorch DDP with netreduce's comm hook on real rxe, against DDP over gloo (the same
process group carries gloo; netreduce's store port goes through its store).

Inside the lab: scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_torch.py
torch imports slowly under TCG: few, small runs.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from netreduce.launch import LaunchResult, launch
from tests.lab.labhosts import HOSTS, ROOT
from tests.lab.test_allreduce import _ports

pytestmark = pytest.mark.lab

EXAMPLE = ROOT / "examples" / "train_mlp.py"
WORKER = Path(__file__).with_name("torch_worker.py")


def run(n: int, script: Path, *args: str, grace: float = 30) -> LaunchResult:
    if n > HOSTS:
        pytest.fail(f"the lab has {HOSTS} hosts, the test needs {n}")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "nr0", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return launch([sys.executable, str(script), *args], n, port=next(_ports), timeout=900,
                  grace=grace, env=env)


@pytest.mark.parametrize("n", [2, 4])
def test_the_hook_trains_like_gloo(n: int) -> None:
    """5 steps from the same parameters on the same data: netreduce's hook (switch, ring)
    and DDP over the netreduce process group end within 1e-5 of DDP over gloo (parameters ~0.1; one wrong contribution would move
    them ~1e-3; the float32 quantization error is ~1e-8 per step)."""
    result = run(n, EXAMPLE, "--steps", "5", "--log-every", "1", "--modes", "gloo,switch,ring,backend",
                 "--hidden", "64", "--max-param-diff", "1e-5")
    out = result.ranks[0].output
    assert result.ok and "OK train_mlp" in out, "\n".join(out)
    assert any(re.match(r"switch +step +4 .*\(switch\)$", line) for line in out), out
    assert any(re.match(r"ring +step +4 .*\(ring\)$", line) for line in out), out
    assert any(re.match(r"backend +step +4 .*\(backend: switch\)$", line) for line in out), out


def test_a_nan_bucket_goes_over_the_ring_like_gloo() -> None:
    result = run(2, WORKER, "nan")
    for r in range(2):
        out = result.ranks[r].output
        assert result.ok, "\n".join(out)
        line = next(x for x in out if x.startswith("OK nan:"))
        assert f"netreduce: rank {r}: DDP gradient bucket" in line and "holds NaN or Inf" in line


def test_a_rank_that_dies_during_backward_is_named_on_the_others() -> None:
    result = run(3, WORKER, "die", "--victim", "2", grace=120)
    assert result.ranks[2].returncode == -9
    for r in (0, 1):
        out = result.ranks[r].output
        assert result.ranks[r].returncode == 0, "\n".join(out)
        line = next(x for x in out if x.startswith("OK error:"))
        assert "rank 2: its process died" in line and "PeerFailure" in line, line
