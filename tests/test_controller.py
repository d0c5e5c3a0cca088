"""The controller over real gRPC on 127.0.0.1: SoftwareTarget, ControllerClient and switch.ctl."""
from __future__ import annotations

import dataclasses
import json
from typing import Iterator

import grpc
import pytest

from roce_layers import WRITE_ONLY, ip_ports, mac_ports, make_ring, write_frame
from switch import ctl
from switch.controller import (SERVICE, ControllerClient, ControllerError, SoftwareTarget,
                               resolve_ports, serve)
from switch.pipeline import AggregationPipeline

PORT_COUNTERS = {1: {"rx_packets": 3, "tx_packets": 4}}


@pytest.fixture
def controller() -> Iterator[tuple[str, AggregationPipeline]]:
    pipeline = AggregationPipeline()
    target = SoftwareTarget(pipeline, mac_ports(3).get, lambda: PORT_COUNTERS)
    server, port = serve(target, "127.0.0.1:0")
    try:
        yield f"127.0.0.1:{port}", pipeline
    finally:
        server.stop(None)


@pytest.fixture
def client(controller: tuple[str, AggregationPipeline]) -> Iterator[ControllerClient]:
    with ControllerClient(controller[0], timeout=5) as c:
        yield c


def test_ping_publishes_the_targets_limits(client: ControllerClient) -> None:
    assert client.ping() == {"target": "software", "limits": {
        "path_mtus": [256, 512, 1024, 2048, 4096], "max_slots": 1024, "max_ranks": 32,
        "max_rings": 0, "free_rings": 0, "max_slot_memory": 0, "default_lease_ms": 0}}


def test_register_resolves_ports_from_macs(client: ControllerClient,
                                           controller: tuple[str, AggregationPipeline]) -> None:
    spec = make_ring(3)
    assert client.register_ring(spec) == {"ring_id": "ring", "slots": 256,
                                          "ports": {"10.77.0.1": 1, "10.77.0.2": 2,
                                                    "10.77.0.3": 3}}
    pipeline = controller[1]
    frame = write_frame(spec.connections[0], 0, WRITE_ONLY, bytes(256))
    assert pipeline.process(memoryview(frame), 1, lambda port, parts: None)
    ring = client.counters()["rings"]["ring"]
    assert ring["counters"]["aggregated"] == 1
    assert [(c["in_port"], c["out_port"]) for c in ring["connections"]] == [(1, 2), (2, 3), (3, 1)]


def test_register_with_slots_and_unregister(client: ControllerClient) -> None:
    assert client.register_ring(make_ring(2), slots=512)["slots"] == 512
    assert client.counters()["rings"]["ring"]["slots"] == 512
    assert client.unregister_ring("ring") == {"ring_id": "ring"}
    assert client.counters()["rings"] == {}


def test_counters_carry_the_dataplane_ports(client: ControllerClient) -> None:
    got = client.counters()
    assert got == {"target": "software", "rings": {},
                   "ports": {"1": {"rx_packets": 3, "tx_packets": 4}}}


def test_unknown_mac_is_a_clear_error(client: ControllerClient) -> None:
    with pytest.raises(ControllerError) as e:
        client.register_ring(make_ring(4))                      # host 3 is on no port
    assert e.value.code == "INVALID_ARGUMENT"
    assert e.value.message == ("dst MAC 02:4e:52:00:00:04 of rank 3 (10.77.0.4) not seen on "
                               "any switch port")


def test_invalid_registration_is_invalid_argument(client: ControllerClient) -> None:
    with pytest.raises(ControllerError, match=r"INVALID_ARGUMENT: ring ring: 64 slots < 2 x 128"):
        client.register_ring(make_ring(2, msg_size=65536), slots=64)


def test_duplicate_ring_is_invalid_argument(client: ControllerClient) -> None:
    client.register_ring(make_ring(2))
    with pytest.raises(ControllerError, match="already registered differently"):
        client.register_ring(make_ring(2), slots=1024)


def test_unregister_unknown_ring_is_not_found(client: ControllerClient) -> None:
    with pytest.raises(ControllerError) as e:
        client.unregister_ring("nope")
    assert (e.value.code, e.value.message) == ("NOT_FOUND", "ring nope is not registered")


@pytest.mark.parametrize("request_bytes,match", [
    (b"not json", "Expecting value"),
    (b"[1]", "must be a JSON object"),
    (b"{}", "needs a complete 'spec'"),
    (b'{"spec": {"ring_id": "x"}}', "needs a complete 'spec'"),
])
def test_malformed_requests_are_invalid_argument(controller: tuple[str, AggregationPipeline],
                                                 request_bytes: bytes, match: str) -> None:
    with grpc.insecure_channel(controller[0]) as channel:
        rpc = channel.unary_unary(f"/{SERVICE}/RegisterRing")
        with pytest.raises(grpc.RpcError) as e:
            rpc(request_bytes, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert match in e.value.details()


def test_slots_must_be_an_integer(controller: tuple[str, AggregationPipeline]) -> None:
    req = json.dumps({"spec": make_ring(2).to_dict(), "slots": "many"}).encode()
    with grpc.insecure_channel(controller[0]) as channel:
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(f"/{SERVICE}/RegisterRing")(req, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_serve_on_a_foreign_address_is_an_os_error() -> None:
    target = SoftwareTarget(AggregationPipeline(), mac_ports(1).get)
    with pytest.raises(OSError, match="cannot listen on 192.0.2.1:50051"):
        serve(target, "192.0.2.1:50051")


def test_unreachable_controller_times_out_clearly() -> None:
    with ControllerClient("127.0.0.1:1", timeout=0.3) as c:
        with pytest.raises(ControllerError, match="did not answer Ping in 0.3 s"):
            c.ping()


def test_resolve_ports_normalises_macs() -> None:
    spec = make_ring(2)
    shouting = dataclasses.replace(spec, connections=tuple(
        dataclasses.replace(c, src_mac=c.src_mac.upper()) for c in spec.connections))
    assert resolve_ports(shouting, mac_ports(2).get) == ip_ports(spec)


def test_resolve_ports_rejects_an_ip_on_two_ports() -> None:
    spec = make_ring(3)
    c1 = dataclasses.replace(spec.connections[1], src_mac="02:4e:52:00:00:03")
    spec = dataclasses.replace(spec, connections=(spec.connections[0], c1, spec.connections[2]))
    with pytest.raises(ValueError, match=r"rank 1 \(10.77.0.2\) is seen on switch ports 2 and 3"):
        resolve_ports(spec, mac_ports(3).get)


def test_ctl_prints_json(controller: tuple[str, AggregationPipeline], tmp_path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    addr = controller[0]
    spec_file = tmp_path / "ring.json"
    spec_file.write_text(make_ring(2).to_json())
    assert ctl.main(["--addr", addr, "register", str(spec_file), "--slots", "512"]) == 0
    assert json.loads(capsys.readouterr().out)["slots"] == 512
    assert ctl.main(["--addr", addr, "ping"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "software"
    assert ctl.main(["--addr", addr, "counters"]) == 0
    assert list(json.loads(capsys.readouterr().out)["rings"]) == ["ring"]
    assert ctl.main(["--addr", addr, "unregister", "ring"]) == 0
    assert ctl.main(["--addr", addr, "unregister", "ring"]) == 1
    assert "NOT_FOUND: ring ring is not registered" in capsys.readouterr().err
