"""The controller's security over real gRPC on 127.0.0.1 (tests/controllers.py): calls
without or with another principal's credentials, ownership of rings and counters, token
files, TLS and clear text, and tenants kept apart (a slow target, rate limits, addresses
bound to principals, hosts policies, throttled wrong secrets)."""
from __future__ import annotations

import contextlib
import logging
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from nr_contract.client import ControllerClient, ControllerError
from switch.control.config import ControllerConfig
from switch.control.service import TlsFiles, serve
from switch.control.target import SoftwareTarget
from switch.dataplane.pipeline import AggregationPipeline
from tests.controllers import ALICE, BOB, EVERYWHERE, Start, config_of, refused
from tests.controllers import start, tokens  # noqa: F401 - fixtures, used by name
from tests.roce_layers import WRITE_ONLY, mac_ports, make_ring, write_frame

ROOT = Path(__file__).resolve().parents[1]


def test_calls_without_credentials_change_nothing(start: Start, tokens: dict[str, Path]) -> None:
    addr, pipeline = start(tokens={ALICE: "alice", BOB: "bob"})
    with ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice:
        alice.register_ring(make_ring(2))
        before = pipeline.counters()
        for token_file in (None, tokens["mallory"]):
            with ControllerClient(addr, timeout=5, token_file=token_file) as anyone:
                assert anyone.ping()["auth_required"] is True              # Ping stays open
                for call in (lambda: anyone.register_ring(make_ring(3, ring_id="x")),
                             lambda: anyone.unregister_ring("ring"),
                             lambda: anyone.renew_lease("ring"), anyone.counters):
                    code, _ = refused(call)
                    assert code == "UNAUTHENTICATED"
        assert pipeline.counters() == before
        got = alice.counters()
        assert list(got["rings"]) == ["ring"]
        assert got["switch"]["refused_unauthenticated"] == 8


def test_another_principals_ring_is_answered_as_an_absent_one(start: Start,
                                                               tokens: dict[str, Path]) -> None:
    """Only the owner renews, unregisters or reads a ring; to anyone else it is NOT_FOUND
    worded as a ring that does not exist (issue 39: PERMISSION_DENIED told bob that alice
    had a ring of that id, and named her); registering its id is refused without a name."""
    addr, pipeline = start(tokens={ALICE: "alice", BOB: "bob"})
    with ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice, \
            ControllerClient(addr, timeout=5, token_file=tokens["bob"]) as bob:
        alice.register_ring(make_ring(2))
        for rid in ("ring", "nosuch"):
            for call in (lambda: bob.unregister_ring(rid), lambda: bob.renew_lease(rid),
                         lambda: bob.counters(rid)):
                assert refused(call) == ("NOT_FOUND", f"ring {rid} is not registered")
        assert refused(lambda: bob.register_ring(make_ring(2))) == (
            "FAILED_PRECONDITION", "ring ring: this ring id is taken: choose another")
        assert list(pipeline.counters()) == ["ring"]
        assert alice.counters()["leases"]["ring"]["owner"] == "alice"
        assert alice.renew_lease("ring") == {"ring_id": "ring", "lease_ms": 15000}
        assert alice.unregister_ring("ring") == {"ring_id": "ring"}
        switch = bob.counters()["switch"]
        assert (switch["refused_not_found"], switch["refused_permission"]) == (6, 0)


def test_counters_show_a_ring_only_to_its_owner_and_the_admins(
        start: Start, tokens: dict[str, Path], tmp_path: Path) -> None:
    """Another tenant's connections (RETH address, R_Key, PSNs: enough to forge a WRITE into
    its memory) are not shown, nor its ring at all; the switch's totals are."""
    root = "root-secret-0123456789abcd"
    (tmp_path / "root.tokens").write_text(f"root {root}\n")
    (tmp_path / "root.tokens").chmod(0o600)
    addr, pipeline = start(tokens={ALICE: "alice", BOB: "bob", root: "root"},
                           admins=frozenset({"root"}))
    with ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice, \
            ControllerClient(addr, timeout=5, token_file=tokens["bob"]) as bob, \
            ControllerClient(addr, timeout=5, token_file=tmp_path / "root.tokens") as admin:
        spec = make_ring(2)
        alice.register_ring(spec)
        frame = write_frame(spec.connections[0], 0, WRITE_ONLY, bytes(256),
                            reth=(0xDEAD0000, 0x2A, 256))
        assert pipeline.process(memoryview(frame), 1, lambda port, parts: None)
        assert alice.counters()["rings"]["ring"]["connections"][0]["reth"]["va"] == 0xDEAD0000
        seen = bob.counters()
        assert (seen["rings"], seen["leases"]) == ({}, {})
        assert seen["switch"]["rings_registered"] == 1 and seen["ports"]
        assert refused(lambda: bob.counters("ring")) == ("NOT_FOUND",
                                                         "ring ring is not registered")
        every = admin.counters()
        assert every["leases"]["ring"]["owner"] == "alice"
        assert every["rings"]["ring"]["connections"][0]["reth"]["va"] == 0xDEAD0000
        assert admin.counters("ring")["rings"]["ring"]["world_size"] == 2


