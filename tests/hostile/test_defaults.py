"""The switch process started with no security options (issue 39): its controller asks for
credentials it made itself, serves TLS with a certificate it made on an address the hosts
reach, refuses two principals without a hosts policy, and writes --stats-file privately.
Each test failed on the commit before (the defaults were open)."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from nr_contract import control_pb2 as pb
from nr_contract.client import ControllerClient
from tests.hostile.netns import ALICE, BOB, CONTROL_IP, HOSTS_NS, ROOT, SwitchRig

SERVICE = "/netreduce.control.v1.Controller/"
CONTROL_ADDR = f"{CONTROL_IP}:50051"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where a switch started with no options keeps what it makes ($XDG_STATE_HOME)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "netreduce-switch"


def ctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m switch.ctl ARGS` on the hosts' side of the control link."""
    return subprocess.run(
        ["ip", "netns", "exec", HOSTS_NS, sys.executable, "-m", "switch.ctl", "--addr",
         CONTROL_ADDR, "--timeout", "3", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_a_controller_given_no_token_file_makes_one_and_asks_for_it(tmp_path: Path,
                                                                      state: Path) -> None:
    """Before: every caller was `anonymous` and read every ring's R_Key, VA and PSNs."""
    sock = tmp_path / "ctl.sock"
    rig = SwitchRig(tmp_path, controller_args=["--controller", f"unix:{sock}"])
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            with pytest.raises(grpc.RpcError) as e:
                channel.unary_unary(SERVICE + "Counters")(pb.CountersRequest().SerializeToString(),
                                                          timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        token = state / "controller.token"
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert f"made {token} (principal 'default'); a client needs " \
               f"NR_CONTROLLER_TOKEN={token}" in rig.log()
        with ControllerClient(f"unix:{sock}", timeout=10, token_file=token) as client:
            assert client.counters()["rings"] == {}
    finally:
        rig.close()


def test_a_controller_on_the_network_serves_tls_with_a_certificate_it_made(
        tmp_path: Path, state: Path) -> None:
    """Before: clear text on 10.99.0.254, secrets replayable by anyone on the link. Now a
    host's client refuses clear text on its own, a clear-text one that insists gets no
    answer, and one given the certificate the switch made (and its token) is served."""
    rig = SwitchRig(tmp_path, controller_args=["--controller", CONTROL_ADDR], control_link=True)
    try:
        token, cert = state / "controller.token", state / f"controller-{CONTROL_IP}.pem"
        assert stat.S_IMODE((state / f"controller-{CONTROL_IP}.key").stat().st_mode) == 0o600
        clear = ctl("--token-file", str(token), "counters")
        assert clear.returncode == 1 and "no CA file to speak TLS with" in clear.stderr, clear
        insisting = ctl("--token-file", str(token), "counters",
                        env={"NR_CONTROLLER_INSECURE": "1"})
        assert insisting.returncode == 1 and "did not answer" in insisting.stderr, insisting
        served = ctl("--token-file", str(token), "--ca-file", str(cert), "counters")
        assert served.returncode == 0 and '"rings": {}' in served.stdout, served
        anonymous = ctl("--ca-file", str(cert), "counters")
        assert anonymous.returncode == 1 and "UNAUTHENTICATED" in anonymous.stderr, anonymous
    finally:
        rig.close()


def test_insecure_is_said_in_so_many_words(tmp_path: Path, state: Path) -> None:
    rig = SwitchRig(tmp_path, controller_args=["--controller", CONTROL_ADDR, "--insecure"],
                    control_link=True)
    try:
        assert "INSECURE: clear text" in rig.log()
        assert not state.exists()                   # nothing made, nothing asked
        anyone = ctl("counters", env={"NR_CONTROLLER_INSECURE": "1"})
        assert anyone.returncode == 0 and '"rings": {}' in anyone.stdout, anyone
    finally:
        rig.close()


def test_two_principals_without_a_hosts_policy_do_not_start(tmp_path: Path) -> None:
    """Before: no policy meant first come, first served: bob could register over the hosts
    of alice's next job and make it fail at init."""
    tokens = tmp_path / "two.tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    tokens.chmod(0o600)
    with pytest.raises(AssertionError, match="2 principals but no hosts policy"):
        SwitchRig(tmp_path, controller_args=["--controller", f"unix:{tmp_path / 'ctl.sock'}",
                                             "--token-file", str(tokens)]).close()


def test_the_stats_file_is_private_and_never_written_through_a_link(tmp_path: Path) -> None:
    """Before: --stats-file (every ring's R_Key) was world-readable and its .tmp was opened
    through a symlink: whoever planted one had the switch overwrite any file."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    stats = tmp_path / "stats.json"
    (tmp_path / "stats.tmp").symlink_to(victim)           # the old fixed name
    rig = SwitchRig(tmp_path, extra_args=["--stats-file", str(stats)])
    try:
        os.kill(rig.pid, signal.SIGUSR1)
        end = time.monotonic() + 10
        while not stats.exists() and time.monotonic() < end:
            time.sleep(0.05)
        info = os.lstat(stats)
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert '"ports"' in stats.read_text()
        assert victim.read_text() == "precious\n"
    finally:
        rig.close()


def test_a_stats_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)                                    # not sticky: anyone renames
    with pytest.raises(AssertionError, match="lets its group or others rename our files"):
        SwitchRig(tmp_path, extra_args=["--stats-file", str(shared / "stats.json")]).close()
    assert os.listdir(shared) == []
