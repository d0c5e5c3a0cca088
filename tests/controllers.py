"""A controller over real gRPC on 127.0.0.1 for the controller's tests (test_controller.py:
its API, validation, leases and limits; test_controller_security.py: credentials,
ownership, TLS, tenants apart): a software target behind it, credentials of two principals,
the fixtures that start one and connect to it."""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Callable, Iterator

import pytest

from nr_contract.client import ControllerClient, ControllerError
from switch.control.config import ControllerConfig
from switch.control.service import TlsFiles, serve
from switch.control.target import SoftwareTarget
from switch.dataplane.pipeline import AggregationPipeline
from tests.roce_layers import mac_ports

EVERYWHERE = ipaddress.ip_network("0.0.0.0/0")
PORT_COUNTERS = {1: {"ifname": "p1", "rx_packets": 3, "tx_packets": 4}}
ALICE = "alice-secret-0123456789"
BOB = "bob-secret-0123456789abc"

#: start(hosts=3, tls=None, **ControllerConfig fields) -> (address, pipeline)
Start = Callable[..., tuple[str, AggregationPipeline]]


def config_of(**config) -> ControllerConfig:
    """ControllerConfig(**config), insecure when it names no tokens, and with a hosts policy
    letting every principal use every address when it names several and no policy."""
    if "tokens" not in config:
        config.setdefault("insecure", True)
    elif len(set(config["tokens"].values())) > 1:
        config.setdefault("hosts_policy", {who: (EVERYWHERE,)
                                           for who in config["tokens"].values()})
    return ControllerConfig(**config)


@pytest.fixture
def start() -> Iterator[Start]:
    """start(hosts=3, **ControllerConfig fields) -> (address, pipeline) of a controller
    (config_of: insecure without tokens)."""
    servers = []

    def run(hosts: int = 3, tls: TlsFiles | None = None, **config) -> tuple[str, AggregationPipeline]:
        pipeline = AggregationPipeline()
        target = SoftwareTarget(pipeline, mac_ports(hosts).get, lambda: PORT_COUNTERS,
                                lambda: {"pipeline_errors": 0})
        server, port = serve(target, "127.0.0.1:0", config=config_of(**config), tls=tls)
        servers.append(server)
        return f"127.0.0.1:{port}", pipeline
    run.servers = servers       # type: ignore[attr-defined] - a test may stop one itself
    yield run
    for s in servers:
        s.stop()


@pytest.fixture
def controller(start: Start) -> tuple[str, AggregationPipeline]:
    return start()


@pytest.fixture
def client(controller: tuple[str, AggregationPipeline]) -> Iterator[ControllerClient]:
    with ControllerClient(controller[0], timeout=5) as c:
        yield c


@pytest.fixture
def tokens(tmp_path: Path) -> dict[str, Path]:
    """Token files: the switch's (alice, bob) and one per client."""
    files = {"switch": f"# principals\nalice {ALICE}\nbob {BOB}\n", "alice": f"{ALICE}\n",
             "bob": f"bob {BOB}\n", "mallory": "mallory-secret-0123456789\n"}
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"{name}.tokens"
        out[name].write_text(text)
        out[name].chmod(0o600)
    return out


def refused(call: Callable[[], object]) -> tuple[str, str]:
    """The code and message of the ControllerError `call` raises."""
    with pytest.raises(ControllerError) as e:
        call()
    return e.value.code, e.value.message
