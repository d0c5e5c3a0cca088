"""The README's code in the lab, as a new user would run it: nothing in the environment
beyond what the lab and the launcher set (no GLOO_SOCKET_IFNAME of our own).

- The main job and the benchmark with its plot: the README's commands as it writes them
  (read from README.md; only the output paths moved to the test's directory), checked by
  what they print and write.
- The library snippets, run verbatim under the lab launcher (`netreduce launch --hosts N --
  python snippet.py`), each followed by a short check of ours that prints one line per
  rank. The numpy snippet runs here on 4 ranks; the DDP one opens the one torch launch of
  tests/lab/test_torch.py (each launch of torch ranks costs minutes of emulated CPU), which
  checks it the same way.

Inside the lab: scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_readme.py
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from netreduce.tools.bench.results import validate
from netreduce.tools.launch import LaunchResult, launch
from tests.lab.labhosts import HOSTS
from tests.lab.readme import lab_command, readme_snippets
from tests.lab.workers import next_port, tree_env, user_env
from tests.switchml_lines import JOB_LINE

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



def run_readme_command(argv: list[str], timeout: float) -> str:
    """`argv` run in the lab's root namespace as the lab's shell runs a command (this tree
    first on PYTHONPATH); it must exit 0. Its stdout, then its stderr (read apart: a line
    of one is never cut by the other)."""
    p = subprocess.run(argv, capture_output=True, text=True, env=tree_env(user_env()),
                       timeout=timeout)
    assert p.returncode == 0, f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p.stdout + "\n" + p.stderr


def test_the_main_job_checks_its_sum_and_prints_its_goodput() -> None:
    """The README's main job, `netreduce launch --hosts 4 -- netreduce demo`: 4 ranks each
    reduce 16 MiB of int32 through the switch; rank 0 prints the exact check and the
    goodput, busbw = algbw x 2(n-1)/n."""
    argv = lab_command("netreduce", "launch", "--hosts", "4", "--", "netreduce", "demo")
    n = int(argv[argv.index("--hosts") + 1])
    if HOSTS < n:
        pytest.fail(f"the lab has {HOSTS} hosts, the main job needs {n}")
    out = run_readme_command(argv, timeout=900)
    count = 16 * 2**20 // 4                      # the README's 16 MiB of int32 per rank
    assert re.search(rf"^\[rank 0\] netreduce: {n} rank\(s\); 'inc' ring \S+ registered with "
                     rf"the switch at ", out, re.M), out
    assert re.search(rf"^\[rank 0\] allreduce int32\[{count}\] \(16\.00 MiB\) x \d+, algo=auto "
                     rf"-> switch: ", out, re.M), out
    assert re.search(rf"^\[rank 0\] result check: OK \({count} elements, exact\)$", out,
                     re.M), out
    goodput = re.search(rf"^\[rank 0\] algbw (\d+\.\d{{4}}) Gbit/s \(busbw (\d+\.\d{{4}})\) "
                        rf"over {n} ranks, algo=switch$", out, re.M)
    assert goodput, out
    algbw, busbw = float(goodput[1]), float(goodput[2])
    assert algbw > 0 and busbw == pytest.approx(algbw * 2 * (n - 1) / n, abs=2e-4), goodput[0]
    assert "FAIL" not in out, out
    print(f"\n[README main job] {goodput[0]}")


def test_the_benchmark_prints_its_jobs_and_writes_its_plot(tmp_path: Path) -> None:
    """The README's benchmark command, its --json and --plot written to the test's
    directory: every (size, column) of the JSON verified against numpy, --jobs timed jobs
    each, a SwitchML job line with a positive duration per timed job and a summary headed
    without VERIFICATION FAILED per (size, column); the plot a PNG."""
    argv = lab_command("netreduce", "bench")
    workers = int(argv[argv.index("--workers") + 1])
    if HOSTS < workers:
        pytest.fail(f"the lab has {HOSTS} hosts, the benchmark needs {workers}")
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    argv[argv.index("--json") + 1] = str(json_path)
    argv[argv.index("--plot") + 1] = str(png_path)
    out = run_readme_command(argv, timeout=3600)
    assert f"wrote {json_path}" in out and f"wrote {png_path}" in out, out
    doc = json.loads(json_path.read_text())
    validate(doc)
    results = doc["results"]
    assert doc["meta"]["workers"] == workers and results, doc["meta"]
    assert {"link", *doc["meta"]["algos"]} <= {r["algo"] for r in results}, results
    assert all(r["verified"] for r in results), results
    if "--jobs" in argv:
        jobs_each = int(argv[argv.index("--jobs") + 1])
        assert all(len(r["jobs"]) == jobs_each for r in results), results
    jobs = [JOB_LINE.fullmatch(line) for line in out.splitlines() if line.startswith("Job(s)")]
    assert jobs and all(jobs), out
    assert len(jobs) == sum(len(r["jobs"]) for r in results), out
    # a job's duration is positive; its goodput, printed to 4 decimals, is 0.0000 at 4 B
    assert all(int(m[2]) > 0 and float(m[3]) >= 0 for m in jobs if m), out
    columns = "|".join(sorted({re.escape(r["algo"]) for r in results}))
    headers = [line for line in out.splitlines()
               if re.match(rf"({columns}) \d+ (B|KiB|MiB|GiB) \(\d+ jobs", line)]
    assert len(headers) == len(results), out
    assert not any("VERIFICATION FAILED" in h for h in headers), headers
    png = png_path.read_bytes()
    assert len(png) > 8 and png[:8] == b"\x89PNG\r\n\x1a\n", png[:16]
    print(f"\n[README benchmark] {len(results)} (size, column) pairs, {len(jobs)} jobs, "
          f"plot {len(png)} B")
