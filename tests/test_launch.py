"""The launcher, with --local ranks (no lab): environment, prefixes, exit codes, stopping."""
from __future__ import annotations

import hashlib
import hmac
import io
import sys
import time
from pathlib import Path

import pytest

from netreduce.tools import launch as L

PY = sys.executable


def run(code: str, hosts: int, **kw: object) -> tuple[L.LaunchResult, str]:
    out = io.StringIO()
    result = L.launch([PY, "-c", code], hosts, local=True, out=out, port=29999, **kw)  # type: ignore[arg-type]
    return result, out.getvalue()


def test_every_rank_gets_its_environment_and_a_prefix() -> None:
    code = ("import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], "
            "os.environ['LOCAL_RANK'], os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])")
    result, text = run(code, 3)
    assert result.ok and result.exit_code == 0
    for r in range(3):
        assert result.ranks[r].output == [f"{r} 3 {r} 127.0.0.1 29999"]
        assert f"[rank {r}] {r} 3 {r} 127.0.0.1 29999\n" in text
    assert "[launch] rank 0: exit 0; rank 1: exit 0; rank 2: exit 0" in text


def rank_key(secret: str, rank: int) -> str:
    """HKDF-SHA256 (RFC 5869) of the job's secret for "rank R", salt "netreduce rendezvous
    store", 32 bytes in hex: docs/security.md's derivation, written apart from the code."""
    prk = hmac.new(b"netreduce rendezvous store", secret.encode(), hashlib.sha256).digest()
    return hmac.new(prk, f"rank {rank}".encode() + b"\x01", hashlib.sha256).hexdigest()


def test_every_launch_hands_rank_0_a_fresh_job_secret_and_the_others_only_their_keys(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-rank credentials (issue 39): a rank holding only its own key can claim no other
    rank; rank 0 serves the store and so holds the secret."""
    monkeypatch.delenv("NR_JOB_SECRET", raising=False)
    monkeypatch.setenv("NR_RANK_KEY", "f" * 64)                # not passed on
    code = ("import os; print(os.environ.get('NR_JOB_SECRET', '-'), "
            "os.environ.get('NR_RANK_KEY', '-'))")
    first, _ = run(code, 3)
    second, _ = run(code, 3)
    for job in (first, second):
        secret, no_key = job.ranks[0].output[0].split()
        assert len(secret) == 32 and no_key == "-"               # fresh, 128 bits
        assert [r.output[0] for r in job.ranks[1:]] == [f"- {rank_key(secret, r)}"
                                                         for r in (1, 2)]
    assert first.ranks[0].output != second.ranks[0].output
    monkeypatch.setenv("NR_JOB_SECRET", "the-users-own-secret-000")     # the user's wins
    mine, _ = run(code, 2)
    assert [r.output[0] for r in mine.ranks] == [
        "the-users-own-secret-000 -", f"- {rank_key('the-users-own-secret-000', 1)}"]


def test_lab_ranks_point_torch_at_the_lab_interface_unless_told_otherwise() -> None:
    """gloo advertises the namespace hostname's address ([::1]) unless told the interface:
    in the lab's namespaces the launcher names nr0; a user's own setting wins; --local
    leaves them alone."""
    lab = L.rank_env(1, 4, "10.77.0.1", 29500, False, {"PATH": "/bin"})
    assert (lab["GLOO_SOCKET_IFNAME"], lab["TP_SOCKET_IFNAME"]) == ("nr0", "nr0")
    assert (lab["RANK"], lab["WORLD_SIZE"], lab["LOCAL_RANK"]) == ("1", "4", "0")
    mine = L.rank_env(0, 4, "10.77.0.1", 29500, False, {"GLOO_SOCKET_IFNAME": "eth9"})
    assert mine["GLOO_SOCKET_IFNAME"] == "eth9" and mine["TP_SOCKET_IFNAME"] == "nr0"
    local = L.rank_env(0, 2, "127.0.0.1", 29500, True, {})
    assert "GLOO_SOCKET_IFNAME" not in local and "TP_SOCKET_IFNAME" not in local


def test_a_failing_rank_stops_the_others_after_the_grace_period() -> None:
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '1': print('boom', file=sys.stderr); sys.exit(3)\n"
            "time.sleep(60)")
    t0 = time.monotonic()
    result, text = run(code, 3, grace=0.5)
    assert time.monotonic() - t0 < 20
    assert result.exit_code == 3 and not result.ok
    assert result.ranks[1].returncode == 3 and not result.ranks[1].stopped
    assert result.ranks[0].stopped and result.ranks[2].stopped
    assert "[rank 1] boom" in text and "rank 1 exited with code 3" in text


def test_the_global_timeout_stops_everything() -> None:
    result, text = run("import time; time.sleep(60)", 2, timeout=0.5)
    assert result.timed_out and result.exit_code == L.TIMEOUT_EXIT
    assert all(r.stopped for r in result.ranks)
    assert "timeout after 0.5s" in text


def test_lab_mode_needs_the_namespaces(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(L, "NETNS_DIR", tmp_path)
    (tmp_path / "h0").touch()
    with pytest.raises(ValueError, match="namespace.s. h1, h2 do not exist"):
        L.launch(["true"], 3)
    (tmp_path / "h2").touch()                 # ranks 0, 1 on h2, h3: a tenant's share
    with pytest.raises(ValueError, match=r"namespace.s. h3 do not exist.*--hosts 4 "):
        L.launch(["true"], 2, first_host=2)


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert L.main(["--hosts", "2", "--local", "--port", "29998", "--",
                   PY, "-c", "import os; print('hi', os.environ['RANK'])"]) == 0
    out = capsys.readouterr().out
    assert "[rank 0] hi 0" in out and "[rank 1] hi 1" in out
    assert L.main(["--hosts", "1", "--local", "--", PY, "-c", "raise SystemExit(5)"]) == 5
    assert L.main(["--hosts", "0", "--local", "--", "true"]) == 2
