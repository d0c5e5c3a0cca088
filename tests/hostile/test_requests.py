"""Hostile controller requests against the real switch process: the issue's mistyped fields,
calls without or with someone else's credentials, limits, leases, and a bounded fuzz of
typed fields and raw bytes at every method (issue 12)."""
from __future__ import annotations

import time
from typing import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nr_contract import control_pb2 as pb
from nr_contract.client import ControllerClient, ControllerError, spec_message
from tests.hostile.netns import ALICE, SwitchRig
from tests.roce_layers import lab_ip, lab_mac, make_ring

SERVICE = "/netreduce.control.v1.Controller/"
METHODS = {"Ping": pb.PingRequest, "RegisterRing": pb.RegisterRingRequest,
           "RenewLease": pb.RenewLeaseRequest, "UnregisterRing": pb.UnregisterRingRequest,
           "Counters": pb.CountersRequest}
MAX_RINGS = 4
RING_MEMORY = 256 * 3 * 256                    # a 2-rank ring of 256 slots, MTU 256
MAX_SLOT_MEMORY = MAX_RINGS * RING_MEMORY
ANSWERS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
           grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
FUZZ_EXAMPLES = 1500
FUZZ_SECONDS = 12.0         # the fuzz's time box: examples drawn past it call nothing ...
FUZZ_FLOOR = 250            # ... but at least this many must have made their calls (1500 in
#                             9 s on an idle 2-core machine)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SwitchRig]:
    r = SwitchRig(tmp_path_factory.mktemp("hostile-requests"),
                  extra_args=["--max-rings", str(MAX_RINGS),
                              "--max-slot-memory", str(MAX_SLOT_MEMORY)])
    yield r
    r.close()


@pytest.fixture(scope="module")
def channel(rig: SwitchRig) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(rig.addr) as ch:
        yield ch


@pytest.fixture(autouse=True)
def no_rings_left(rig: SwitchRig, alice: ControllerClient) -> Iterator[None]:
    yield
    assert rig.alive(), rig.log()
    for rid in alice.counters(connections=False)["rings"]:
        alice.unregister_ring(rid)


def raw_call(channel: grpc.Channel, method: str, data: bytes, secret: str | None = ALICE
             ) -> tuple[grpc.StatusCode, str]:
    metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
    try:
        channel.unary_unary(SERVICE + method)(data, timeout=10, metadata=metadata)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def _tag(number: int, wire: int) -> bytes:
    return bytes([number << 3 | wire])


def _nest(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + bytes([len(payload)]) + payload


DOUBLE_4096 = bytes.fromhex("000000000000b040")    # 4096.0 as a little-endian double


@pytest.mark.parametrize("data,field", [
    (_nest(1, _nest(6, _tag(8, 1) + DOUBLE_4096)), "spec.connections[0].psn0"),
    (_nest(1, _nest(6, _tag(1, 1) + bytes(8))), "spec.connections[0].rank"),            # 0.0
    (_nest(1, _nest(6, _tag(7, 5) + bytes.fromhex("0000b040"))), "spec.connections[0].dst_qpn"),
    (_nest(1, _tag(2, 1) + bytes.fromhex("0000000000000840")), "spec.world_size"),       # 3.0
    (_nest(1, _tag(3, 1) + bytes.fromhex("0000000000009040")), "spec.mtu"),             # 1024.0
    (_nest(1, _tag(1, 0) + b"\x01"), "spec.ring_id"),
    (_nest(1, _nest(6, _tag(2, 0) + b"\x07")), "spec.connections[0].src_ip"),
])
def test_the_issues_mistyped_fields_are_refused_by_name(rig: SwitchRig, alice: ControllerClient,
                                                        channel: grpc.Channel, data: bytes,
                                                        field: str) -> None:
    code, details = raw_call(channel, "RegisterRing", data)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"{field}: a value of the wrong type"), details
    assert alice.counters()["rings"] == {}


@pytest.mark.parametrize("connection,field,message", [
    (1, "src_ip", "not-an-ip"), (2, "psn0", 1 << 24), (0, "dst_qpn", 0xFFFFFFFF),
])
def test_out_of_range_values_are_refused_by_name(alice: ControllerClient, channel: grpc.Channel,
                                                 connection: int, field: str,
                                                 message: object) -> None:
    req = pb.RegisterRingRequest(spec=spec_message(make_ring(3)))
    setattr(req.spec.connections[connection], field, message)
    code, details = raw_call(channel, "RegisterRing", req.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"spec.connections[{connection}].{field}: "), details
    assert alice.counters()["rings"] == {}