def test_an_admin_must_be_a_principal_of_the_token_file() -> None:
    with pytest.raises(ValueError, match="admin principal.s. root not in the token file"):
        ControllerConfig(tokens={ALICE: "alice"}, admins=frozenset({"root"}))


def test_token_file_from_the_environment(start: Start, tokens: dict[str, Path],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    addr, _ = start(tokens={ALICE: "alice"})
    monkeypatch.setenv("NR_CONTROLLER_TOKEN", str(tokens["alice"]))
    with ControllerClient(addr, timeout=5) as c:
        assert c.register_ring(make_ring(2))["ring_id"] == "ring"


def test_tls_with_the_labs_certificates(start: Start, tmp_path: Path,
                                       tokens: dict[str, Path]) -> None:
    """scripts/lab_tls.sh's CA and certificate (what every lab run serves): a client that
    trusts the CA talks; a clear-text one gets nowhere; the CA's key is gone."""
    lab = tmp_path / "lab"
    lab.mkdir()
    subprocess.run([str(ROOT / "scripts/lab_tls.sh"), str(lab), "10.77.0.254", "127.0.0.1"],
                   check=True, capture_output=True)
    assert sorted(p.name for p in lab.iterdir()) == ["ca.pem", "controller.key",
                                                     "controller.pem"]
    assert (lab / "controller.key").stat().st_mode & 0o777 == 0o600
    addr, _ = start(tls=TlsFiles(lab / "controller.pem", lab / "controller.key"),
                    tokens={ALICE: "alice"})
    with ControllerClient(addr, timeout=5, token_file=tokens["alice"],
                          ca_file=lab / "ca.pem") as c:
        assert c.ping()["auth_required"] is True
        assert c.register_ring(make_ring(2))["ring_id"] == "ring"
    with ControllerClient(addr, timeout=1, token_file=tokens["alice"]) as clear:
        code, message = refused(clear.ping)            # a clear-text client gets nowhere
        assert code == "DEADLINE_EXCEEDED" and "NR_CONTROLLER_CA" in message, message


@pytest.mark.parametrize("addr", ["192.0.2.1:50051", "127.attacker.example:50051",
                                  "[::]:50051", "0.0.0.0:50051"])
def test_a_controller_serves_clear_text_to_the_network_only_if_insecure(
        tokens: dict[str, Path], addr: str) -> None:
    target = SoftwareTarget(AggregationPipeline(), mac_ports(1).get)
    config = ControllerConfig.with_token_file(tokens["alice"])
    with pytest.raises(ValueError, match=f"controller on {re.escape(addr)}: clear text on an "
                                         "address other hosts reach: give a TLS certificate"):
        serve(target, addr, config=config)


def test_a_controller_asks_credentials_unless_insecure(tokens: dict[str, Path]) -> None:
    """No token file: refused unless insecure (issue 39: every caller was `anonymous`, read
    every ring's R_Key and removed any ring); two principals: a hosts policy is needed."""
    with pytest.raises(ValueError, match="no credentials: give the controller a token file"):
        ControllerConfig()
    assert ControllerConfig(insecure=True).tokens is None
    with pytest.raises(ValueError, match="2 principals but no hosts policy"):
        ControllerConfig.with_token_file(tokens["switch"])
    with pytest.raises(ValueError, match="principal.s. carol not in the token file"):
        ControllerConfig(tokens={ALICE: "alice"}, hosts_policy={"carol": (EVERYWHERE,)})


@pytest.mark.parametrize("text,message", [
    ("", "no 'PRINCIPAL SECRET' line"),
    ("# only a comment\n\n", "no 'PRINCIPAL SECRET' line"),
    ("a b c\n", "line 1: expected 'PRINCIPAL SECRET' or 'SECRET', got 3 words"),
    ("short\n", "line 1: the secret of 'default' must be at least 16 printable ASCII"),
    ("bad/name 0123456789abcdef0\n", "line 1: principal 'bad/name' is not"),
    ("a 0123456789abcdef0\nb 0123456789abcdef0\n", "line 2: the secret of 'b' is already"),
])
def test_token_files_are_checked_by_line(tmp_path: Path, text: str, message: str) -> None:
    from nr_contract.tokens import TokenFileError, read_token_file
    path = tmp_path / "t"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(TokenFileError, match=re.escape(message)):
        read_token_file(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660])
