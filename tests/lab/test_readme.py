"""The README's library snippets, run verbatim under the lab launcher as a new user would
run them (`netreduce launch --hosts N -- python snippet.py`): nothing in the environment
beyond what the lab and the launcher set (no GLOO_SOCKET_IFNAME of our own). Each snippet is
followed by a short check of ours that prints one line per rank. The numpy snippet runs
here on 4 ranks; the DDP one opens the one torch launch of tests/lab/test_torch.py (each
launch of torch ranks costs minutes of emulated CPU), which checks it the same way.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from netreduce.tools.launch import LaunchResult, launch
from tests.lab.labhosts import HOSTS
from tests.lab.readme import readme_snippets
from tests.lab.workers import next_port, user_env

pytestmark = pytest.mark.lab

# After the numpy snippet: x holds the sum of every rank's x (the first, in-place call),
# within the README's float32 bound n 2^-(e+1) (1 + 2^-24) + 2^-24 |S| + 2^-150,
# e = 30 - ceil(log2 n) - floor(log2 max|x|) (max over every rank's input).
NUMPY_CHECK = """
import math, os
n = int(os.environ["WORLD_SIZE"])
expected = np.arange(1_000_000, dtype=np.float64) * (n * (n + 1) // 2)
e = 30 - math.ceil(math.log2(n)) - math.floor(math.log2(999_999 * n))
bound = n * 2.0 ** -(e + 1) * (1 + 2.0 ** -24) + 2.0 ** -24 * np.abs(expected) + 2.0 ** -150
excess = float(np.max(np.abs(x - expected) - bound))
print(f"README-CHECK numpy rank {os.environ['RANK']}: worst error - bound {excess:.3e}", flush=True)
assert excess <= 0, excess
"""


def run_snippet(code: str, tmp_path: Path, name: str, n: int) -> tuple[LaunchResult, list[str]]:
    if HOSTS < n:
        pytest.fail(f"the lab has {HOSTS} hosts, the test needs {n}")
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    result = launch([sys.executable, str(script)], n, port=next_port(), timeout=900,
                    grace=30, env=user_env())
    checks = [line for r in result.ranks for line in r.output if line.startswith("README-CHECK")]
    for r in result.ranks:
        assert r.returncode == 0, "\n".join(r.output)
    return result, checks


def test_the_readme_has_the_two_library_snippets() -> None:
    numpy_snippet, ddp_snippet = readme_snippets()
    assert "netreduce.allreduce(x)" in numpy_snippet
    assert "register_comm_hook" in ddp_snippet and 'init_process_group("gloo")' in ddp_snippet


def test_the_numpy_snippet_sums_through_the_switch(tmp_path: Path) -> None:
    snippet = readme_snippets()[0]
    result, checks = run_snippet(snippet + NUMPY_CHECK, tmp_path, "readme_numpy", 4)
    assert len(checks) == 4, checks
    for r in result.ranks:     # the snippet's own print(comm.last_algo)
        assert "switch" in r.output, r.output