def test_calls_without_credentials_change_nothing(rig: SwitchRig, alice: ControllerClient,
                                                  channel: grpc.Channel) -> None:
    alice.register_ring(make_ring(2))
    before = alice.counters()
    register = pb.RegisterRingRequest(spec=spec_message(make_ring(3, ring_id="x", qpn_base=99)))
    for secret in (None, "mallory-guessed-secret-0001", ALICE[:-1]):
        for method, data in (("RegisterRing", register.SerializeToString()),
                             ("UnregisterRing", pb.UnregisterRingRequest(
                                 ring_id="ring").SerializeToString()),
                             ("RenewLease", pb.RenewLeaseRequest(
                                 ring_id="ring").SerializeToString())):
            assert raw_call(channel, method, data, secret)[0] == grpc.StatusCode.UNAUTHENTICATED
    assert raw_call(channel, "Ping", b"", None)[0] == grpc.StatusCode.OK
    after = alice.counters()
    assert after["rings"] == before["rings"] and after["leases"].keys() == {"ring"}
    assert after["switch"]["refused_unauthenticated"] \
        - before["switch"]["refused_unauthenticated"] == 9


def test_another_principals_ring_looks_absent(rig: SwitchRig, alice: ControllerClient) -> None:
    """Issue 39: PERMISSION_DENIED (naming alice) told bob which ring ids were alice's; now
    unregistering, renewing or reading her ring gets him exactly what a ring that does not
    exist gets."""
    alice.register_ring(make_ring(2, ring_id="alices"))
    with ControllerClient(rig.addr, timeout=10, token_file=rig.bob_tokens) as bob:
        answers = {}
        for rid in ("alices", "nobodys"):
            for name, call in (("unregister", bob.unregister_ring), ("renew", bob.renew_lease),
                               ("counters", bob.counters)):
                with pytest.raises(ControllerError) as e:
                    call(rid)
                answers[name, rid] = (e.value.code, e.value.message.replace(rid, "ID"))
        assert set(answers.values()) == {("NOT_FOUND", "ring ID is not registered")}, answers
    assert list(alice.counters()["rings"]) == ["alices"]


def test_an_unauthenticated_ping_tells_nothing_of_the_rings_in_use(
        rig: SwitchRig, alice: ControllerClient, channel: grpc.Channel) -> None:
    """Issue 39: the open Ping's free_rings told anyone how many rings the tenants held;
    now it is 0 without a valid secret, whatever is registered, and the count only to a
    principal (a wrong secret counts as a failed login: Ping is no oracle for guessing)."""
    def ping(secret: str | None) -> pb.PingReply:
        metadata = (("authorization", f"Bearer {secret}"),) if secret else ()
        return pb.PingReply.FromString(channel.unary_unary(SERVICE + "Ping")(
            b"", timeout=10, metadata=metadata))

    before = [ping(None).limits.free_rings, ping("wrong-secret-0123456789").limits.free_rings]
    alice.register_ring(make_ring(2))
    after = [ping(None).limits.free_rings, ping("wrong-secret-0123456789").limits.free_rings]
    assert before == after == [0, 0]
    assert ping(ALICE).limits.free_rings == alice.ping()["limits"]["free_rings"] == MAX_RINGS - 1


def test_a_principal_registers_only_over_its_own_hosts(rig: SwitchRig,
                                                       alice: ControllerClient) -> None:
    """The hosts policy: bob (10.77.1.0/24) cannot take alice's hosts, not even first."""
    with ControllerClient(rig.addr, timeout=10, token_file=rig.bob_tokens) as bob:
        with pytest.raises(ControllerError) as e:
            bob.register_ring(make_ring(2, ring_id="bobs"))
    assert (e.value.code, e.value.message) == (
        "PERMISSION_DENIED", "ring bobs: rank 0's address 10.77.0.1 is not a host of principal "
                             "'bob' (hosts policy)")
    assert alice.counters()["rings"] == {}