def test_a_token_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    from nr_contract.tokens import TokenFileError, read_token_file
    path = tmp_path / "t"
    path.write_text("alice alice-secret-0123456789\n")
    path.chmod(mode)
    with pytest.raises(TokenFileError, match=rf"mode {mode:04o} lets its group or others read "
                                             rf"or write it: chmod 600 {path}"):
        read_token_file(path)
    path.chmod(0o400)
    assert read_token_file(path) == [("alice", "alice-secret-0123456789")]


def test_token_file_entries(tmp_path: Path) -> None:
    from nr_contract.tokens import read_token_file
    path = tmp_path / "t"
    path.write_text("# switch\n0123456789abcdef0  # the default principal\nbob bob-0123456789abcdef\n")
    path.chmod(0o600)
    assert read_token_file(path) == [("default", "0123456789abcdef0"),
                                      ("bob", "bob-0123456789abcdef")]
    with pytest.raises(ValueError, match="cannot read it"):
        read_token_file(tmp_path / "missing")


@pytest.mark.parametrize("addr,local", [
    ("127.0.0.1:1", True), ("127.9.9.9:1", True), ("localhost:1", True), ("[::1]:1", True),
    ("unix:/tmp/nr.sock", True), ("192.0.2.7:50051", False), ("[2001:db8::1]:1", False),
    ("127.attacker.example:50051", False), ("localhost.example:1", False)])
def test_local_addresses_are_loopback_ips_localhost_and_unix_sockets(addr: str,
                                                                     local: bool) -> None:
    from nr_contract.client import local_address
    assert local_address(addr) is local


