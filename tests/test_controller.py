"""The controller over real gRPC on 127.0.0.1 (tests/controllers.py): registration,
validation of every field, Counters, leases, limits, deadlines, switch.ctl (the typed API
of nr_contract/control.proto). Credentials, ownership, TLS and tenants:
test_controller_security.py."""
from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from nr_contract import control_pb2 as pb
from nr_contract.client import ControllerClient, ControllerError, spec_message
from switch import ctl
from switch.control.config import ControllerConfig
from switch.control.service import MAX_MESSAGE, SERVICE, ControllerService, serve
from switch.control.target import SoftwareTarget, resolve_ports
from switch.dataplane.pipeline import AggregationPipeline
from tests.controllers import ALICE, BOB, Start, refused
from tests.controllers import client, controller, start, tokens  # noqa: F401 - fixtures, used by name
from tests.roce_layers import WRITE_ONLY, ip_ports, lab_mac, mac_ports, make_ring, write_frame


def test_ping_is_open_and_tells_the_limits(client: ControllerClient) -> None:
    assert client.ping() == {"target": "software", "auth_required": False, "limits": {
        "path_mtus": [256, 512, 1024, 2048, 4096], "max_slots": 1024, "max_ranks": 32,
        "max_rings": 64, "free_rings": 64, "max_slot_memory": 256 << 20,
        "default_lease_ms": 15000, "max_in_flight": 0, "ack_timeout": 0, "capacity": 0}}


def test_register_resolves_ports_from_the_static_map(
        client: ControllerClient, controller: tuple[str, AggregationPipeline]) -> None:
    spec = make_ring(3)
    assert client.register_ring(spec) == {"ring_id": "ring", "slots": 256, "lease_ms": 15000,
                                          "ports": {"10.77.0.1": 1, "10.77.0.2": 2,
                                                    "10.77.0.3": 3}}
    pipeline = controller[1]
    frame = write_frame(spec.connections[0], 0, WRITE_ONLY, bytes(256))
    assert pipeline.process(memoryview(frame), 1, lambda port, parts: None)
    got = client.counters()
    ring = got["rings"]["ring"]
    assert ring["counters"]["aggregated"] == 1
    assert [(c["in_port"], c["out_port"]) for c in ring["connections"]] == [(1, 2), (2, 3), (3, 1)]
    assert ring["connections"][0]["counters"]["aggregated"] == 1
    assert got["leases"]["ring"]["owner"] == "anonymous"
    assert 14000 < got["leases"]["ring"]["remaining_ms"] <= 15000
    assert got["switch"]["rings_registered"] == 1
    assert got["switch"]["slot_memory_used"] == 256 * 4 * 256
    assert got["switch"]["pipeline_errors"] == 0           # the target's own


def test_counters_filter_and_detail(client: ControllerClient) -> None:
    client.register_ring(make_ring(2, ring_id="a"))
    client.register_ring(dataclasses.replace(make_ring(2, ring_id="b", qpn_base=100)))
    assert sorted(client.counters()["rings"]) == ["a", "b"]
    only_b = client.counters("b", connections=False)
    assert list(only_b["rings"]) == ["b"] and only_b["rings"]["b"]["connections"] == []
    assert len(client.counters("b")["rings"]["b"]["connections"]) == 2
    assert refused(lambda: client.counters("c")) == ("NOT_FOUND", "ring c is not registered")
    assert client.counters()["ports"] == {"1": {"ifname": "p1", "rx_packets": 3,
                                                "tx_packets": 4}}


def test_register_with_slots_and_unregister(client: ControllerClient) -> None:
    assert client.register_ring(make_ring(2), slots=512)["slots"] == 512
    assert client.counters()["rings"]["ring"]["slots"] == 512
    assert client.unregister_ring("ring") == {"ring_id": "ring"}
    assert client.counters()["rings"] == {}
    assert client.ping()["limits"]["free_rings"] == 64


def test_a_mac_missing_from_the_static_map_is_a_failed_precondition(
        client: ControllerClient) -> None:
    assert refused(lambda: client.register_ring(make_ring(4))) == (   # host 3 has no --mac
        "FAILED_PRECONDITION", "rank 3 (10.77.0.4): MAC 02:4e:52:00:00:04 is not in the "
        "switch's static port map (start the switch with --mac 02:4e:52:00:00:04=PORT)")


