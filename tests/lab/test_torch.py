"""PyTorch DDP with netreduce's comm hook and process group on real rxe, against DDP over
gloo (netreduce's store port goes through torch's store), in one launch of 4 ranks that
every test here reads. A rank imports torch, and DDP's first construction torch._dynamo:
~7 minutes of emulated CPU when 4 ranks do it (docs/tests.md). So the launch's ranks fork
from one fork server that imported both once and enters each host's namespace
(tests/lab/torchserver.py), not from the hosts' own servers; tests/lab/conftest.py starts it
when this module is collected, so its imports overlap the lab tests that run before.

The launch runs, as every rank's script: the README's DDP snippet verbatim (as a new user
would: nothing in the environment beyond what the lab and the launcher set, no
GLOO_SOCKET_IFNAME of our own; PYTHONPATH for the checks' import), one step of its model
with a README-CHECK line, then tests/lab/torch_worker.py's checks on the snippet's
communicator.

Inside the lab: scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_torch.py
"""
from __future__ import annotations

import re
import sys
import time

import pytest

from flowctl.plan import DEFAULT_RETRY_CNT
from netreduce.tools.launch import LaunchResult, launch
from tests.lab.labhosts import HOSTS
from tests.lab.readme import readme_snippets
from tests.lab.torchserver import TORCH_PRELOAD, TorchForkServer, TorchForkServerError
from tests.lab.workers import next_port, tree_env, user_env, why

pytestmark = pytest.mark.lab

# After the DDP snippet: one step on rank-specific inputs; DDP averages the gradients through
# the hook, so every rank must hold the same ones. Then the checks of torch_worker.py.
DDP_CHECK = """
import os, sys
torch.manual_seed(int(os.environ["RANK"]))
model(torch.randn(32, 64)).square().sum().backward()
g = torch.cat([p.grad.flatten() for p in model.parameters()])
print(f"README-CHECK ddp rank {os.environ['RANK']}: grad sum {g.double().sum().item():.6e} "
      f"algo {comm.last_algo}", flush=True)
from tests.lab import torch_worker
torch_worker.run(comm, sys.argv[1:])
"""

#: the rank that kills itself during backward at the end of the launch
VICTIM = 2


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory: pytest.TempPathFactory,
            torch_server: TorchForkServer) -> LaunchResult:
    """The one launch: the README's DDP snippet and its step, 5 steps of every mode against
    gloo, the bf16 and NaN checks, 200 steps through two restarts of the lab's switch and
    two flaps of a host's link, then rank VICTIM dies."""
    if HOSTS < 4:
        pytest.fail(f"the lab has {HOSTS} hosts, the test needs 4")
    where = tmp_path_factory.mktemp("torch")
    script = where / "readme_ddp_then_checks.py"
    script.write_text(readme_snippets()[1] + DDP_CHECK)
    # the library's finite retry budget (the lab's default is rxe's forever): each flap is
    # a transport fault
    env = {**tree_env(user_env()), "NR_RETRY_CNT": str(DEFAULT_RETRY_CNT)}
    waited = time.monotonic()
    try:
        listening = torch_server.ready(4)
    except TorchForkServerError as e:
        pytest.fail(str(e))
    waited = time.monotonic() - waited
    result = launch([sys.executable, str(script), "--steps", "5", "--restart-at", "30,110",
                     "--flap-at", "70,150",
                     "--survive-steps", "200", "--victim", str(VICTIM)], 4,
                    port=next_port(), timeout=1800, grace=120, env=env,
                    forkservers=str(torch_server.where))
    print(f"\n[torch] the fork server imported {TORCH_PRELOAD} in {listening:.0f} s from "
          f"its start at collection; the launch waited {waited:.0f} s for it")
    print("\n".join(x for x in result.ranks[0].output
                    if x.startswith(("OK", "FAIL", "README-CHECK"))))
    assert result.cold == 0, f"{result.cold} rank(s) started cold, not from the torch server"
    return result


def test_the_readme_ddp_snippet_trains_with_the_hook(ddp_job: LaunchResult) -> None:
    """The README's DDP snippet, run verbatim on 4 ranks: one step through its hook leaves
    every rank the same averaged gradients, summed by the switch."""
    checks = [x for r in ddp_job.ranks for x in r.output if x.startswith("README-CHECK ddp")]
    assert len(checks) == 4, "\n".join(why(ddp_job, r) for r in range(4))
    sums = {re.search(r"grad sum (\S+)", c)[1] for c in checks}
    assert len(sums) == 1, checks          # every rank holds the same averaged gradients
    assert all(c.endswith("algo switch") for c in checks), checks


def test_ddp_with_netreduce_against_gloo(ddp_job: LaunchResult) -> None:
    """The hook and the process group train like gloo, one step of the bf16 hook through
    the switch like torch's bf16_compress_hook over gloo, a NaN bucket goes over the ring
    like gloo, then rank 2 is killed during backward and the others name it."""
    for r in (r for r in range(4) if r != VICTIM):
        out = ddp_job.ranks[r].output
        assert ddp_job.ranks[r].returncode == 0, why(ddp_job, r)
        for mode in ("switch", "ring", "backend"):
            assert any(x.startswith(f"OK {mode}: max |param - gloo|") for x in out), \
                why(ddp_job, r)
        assert any(x.startswith("OK bf16 gradients: switch") for x in out), why(ddp_job, r)
        line = next(x for x in out if x.startswith("OK nan:"))
        assert f"netreduce: rank {r}: DDP gradient bucket" in line and "holds NaN or Inf" in line
        line = next(x for x in out if x.startswith("OK error:"))
        # DDP re-raises the hook's PeerFailure from C++ (as a RuntimeError): its message
        assert f"rank {VICTIM}: its process died" in line \
            and f"rank {r}: allreduce call" in line, line
    assert ddp_job.ranks[VICTIM].returncode == -9


def test_ddp_trains_through_two_switch_restarts_and_two_link_flaps(
        ddp_job: LaunchResult) -> None:
    """Issues 24 and 40: 200 DDP steps with netreduce's hook next to gloo, the lab's switch
    restarted at steps 30 and 110, rank 1's link dark for 3 s at steps 70 and 150 (a
    transport fault each): no exception, the parameters within 1e-5 of gloo's, a recovered
    fault per flap and a fallback (or an "inc" rebuilt at once) per restart on every rank
    (the victim dies only after)."""
    for r in range(4):
        out = ddp_job.ranks[r].output
        assert any(x.startswith("OK survive: max |param - gloo|") for x in out), \
            why(ddp_job, r)
    print("\n".join(x for x in ddp_job.ranks[0].output if x.startswith(("OK survive",
                                                                        "netreduce: "))))