def test_a_client_refuses_clear_text_to_a_remote_controller_unless_told(
        tokens: dict[str, Path], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: a client without a CA file sent its secret in the clear to any address
    (only a warning), to `127.attacker.example` without even that."""
    import nr_contract.client as client_module
    client_module._warned_plaintext.clear()
    monkeypatch.delenv("NR_CONTROLLER_INSECURE", raising=False)
    for addr in ("127.0.0.1:1", "unix:/tmp/nr.sock"):
        ControllerClient(addr, token_file=tokens["alice"]).close()
    for addr in ("192.0.2.7:50051", "127.attacker.example:50051"):
        with pytest.raises(ControllerError, match=f"controller at {re.escape(addr)}: no CA "
                                                  "file to speak TLS with"):
            ControllerClient(addr, token_file=tokens["alice"])
    with caplog.at_level(logging.WARNING, logger="nr_contract.client"):
        ControllerClient("192.0.2.7:50051", token_file=tokens["alice"], insecure=True).close()
        monkeypatch.setenv("NR_CONTROLLER_INSECURE", "1")
        ControllerClient("192.0.2.7:50051", token_file=tokens["alice"]).close()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and warned[0].startswith(
        "controller 192.0.2.7:50051: INSECURE, clear text"), warned


class SlowTarget(SoftwareTarget):
    """A software target whose registrations take `register_delay` s (a fabric whose ToR is
    slow) and whose Counters take `counters_delay` s (a BMv2 switch's under load: registers
    over Thrift; or a fabric's: every ToR and the spine asked in turn)."""

    register_delay = 0.0
    counters_delay = 0.0

    def register_ring(self, spec, slots):  # type: ignore[no-untyped-def]
        time.sleep(self.register_delay)
        return super().register_ring(spec, slots)

    def counters(self):  # type: ignore[no-untyped-def]
        time.sleep(self.counters_delay)
        return super().counters()


@contextlib.contextmanager
def alice_and_bob(target: SoftwareTarget, tokens: dict[str, Path]
                  ) -> Iterator[tuple[ControllerClient, ControllerClient]]:
    """Clients of principals alice and bob of a controller over `target` (4 hosts each)."""
    server, port = serve(target, "127.0.0.1:0",
                         config=config_of(tokens={ALICE: "alice", BOB: "bob"}))
    addr = f"127.0.0.1:{port}"
    try:
        with ControllerClient(addr, timeout=10, token_file=tokens["alice"]) as alice, \
                ControllerClient(addr, timeout=10, token_file=tokens["bob"]) as bob:
            yield alice, bob
    finally:
        server.stop()


def test_a_slow_target_stalls_no_other_tenants_renewals(tokens: dict[str, Path]) -> None:
    """While one registration waits 1.5 s at the target, another principal renews its ring
    (lease 300 ms) at once and its lease never lapses; the same ring's second registration
    meanwhile is ABORTED (busy), not queued behind the first."""
    target = SlowTarget(AggregationPipeline(), mac_ports(4).get)
    with alice_and_bob(target, tokens) as (alice, bob):
        bob.register_ring(make_ring(2, ring_id="bobs", hosts=[2, 3], qpn_base=300),
                          lease_ms=300)
        target.register_delay = 1.5
        slow = threading.Thread(target=alice.register_ring, args=(make_ring(2),))
        slow.start()
        time.sleep(0.2)
        assert refused(lambda: alice.register_ring(make_ring(2)))[0] == "ABORTED"
        worst = 0.0
        while slow.is_alive():
            t0 = time.monotonic()
            bob.renew_lease("bobs")
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.1)
        assert worst < 0.5, worst
        got = bob.counters()
        assert "bobs" in got["rings"] and got["switch"]["leases_expired"] == 0
        assert list(alice.counters()["rings"]) == ["ring"]


def test_one_tenants_slow_calls_delay_neither_anothers_registration_nor_a_lease_expiry(
        tokens: dict[str, Path]) -> None:
    """Issue 39: one lock held across every call to the target let alice's Counters polling
    slow bob's RegisterRing 60x and a 300 ms lease lapse after 5 s. The bound now: while
    alice keeps two Counters calls of 2 s each at the target (her share: a third is refused
    at once), bob's RegisterRing takes under 0.5 s and his 300 ms lease is off the data
    plane within 0.3 + 0.5 s of its registration."""
    target = SlowTarget(AggregationPipeline(), mac_ports(4).get)
    with alice_and_bob(target, tokens) as (alice, bob):
        alice.register_ring(make_ring(2))
        target.counters_delay = 2.0
        polls = [threading.Thread(target=alice.counters) for _ in range(2)]
        for t in polls:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        code, message = refused(alice.counters)
        assert (code, time.monotonic() - t0 < 0.5) == ("RESOURCE_EXHAUSTED", True)
        assert message == ("principal 'alice': 2 calls at the target already (the "
                           "controller's limit per principal): wait for one to end")
        t0 = time.monotonic()
        bob.register_ring(make_ring(2, ring_id="bobs", hosts=[2, 3], qpn_base=300),
                          lease_ms=300)
        registered = time.monotonic() - t0
        while "bobs" in target.pipeline.counters() and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        freed = time.monotonic() - t0
        for t in polls:
            t.join()
        assert registered < 0.5 and freed < 0.8, (registered, freed)
        assert list(target.pipeline.counters()) == ["ring"]
        print(f"bob registered in {registered * 1000:.0f} ms, his 300 ms lease freed "
              f"{freed * 1000:.0f} ms after he asked, alice's 2 s Counters at the target")


def test_each_principal_has_its_own_rate_limit(tokens: dict[str, Path]) -> None:
    server, port = serve(SoftwareTarget(AggregationPipeline(), mac_ports(3).get), "127.0.0.1:0",
                         config=config_of(tokens={ALICE: "alice", BOB: "bob"},
                                          calls_per_second=5))
    addr = f"127.0.0.1:{port}"
    try:
        with ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice, \
                ControllerClient(addr, timeout=5, token_file=tokens["bob"]) as bob:
            codes = []
            for _ in range(30):                       # a burst far over 2 x 5
                try:
                    alice.counters()
                    codes.append("OK")
                except ControllerError as e:
                    codes.append(e.code)
            assert 9 <= codes.count("OK") <= 12 and codes[-1] == "RESOURCE_EXHAUSTED", codes
            assert bob.counters()["switch"]["refused_limit"] >= 18     # bob is not limited
    finally:
        server.stop()


def test_an_address_belongs_to_one_principal_at_a_time(start: Start,
                                                       tokens: dict[str, Path]) -> None:
    """bob cannot register a ring over alice's hosts (its frames would be eaten as her
    overruns, or bind her address to his port); alice may use them in a second ring."""
    addr, pipeline = start(hosts=4, tokens={ALICE: "alice", BOB: "bob"})
    with ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice, \
            ControllerClient(addr, timeout=5, token_file=tokens["bob"]) as bob:
        alice.register_ring(make_ring(2, ring_id="a"))                     # hosts 0, 1
        assert refused(lambda: bob.register_ring(
            make_ring(2, ring_id="b", hosts=[1, 2], qpn_base=100))) == (
            "PERMISSION_DENIED", "ring b: rank 0's address 10.77.0.2 is in use by another "
                                 "principal's ring")
        assert list(pipeline.counters()) == ["a"]
        alice.register_ring(make_ring(2, ring_id="a2", hosts=[1, 0], qpn_base=200))
        bob.register_ring(make_ring(2, ring_id="b", hosts=[2, 3], qpn_base=100))
        alice.unregister_ring("a")
        alice.unregister_ring("a2")
        bob.register_ring(make_ring(2, ring_id="b2", hosts=[0, 1], qpn_base=300))   # free now


def test_a_hosts_policy_binds_principals_to_their_hosts(start: Start, tokens: dict[str, Path],
                                                         tmp_path: Path) -> None:
    from nr_contract.tokens import read_hosts_policy
    policy = tmp_path / "hosts"
    policy.write_text("# who may use which hosts\nalice 10.77.0.1 10.77.0.2\nbob 10.77.0.0/30\n")
    addr, pipeline = start(hosts=4, tokens={ALICE: "alice", BOB: "bob"},
                           hosts_policy=read_hosts_policy(policy))
    with ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice, \
            ControllerClient(addr, timeout=5, token_file=tokens["bob"]) as bob:
        assert refused(lambda: alice.register_ring(make_ring(3))) == (
            "PERMISSION_DENIED", "ring ring: rank 2's address 10.77.0.3 is not a host of "
                                 "principal 'alice' (hosts policy)")
        alice.register_ring(make_ring(2))
        assert refused(lambda: bob.register_ring(
            make_ring(2, ring_id="b", hosts=[2, 3], qpn_base=100)))[1].endswith(
            "rank 1's address 10.77.0.4 is not a host of principal 'bob' (hosts policy)")
        assert list(pipeline.counters()) == ["ring"]


@pytest.mark.parametrize("text,message", [
    ("alice\n", "line 1: expected 'PRINCIPAL NET [NET ...]'"),
    ("alice 10.77.0.300\n", "line 1: '10.77.0.300' does not appear to be an IPv4 or IPv6"),
    ("bad/name 10.0.0.1\n", "line 1: expected 'PRINCIPAL NET [NET ...]'"),
])
def test_a_hosts_policy_is_checked_by_line(tmp_path: Path, text: str, message: str) -> None:
    from nr_contract.tokens import TokenFileError, read_hosts_policy
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(TokenFileError, match=re.escape(message)):
        read_hosts_policy(path)


def test_wrong_secrets_from_one_address_are_throttled(start: Start,
                                                      tokens: dict[str, Path]) -> None:
    addr, _ = start(tokens={ALICE: "alice"})
    with ControllerClient(addr, timeout=5, token_file=tokens["mallory"]) as mallory, \
            ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice:
        codes = [refused(mallory.counters)[0] for _ in range(12)]
        assert codes == ["UNAUTHENTICATED"] * 10 + ["RESOURCE_EXHAUSTED"] * 2, codes
        code, message = refused(alice.counters)      # the same address: refused, even right
        assert code == "RESOURCE_EXHAUSTED" and "10 wrong secrets from" in message
        assert alice.ping()["auth_required"] is True            # Ping stays open