def test_duplicate_ring_differently_is_a_failed_precondition(client: ControllerClient) -> None:
    client.register_ring(make_ring(2))
    code, msg = refused(lambda: client.register_ring(make_ring(2), slots=1024))
    assert code == "FAILED_PRECONDITION" and "already registered differently" in msg
    assert client.register_ring(make_ring(2))["ring_id"] == "ring"     # the same again: fine


def test_unregister_unknown_ring_is_not_found(client: ControllerClient) -> None:
    assert refused(lambda: client.unregister_ring("nope")) == (
        "NOT_FOUND", "ring nope is not registered")


def _conn(spec, r: int, **change):
    conns = list(spec.connections)
    conns[r] = dataclasses.replace(conns[r], **change)
    return dataclasses.replace(spec, connections=tuple(conns))


def _mutated(**kw) -> pb.RegisterRingRequest:
    """A valid 3-rank request with `kw` applied: 'slots', 'lease_ms', spec fields, or
    'cN_field' for connection N's field."""
    req = pb.RegisterRingRequest(spec=spec_message(make_ring(3)))
    for key, value in kw.items():
        if key in ("slots", "lease_ms"):
            setattr(req, key, value)
        elif key.startswith("c") and key[1].isdigit():
            setattr(req.spec.connections[int(key[1])], key[3:], value)
        elif key == "drop_connection":
            del req.spec.connections[-1]
        else:
            setattr(req.spec, key, value)
    return req