def test_ring_and_memory_limits_hold(alice: ControllerClient) -> None:
    big = make_ring(3, ring_id="big", qpn_base=0x900)
    with pytest.raises(ControllerError) as e:
        alice.register_ring(big, slots=1024)
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert e.value.message == (f"ring big: 1024 slots x 4 x 256 B = 1048576 bytes of aggregator "
                               f"memory, 0 of the switch's limit of {MAX_SLOT_MEMORY} bytes "
                               "(--max-slot-memory) in use")
    for i in range(MAX_RINGS):
        alice.register_ring(make_ring(2, ring_id=f"r{i}", qpn_base=0x100 * (i + 1)))
    with pytest.raises(ControllerError) as e:
        alice.register_ring(make_ring(2, ring_id="one-more", qpn_base=0x1000))
    assert (e.value.code, e.value.message) == (
        "RESOURCE_EXHAUSTED", f"ring one-more: the switch's limit of {MAX_RINGS} rings "
                              "(--max-rings) is reached")
    got = alice.counters()
    assert len(got["rings"]) == MAX_RINGS
    assert got["switch"]["slot_memory_used"] == MAX_SLOT_MEMORY
    assert alice.ping()["limits"]["free_rings"] == 0


def test_a_lease_not_renewed_is_freed(alice: ControllerClient) -> None:
    before = alice.counters()["switch"]["leases_expired"]
    assert alice.register_ring(make_ring(2, ring_id="short"), lease_ms=300)["lease_ms"] == 300
    time.sleep(0.7)
    got = alice.counters()
    assert got["rings"] == {} and got["switch"]["leases_expired"] == before + 1


# -- fuzz -----------------------------------------------------------------------------------
_u32 = st.one_of(st.integers(0, 4), st.sampled_from([255, 256, 1024, 4096, 1 << 24, 2**32 - 1]),
                 st.integers(0, 2**32 - 1))
_ip = st.one_of(st.sampled_from([lab_ip(h) for h in range(4)]),
                st.sampled_from(["0.0.0.0", "255.255.255.255", "224.0.0.1", "10.77.0", "::1"]),
                st.text(max_size=20))
_mac = st.one_of(st.sampled_from([lab_mac(h) for h in range(4)]), st.text(max_size=20))


@st.composite
def register_request(draw) -> pb.RegisterRingRequest:
    n = draw(st.integers(0, 5))
    conns = [pb.Connection(rank=draw(st.one_of(st.just(r), _u32)), src_ip=draw(_ip),
                           dst_ip=draw(_ip), src_mac=draw(_mac), dst_mac=draw(_mac),
                           src_qpn=draw(_u32), dst_qpn=draw(_u32), psn0=draw(_u32))
             for r in range(n)]
    spec = pb.RingSpec(ring_id=draw(st.text(max_size=140)),
                       world_size=draw(st.one_of(st.just(n), _u32)),
                       mtu=draw(st.one_of(st.sampled_from([256, 1024, 4096]), _u32)),
                       msg_size=draw(_u32), window=draw(_u32), connections=conns)
    return pb.RegisterRingRequest(spec=spec, slots=draw(_u32), lease_ms=draw(_u32))


def test_fuzzed_requests_get_an_answer_never_a_crash(rig: SwitchRig, channel: grpc.Channel,
                                                     alice: ControllerClient) -> None:
    seen: dict[str, int] = {}
    examples = [0]
    t0 = time.monotonic()

    def check(method: str, data: bytes, secret: str | None) -> None:
        code, details = raw_call(channel, method, data, secret)
        assert code in ANSWERS, (method, data, code, details)
        seen[code.name] = seen.get(code.name, 0) + 1

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(register_request(), st.sampled_from(list(METHODS)), st.binary(max_size=300),
           st.sampled_from([ALICE, None]))
    def fuzz(req: pb.RegisterRingRequest, method: str, raw: bytes, secret: str | None) -> None:
        if time.monotonic() - t0 > FUZZ_SECONDS:
            return
        examples[0] += 1
        check("RegisterRing", req.SerializeToString(), ALICE)
        check(method, raw, secret)
        for rid in alice.counters(connections=False)["rings"]:   # a valid one, by chance
            alice.unregister_ring(rid)

    fuzz()
    assert examples[0] >= FUZZ_FLOOR, f"{examples[0]} fuzz examples in {FUZZ_SECONDS} s"
    assert rig.alive(), rig.log()
    got = alice.counters(connections=False)["switch"]
    assert got["internal_errors"] == 0
    assert "Traceback" not in rig.log()
    print(f"request fuzz: {examples[0]} examples, {sum(seen.values())} calls in {time.monotonic() - t0:.1f} s: {seen}")