@pytest.mark.parametrize("change,message", [
    ({"c2_psn0": 1 << 24}, "spec.connections[2].psn0: 16777216 is not a 24-bit value"),
    ({"c1_dst_qpn": 0xFFFFFFFF}, "spec.connections[1].dst_qpn: 4294967295 is not a 24-bit value"),
    ({"c0_src_qpn": 1 << 24}, "spec.connections[0].src_qpn: 16777216 is not a 24-bit value"),
    ({"c0_src_ip": "not-an-ip"}, "spec.connections[0].src_ip: 'not-an-ip' is not an IPv4 address"),
    ({"c0_dst_ip": "224.0.0.1"}, "spec.connections[0].dst_ip: 224.0.0.1 is not a unicast IPv4"),
    ({"c1_src_mac": "02:4e:52:00:00"}, "spec.connections[1].src_mac: '02:4e:52:00:00' is not a MAC"),
    ({"c1_dst_mac": "03:00:00:00:00:01"}, "spec.connections[1].dst_mac: 03:00:00:00:00:01 is a "
                                          "multicast MAC"),
    ({"c1_rank": 0}, "spec.connections[1].rank: 0, but connection 1 is rank 1's"),
    ({"c1_dst_ip": "10.77.0.9"}, "spec.connections[1].dst_ip: 10.77.0.9 is not "
                                 "spec.connections[2].src_ip 10.77.0.3"),
    ({"world_size": 4}, "spec.connections: 3 connections for spec.world_size 4"),
    ({"world_size": 1}, "spec.world_size: 1 ranks, this switch aggregates 2..32"),
    ({"drop_connection": True}, "spec.connections: 2 connections for spec.world_size 3"),
    ({"mtu": 1000}, "spec.mtu: path MTU 1000 is not one of (256, 512, 1024, 2048, 4096)"),
    ({"msg_size": 1000}, "spec.msg_size: 1000 is not a positive multiple of spec.mtu 256"),
    ({"window": 0}, "spec.window: 0 messages"),
    ({"ring_id": ""}, "spec.ring_id: '' is not 1..128 printable ASCII characters"),
    ({"ring_id": "x" * 129}, "spec.ring_id: 'xxxx"),
    ({"ring_id": "tab\there"}, "spec.ring_id: 'tab\\there' is not 1..128 printable ASCII"),
    ({"slots": 384}, "slots: 384 is not a power of two <= 1024"),
    ({"slots": 2048}, "slots: 2048 is not a power of two <= 1024"),
    ({"slots": 8}, "slots: 8 < 16 (2 x the packets one connection can have in flight"),
    ({"lease_ms": 50}, "lease_ms: 50 is not in 100..3600000"),
])
def test_every_field_is_validated_by_name(controller: tuple[str, AggregationPipeline],
                                          change: dict, message: str) -> None:
    with grpc.insecure_channel(controller[0]) as channel:
        rpc = channel.unary_unary(f"/{SERVICE}/RegisterRing")
        with pytest.raises(grpc.RpcError) as e:
            rpc(_mutated(**change).SerializeToString(), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(message), e.value.details()
    assert controller[1].counters() == {}


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return bytes([number << 3 | wire]) + payload


def _len(number: int, payload: bytes) -> bytes:
    return _field(number, 2, bytes([len(payload)]) + payload)


@pytest.mark.parametrize("request_bytes,message", [
    # the mistyped fields, sent as the wire would carry them: a double (wire type 1)
    # or a float (5) where a uint32 belongs, a varint where a string belongs
    (_len(1, _len(6, _field(8, 1, struct.pack("<d", 4096.0)))),
     "spec.connections[0].psn0: a value of the wrong type (wire type 1) where an unsigned"),
    (_len(1, _len(6, _field(1, 5, b"\0\0\0\0"))),
     "spec.connections[0].rank: a value of the wrong type (wire type 5)"),
    (_len(1, _field(2, 1, bytes(8))), "spec.world_size: a value of the wrong type (wire type 1)"),
    (_len(1, _field(3, 5, bytes(4))), "spec.mtu: a value of the wrong type (wire type 5)"),
    (_len(1, _field(1, 0, b"\x05")), "spec.ring_id: a value of the wrong type (wire type 0)"),
    (_len(1, _len(6, _field(2, 0, b"\x01"))), "spec.connections[0].src_ip: a value of the wrong"),
    (_field(12, 0, b"\x01"), "RegisterRingRequest: field number 12 is not part of"),
    (_field(2, 0, b"\x85\x80\x80\x80\x80\x20"), "slots: 1099511627781 is not an unsigned 32-bit"),
    (_field(2, 0, b"\x01") + _field(2, 0, b"\x02"), "slots: given more than once"),
    (_len(1, _len(6, b"") + _len(6, _field(8, 0, b"\x80\x80\x80\x80\x10"))),
     "spec.connections[1].psn0: 4294967296 is not an unsigned 32-bit integer"),
    (_field(1, 2, b"\x09\x01"), "request: not a valid RegisterRingRequest"),     # truncated
    (b"\x0a\x05ab", "request: not a valid RegisterRingRequest"),
    (b"\xff\xff\xff", "request: not a valid RegisterRingRequest"),
    (_len(1, _len(1, b"\xff\xfe")), "request: not a valid RegisterRingRequest"),   # not UTF-8
    (b"", "spec: missing"),
])
def test_malformed_bytes_are_invalid_argument(controller: tuple[str, AggregationPipeline],
                                              request_bytes: bytes, message: str) -> None:
    with grpc.insecure_channel(controller[0]) as channel:
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(f"/{SERVICE}/RegisterRing")(request_bytes, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert e.value.details().startswith(message), e.value.details()


@pytest.mark.parametrize("field,value", [("psn0", 4096.0), ("rank", 1.0), ("dst_qpn", 5.5),
                                         ("src_ip", ["x"]), ("psn0", -1), ("psn0", True)])
def test_the_client_cannot_send_a_mistyped_connection(field: str, value: object) -> None:
    spec = _conn(make_ring(3), 1, **{field: value})
    with pytest.raises(ValueError, match=rf"^spec\.connections\[1\]\.{field}: "):
        spec_message(spec)


@pytest.mark.parametrize("field,value", [("world_size", 3.0), ("mtu", 1024.0),
                                         ("ring_id", ["a"])])
def test_the_client_cannot_send_a_mistyped_spec(field: str, value: object) -> None:
    spec = make_ring(3)
    object.__setattr__(spec, field, value)
    with pytest.raises(ValueError, match=rf"^spec\.{field}: "):
        spec_message(spec)


# -- leases and limits ---------------------------------------------------------------------
def test_a_lease_not_renewed_frees_the_ring(start: Start) -> None:
    """A ring whose lease is renewed lives on beside one that lapses (a lease of 1.5 s
    renewed every 0.1 s: a renewal late by a whole lease would take a 1.4 s stall)."""
    addr, pipeline = start(default_lease_ms=1500)
    with ControllerClient(addr, timeout=5) as c:
        assert c.register_ring(make_ring(2, ring_id="kept"))["lease_ms"] == 1500
        assert c.register_ring(make_ring(2, ring_id="lapses", qpn_base=100))["lease_ms"] == 1500
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20 and c.counters()["switch"]["leases_expired"] == 0:
            c.renew_lease("kept")
            time.sleep(0.1)
        assert time.monotonic() - t0 >= 1.5             # not before its lease ran out
        got = c.counters()
        assert list(got["rings"]) == ["kept"] and list(pipeline.counters()) == ["kept"]
        assert got["switch"]["leases_expired"] == 1
        assert refused(lambda: c.renew_lease("lapses")) == (
            "NOT_FOUND", "ring lapses is not registered")
        assert c.register_ring(make_ring(2, ring_id="long", qpn_base=200), lease_ms=60000)["lease_ms"] == 60000


def test_ring_limit_is_resource_exhausted(start: Start) -> None:
    addr, _ = start(max_rings=2)
    with ControllerClient(addr, timeout=5) as c:
        for i in range(2):
            c.register_ring(make_ring(2, ring_id=f"r{i}", qpn_base=100 * i))
        assert c.ping()["limits"]["free_rings"] == 0
        assert refused(lambda: c.register_ring(make_ring(2, ring_id="r2", qpn_base=200))) == (
            "RESOURCE_EXHAUSTED", "ring r2: the switch's limit of 2 rings (--max-rings) is "
                                  "reached")
        c.unregister_ring("r0")
        assert c.register_ring(make_ring(2, ring_id="r2", qpn_base=200))["ring_id"] == "r2"


def test_slot_memory_limit_is_resource_exhausted(start: Start) -> None:
    addr, _ = start(max_slot_memory=256 * 3 * 256 + 1000)     # one 2-rank ring of 256 slots
    with ControllerClient(addr, timeout=5) as c:
        c.register_ring(make_ring(2, ring_id="a"))
        assert refused(lambda: c.register_ring(make_ring(2, ring_id="b", qpn_base=100))) == (
            "RESOURCE_EXHAUSTED", "ring b: 256 slots x 3 x 256 B = 196608 bytes of aggregator "
            "memory, 196608 of the switch's limit of 197608 bytes (--max-slot-memory) in use")


def test_a_tenant_without_room_is_refused_and_the_others_ring_lives_on(
        start: Start, tokens: dict[str, Path]) -> None:
    """The static quota (docs/security.md, "Many jobs at once"): bob's ring that would not
    fit is refused by name; alice's ring keeps its slots, its renewals and its counters."""
    addr, pipeline = start(tokens={ALICE: "alice", BOB: "bob"},
                           max_slot_memory=256 * 3 * 256 + 1000)
    with ControllerClient(addr, timeout=5, token_file=tokens["alice"]) as alice, \
            ControllerClient(addr, timeout=5, token_file=tokens["bob"]) as bob:
        alice.register_ring(make_ring(2, ring_id="a"))
        before = pipeline.counters()
        code, message = refused(lambda: bob.register_ring(make_ring(2, ring_id="b",
                                                                    qpn_base=100)))
        assert code == "RESOURCE_EXHAUSTED" and "--max-slot-memory" in message, message
        assert pipeline.counters() == before and list(before) == ["a"]
        assert alice.renew_lease("a")["ring_id"] == "a"
        assert list(alice.counters()["rings"]) == ["a"] and bob.counters()["rings"] == {}
        assert bob.counters()["switch"]["refused_limit"] == 1


def test_counters_stay_under_the_message_limit_at_max_rings() -> None:
    """1024 rings (the ceiling of --max-rings) of 32 ranks, 128-character ids, 64-character
    owner: the totals fit in a quarter of the limit; per-connection detail of every ring
    would not, and is refused by name; one ring's detail is fine."""
    hosts = 32
    service = ControllerService(
        SoftwareTarget(AggregationPipeline(), mac_ports(hosts).get),
        ControllerConfig(max_rings=1024, max_slot_memory=0, insecure=True))
    owner = "o" * 64
    t0 = time.monotonic()
    for i in range(1024):
        spec = make_ring(hosts, ring_id=f"{i:04d}".ljust(128, "x"), msg_size=256, window=1,
                         qpn_base=1000 + 64 * i)
        service.register_ring(pb.RegisterRingRequest(spec=spec_message(spec), slots=2), owner)
    register_s = time.monotonic() - t0
    totals = service.counters(pb.CountersRequest(), owner)
    assert len(totals.rings) == 1024
    assert totals.ByteSize() < MAX_MESSAGE // 4, totals.ByteSize()
    one = service.counters(pb.CountersRequest(ring_id=totals.rings[7].ring_id,
                                              connections=True), owner)
    assert len(one.rings[0].connections) == 32 and one.ByteSize() < 64 << 10
    from switch.control.service import Refusal
    with pytest.raises(Refusal, match=r"per-connection counters of 1024 rings take \d+ bytes, "
                                      r"over the 4194304 byte message limit: ask for one ring"):
        service.counters(pb.CountersRequest(connections=True), owner)
    print(f"1024 rings x 32 ranks registered in {register_s:.1f} s; Counters totals "
          f"{totals.ByteSize()} bytes, one ring with detail {one.ByteSize()} bytes")


def test_serve_on_a_foreign_address_is_an_os_error() -> None:
    target = SoftwareTarget(AggregationPipeline(), mac_ports(1).get)
    with pytest.raises(OSError, match="cannot listen on 192.0.2.1:50051"):
        serve(target, "192.0.2.1:50051", config=ControllerConfig(insecure=True))


def test_config_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_rings 2000 is not in 1..1024"):
        ControllerConfig(max_rings=2000)
    with pytest.raises(ValueError, match="default lease 10 ms is not in 100..3600000"):
        ControllerConfig(default_lease_ms=10)


def test_unreachable_controller_times_out_clearly() -> None:
    with ControllerClient("127.0.0.1:1", timeout=0.3) as c:
        with pytest.raises(ControllerError, match="did not answer Ping in 0.3 s"):
            c.ping()


def test_programming_calls_get_their_own_deadline(start: Start,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A target that takes 1.5 s to program a ring: RegisterRing waits for it under the
    programming deadline (3 s) while Ping keeps the short one (1 s), named when missed."""
    addr, pipeline = start()
    slow = pipeline.register_ring

    def register_ring(*args: object, **kw: object) -> object:
        time.sleep(1.5)
        return slow(*args, **kw)

    monkeypatch.setattr(pipeline, "register_ring", register_ring)
    with ControllerClient(addr, timeout=1, program_timeout=3) as c:
        assert c.register_ring(make_ring(3))["ring_id"] == make_ring(3).ring_id
        assert c.ping()["target"] == "software"
    with ControllerClient(addr, timeout=1) as c:
        with pytest.raises(ControllerError, match="did not answer RegisterRing in 1 s"):
            c.register_ring(make_ring(2))


def test_resolve_ports_normalises_macs() -> None:
    spec = make_ring(2)
    shouting = dataclasses.replace(spec, connections=tuple(
        dataclasses.replace(c, src_mac=c.src_mac.upper()) for c in spec.connections))
    assert resolve_ports(shouting, mac_ports(2).get) == ip_ports(spec)


def test_resolve_ports_rejects_an_ip_on_two_ports() -> None:
    spec = _conn(make_ring(3), 1, src_mac=lab_mac(2))
    with pytest.raises(ValueError, match=r"rank 1 \(10.77.0.2\) is on switch ports 2 and 3"):
        resolve_ports(spec, mac_ports(3).get)


def test_importing_netreduce_loads_no_switch_code() -> None:
    code = ("import sys, netreduce, netreduce.comm, nr_contract.client\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('switch', 'nr_contract')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent.parent).stdout
    assert json.loads(out.replace("'", '"')) == [      # the contract package, nothing of switch
        "nr_contract", "nr_contract.client", "nr_contract.control_pb2",
        "nr_contract.control_pb2_grpc", "nr_contract.distribution", "nr_contract.spec",
        "nr_contract.tokens"]


def test_ctl_prints_json(start: Start, tmp_path: Path, tokens: dict[str, Path],
                         capsys: pytest.CaptureFixture[str]) -> None:
    addr, _ = start(tokens={ALICE: "alice"})
    spec_file = tmp_path / "ring.json"
    spec_file.write_text(make_ring(2).to_json())
    auth = ["--addr", addr, "--token-file", str(tokens["alice"])]
    assert ctl.main([*auth, "register", str(spec_file), "--slots", "512"]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == 512
    assert ctl.main(["--addr", addr, "ping"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "software"
    assert ctl.main([*auth, "counters"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got["rings"]) == ["ring"] and got["rings"]["ring"]["connections"] == []
    assert ctl.main([*auth, "counters", "--ring", "ring", "--connections"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rings"]["ring"]["connections"]) == 2
    assert ctl.main([*auth, "renew", "ring"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ring_id": "ring", "lease_ms": 15000}
    assert ctl.main(["--addr", addr, "unregister", "ring"]) == 1
    assert "UNAUTHENTICATED: no credentials" in capsys.readouterr().err
    assert ctl.main([*auth, "unregister", "ring"]) == 0
    assert ctl.main([*auth, "unregister", "ring"]) == 1
    assert "NOT_FOUND: ring ring is not registered" in capsys.readouterr().err
    spec_file.write_text(json.dumps({**make_ring(2).to_dict(), "mtu": 1024.0}))
    assert ctl.main([*auth, "register", str(spec_file)]) == 1
    assert "spec.mtu: 1024.0 cannot be sent" in capsys.readouterr().err


def test_ctl_calls_the_controller_nr_controller_names(
        start: Start, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --addr, netreduce-ctl calls $NR_CONTROLLER (as netreduce.init does); --addr
    still wins; its errors and usage carry its installed name."""
    addr, _ = start(tokens={ALICE: "alice"})
    monkeypatch.setenv("NR_CONTROLLER", addr)
    assert ctl.main(["ping"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "software"
    monkeypatch.delenv("NR_CONTROLLER_CA", raising=False)
    monkeypatch.delenv("NR_CONTROLLER_INSECURE", raising=False)
    monkeypatch.setenv("NR_CONTROLLER", "192.0.2.1:50051")     # TEST-NET-1: refused before
    assert ctl.main(["ping"]) == 1                              # any packet (no CA for TLS)
    err = capsys.readouterr().err
    assert err.startswith("netreduce-ctl: UNAVAILABLE: controller at 192.0.2.1:50051: ")
    assert ctl.main(["--addr", addr, "ping"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        ctl.main(["nonsense"])
    assert capsys.readouterr().err.startswith("usage: netreduce-ctl ")




def test_a_lease_keeper_hears_a_restarted_controller_within_a_second(start: Start) -> None:
    """Over real gRPC: the controller stops (GOAWAY) and a fresh one starts on its port while
    the ring is idle and the next renewal is 20 s away; the keeper, told by its client that
    the connection dropped, probes every PROBE_POLL s and reports the ring's loss as soon as
    the new controller answers NOT_FOUND (netreduce/registration.py)."""
    from netreduce.registration import LeaseKeeper, SwitchStatus
    addr, _ = start()
    first = ControllerClient(addr)
    first.register_ring(make_ring(2))
    lost: list[tuple[float, str]] = []
    keeper = LeaseKeeper(first, SwitchStatus(addr, "ring", 256, lease_ms=60_000),
                         lambda why: lost.append((time.monotonic(), why)))
    try:
        first.renew_lease("ring")                           # the connection is up
        pipeline = AggregationPipeline()
        start.servers[0].stop()                             # type: ignore[attr-defined]
        server, _ = serve(SoftwareTarget(pipeline, mac_ports(3).get, dict, dict), addr,
                          config=ControllerConfig(insecure=True))
        up = time.monotonic()
        try:
            while not lost and time.monotonic() - up < 5:
                time.sleep(0.01)
        finally:
            server.stop()
    finally:
        keeper.stop()
        first.close()
    assert lost and lost[0][0] - up < 1.0, lost
    assert "NOT_FOUND" in lost[0][1] and "ring ring" in lost[0][1], lost
