"""The fabric's controller over separate switches' control APIs (switch/control/fabric_rpc.py):
every ToR and the spine serve the typed gRPC API (with a token), the fabric reaches them
through TorClient / SpineClient, and a whole simulated allreduce runs exactly with the rings
installed that way; refusals, rollback, leases and counters travel through the API too."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from nr_contract.client import ControllerClient, ControllerError
from switch.control.fabric import FabricTarget, SpineTarget, TorTarget
from switch.control.fabric_rpc import SpineClient, SpineSwitch, TorClient, TorSwitch
from switch.control.config import ControllerConfig
from switch.control.service import serve
from tests.fabricsim import Faults, Sim


class RpcFabric:
    """Serves each switch of a Sim over gRPC and builds the FabricTarget over clients."""

    def __init__(self, token: Path, lease_ms: int = 15_000):
        self.token = token
        self.lease_ms = lease_ms
        self.servers: list = []
        self.clients: list = []
        self.addrs: dict[str, str] = {}

    def _serve(self, target) -> str:
        server, port = serve(target, "127.0.0.1:0", config=ControllerConfig.with_token_file(
            self.token, default_lease_ms=self.lease_ms))
        self.servers.append(server)
        self.addrs[target.name] = f"127.0.0.1:{port}"
        return self.addrs[target.name]

    def __call__(self, tors: list[TorTarget], spine: SpineTarget) -> FabricTarget:
        tor_clients = []
        for t in tors:
            macs = {m.hex(":"): p for m, p in sim_macs(t).items()}
            tor_clients.append(TorClient(t.tor_id, self._serve(TorSwitch(t, macs)),
                                         str(self.token)))
        spine_client = SpineClient(self._serve(SpineSwitch(spine)), str(self.token))
        self.clients = [*tor_clients, spine_client]
        return FabricTarget(tor_clients, spine_client)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.stop(None)


def sim_macs(tor: TorTarget) -> dict[bytes, int]:
    """The static MAC table of the Sim's switch behind `tor` (port_of_mac is its bound method)."""
    return tor._port_of_mac.__self__.macs        # type: ignore[attr-defined]


@pytest.fixture
def rpc(tmp_path: Path) -> Iterator[RpcFabric]:
    token = tmp_path / "token"
    token.write_text("fabric s3cret-of-the-fabric-test\n")
    token.chmod(0o600)
    fabric = RpcFabric(token)
    yield fabric
    fabric.close()


@pytest.mark.parametrize("racks,faults", [([2, 2], Faults()), ([3, 2], Faults(loss=0.02))],
                         ids=["2x2", "3+2-lossy"])
def test_allreduce_through_switches_programmed_over_grpc(rpc: RpcFabric, racks: list[int],
                                                         faults: Faults) -> None:
    sim = Sim(racks, elements=64 * 24, seed=3, control=rpc, host_faults=faults,
              uplink_faults=faults)
    sim.run()
    for rank, got in enumerate(sim.results()):
        assert np.array_equal(got, sim.expected), f"rank {rank}: result differs from numpy"
    assert sim.registration["racks"] == {c.src_ip: sim.rack_of[c.rank]
                                         for c in sim.spec.connections}
    counters = sim.fabric.counters()
    ring = counters["rings"]["mr"]
    K = sim.hosts[0].packets
    for j, n in enumerate(racks):
        tor = ring["switches"][f"tor{j}"]
        assert tor["counters"]["aggregated"] == n * K            # every contribution once
        assert tor["tor"]["partials_sent"] == K                  # one partial per slot
    spine = ring["switches"]["spine"]
    assert spine["counters"]["completed"] == K and spine["tors"] == [0, 1]
    assert spine["counters"]["totals_sent"] >= 2 * K
    tiers = ring["counters"]                     # the same, flat, as the hosts read them
    assert [tiers[f"tor{j}.aggregated"] for j in range(len(racks))] == [n * K for n in racks]
    assert tiers["spine.completed"] == tiers["spine.per_tor.1.partials"] == K
    assert set(counters["interswitch"]) == {"tor0", "tor1", "spine"}
    # each switch holds the ring under a lease, owned by the fabric's principal
    for name, addr in rpc.addrs.items():
        with ControllerClient(addr, token_file=rpc.token) as c:
            lease = c.counters("mr")["leases"]["mr"]
            assert lease["owner"] == "fabric" and lease["remaining_ms"] > 0
    sim.fabric.unregister_ring("mr")
    for addr in rpc.addrs.values():
        with ControllerClient(addr, token_file=rpc.token) as c:
            assert c.counters()["rings"] == {}


def test_a_fabric_switch_refuses_direct_registration_and_bad_racks(rpc: RpcFabric) -> None:
    sim = Sim([2, 2], elements=64, control=rpc)
    spec = sim.spec
    with ControllerClient(rpc.addrs["tor0"], token_file=rpc.token) as c:
        with pytest.raises(ControllerError, match="FAILED_PRECONDITION: .*part of a two-tier "
                                                  "fabric"):
            c.register_ring(spec)
        with pytest.raises(ControllerError, match=r"FAILED_PRECONDITION: .*rank 2 .*said to be "
                                                  r"in rack 0 but is on no host port of tor0"):
            c.register_ring(spec, racks=[0, 0, 0, 0])
        with pytest.raises(ControllerError, match="INVALID_ARGUMENT: racks: 3 entries"):
            c.register_ring(spec, racks=[0, 0, 1])
    with ControllerClient(rpc.addrs["spine"], token_file=rpc.token) as c:
        with pytest.raises(ControllerError, match="ToR.*7.*not cabled"):
            c.register_ring(dataclasses.replace(spec, ring_id="x"), racks=[0, 0, 7, 7])


def test_a_client_must_talk_to_the_switch_it_names(rpc: RpcFabric) -> None:
    Sim([1, 1], elements=64, control=rpc)
    with pytest.raises(ValueError, match="is 'tor1', not 'tor0'"):
        TorClient(0, rpc.addrs["tor1"], str(rpc.token))


class FakeDataPlane:
    """What role_pipeline reads of a DataPlane."""

    ports = {1: "a", 2: "b", 100: "up"}

    def static_port_of_mac(self, mac: str) -> int | None:
        return None

    def port_counters(self) -> dict:
        return {}

    def switch_counters(self) -> dict:
        return {}


@pytest.mark.parametrize("argv,match", [
    (["--role", "tor", "--uplink", "100"], "--role tor needs --tor-id, --me, --spine"),
    (["--role", "tor", "--tor-id", "0", "--uplink", "7", "--me", "02:00:00:00:00:01,10.0.0.1",
      "--spine", "02:00:00:00:00:02,10.0.0.2"], "--uplink 7 is not one of the ports"),
    (["--role", "spine", "--me", "02:00:00:00:00:02,10.0.0.2"], "--role spine needs"),
    (["--role", "spine", "--me", "02:00:00:00:00:02,10.0.0.2",
      "--tor", "0=9,02:00:00:00:00:01,10.0.0.1"], r"ToR\(s\) \[0\] on no port"),
])
def test_role_options_are_checked_and_named(argv: list[str], match: str) -> None:
    from switch.daemon import build_parser, role_pipeline
    args = build_parser().parse_args(["--port", "1=a", *argv])
    with pytest.raises(ValueError, match=match):
        role_pipeline(args, FakeDataPlane())  # type: ignore[arg-type]


def test_role_pipelines_are_the_fabric_switches() -> None:
    from switch.daemon import build_parser, role_pipeline
    tor_args = build_parser().parse_args([
        "--port", "1=a", "--role", "tor", "--tor-id", "3", "--uplink", "100",
        "--me", "02:00:00:00:00:01,10.0.0.1", "--spine", "02:00:00:00:00:02,10.0.0.2",
        "--mac", "02:4e:52:00:00:01=1", "--mac", "02:4e:52:00:00:09=100"])
    _, tor = role_pipeline(tor_args, FakeDataPlane())  # type: ignore[arg-type]
    assert isinstance(tor, TorSwitch) and tor.name == "tor3"
    assert tor.counters()["static_macs"] == {"02:4e:52:00:00:01": 1}      # uplink left out
    spine_args = build_parser().parse_args([
        "--port", "1=a", "--role", "spine", "--me", "02:00:00:00:00:02,10.0.0.2",
        "--tor", "0=1,02:00:00:00:00:01,10.0.0.1", "--tor", "1=2,02:00:00:00:00:03,10.0.0.3"])
    _, spine = role_pipeline(spine_args, FakeDataPlane())  # type: ignore[arg-type]
    assert isinstance(spine, SpineSwitch) and spine.name == "spine"


def test_the_lab_spreads_hosts_over_racks_as_evenly_as_possible() -> None:
    from labswitches.fabric_lab import rack_sizes
    assert [rack_sizes(h, r) for h, r in ((4, 2), (5, 2), (6, 2), (7, 3), (2, 2))] == \
        [[2, 2], [3, 2], [3, 3], [3, 2, 2], [1, 1]]
    with pytest.raises(ValueError, match="3 racks for 2 hosts"):
        rack_sizes(2, 3)


LOSSY_PROBE = """
import json, socket, subprocess, sys
from labswitches.fabric_lab import frames_lost, lossy_egress
subprocess.run(["ip", "link", "add", "nrla", "type", "veth", "peer", "name", "nrlb"], check=True)
for d in ("nrla", "nrlb"):     # no IPv6: its ND and MLD frames would meet the loss too
    subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{d}.disable_ipv6=1"], check=True)
    subprocess.run(["ip", "link", "set", d, "up"], check=True)
lossy_egress("nrla", float(sys.argv[1]))
a = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88b5)); a.bind(("nrla", 0))
b = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88b5)); b.bind(("nrlb", 0))
b.settimeout(0.05)
sent = refused = got = 0
frame = bytes.fromhex("02aabbccddee02aabbccddff88b5") + bytes(64)
for i in range(int(sys.argv[2])):
    try:
        a.send(frame)
    except OSError:          # ENOBUFS: the frame was dropped (the sender goes on, as BMv2)
        refused += 1
    sent += 1
    if i % 50 == 49:         # never more in flight than the veth's backlog takes
        while True:
            try:
                b.recv(2048)
                got += 1
            except socket.timeout:
                break
print(json.dumps({"sent": sent, "got": got, "refused": refused, "lost": frames_lost("nrla")}))
"""


def test_lossy_egress_loses_the_share_asked_and_counts_it() -> None:
    """labswitches/fabric_lab.py's loss on a BMv2 end's veth (tc: htb, classic BPF, pfifo of
    limit 0; this machine's kernel has no netem): 5% of 4000 frames, at random, each lost
    frame counted; the rest arrive."""
    import json
    import os
    import subprocess
    import sys
    from tests.p4tools import unavailable
    if os.geteuid() != 0:
        unavailable("needs root: a network namespace and a veth pair")
    ns = f"nrlt{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        root = Path(__file__).resolve().parents[1]
        run = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", LOSSY_PROBE,
                              "5", "4000"], capture_output=True, text=True, timeout=120,
                             cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert got["lost"] == got["refused"] == got["sent"] - got["got"], got
    assert 120 <= got["lost"] <= 290, got            # 200 expected; 5 sigma either way


def test_lab_switch_kinds_compare_with_their_defaults_spelt_out() -> None:
    from tests.lab.labswitch import canonical
    assert canonical("racks:2") == canonical("racks:2:0") == "racks:2:0:soft:soft"
    assert canonical("racks:2:1.0:bmv2:bmv2") == "racks:2:1:bmv2:bmv2"
    assert canonical("racks:2:0:bmv2") != canonical("racks:2:0:bmv2:bmv2")
    assert (canonical("soft"), canonical("racks:2:x")) == ("soft", "racks:2:x")


def test_unregister_removes_the_ring_from_every_switch_that_answers(rpc: RpcFabric) -> None:
    """tor0 is unreachable: the spine and tor1 still lose the ring, and nothing renews
    tor0's lease any more (it lapses there)."""
    sim = Sim([2, 2], elements=64, control=rpc)
    rpc.servers[0].stop(None)                 # tor0's (RpcFabric serves the ToRs first)
    sim.fabric.unregister_ring("mr")
    assert sim.fabric.unregister_failures == 1
    for name in ("tor1", "spine"):
        with ControllerClient(rpc.addrs[name], token_file=rpc.token) as c:
            assert c.counters()["rings"] == {}, name
    assert all("mr" not in c.leases._leases for c in rpc.clients)


def test_a_switch_that_lost_the_ring_is_reported_to_the_job_within_a_lease(
        tmp_path: Path) -> None:
    """tor1 forgets the ring (as after a restart): its lease keeper's next renewal says
    NOT_FOUND, the fabric removes the ring everywhere, and the job's own renewal at the
    fabric's controller fails naming tor1, within one lease of the ToRs (600 ms)."""
    token = tmp_path / "token"
    token.write_text("fabric s3cret-of-the-fabric-test\n")
    token.chmod(0o600)
    rpc = RpcFabric(token, lease_ms=600)
    fabric_server = None
    try:
        sim = Sim([2, 2], elements=64, control=rpc)
        sim.fabric.unregister_ring("mr")                      # the job registers its own
        fabric_server, port = serve(sim.fabric, "127.0.0.1:0",
                                    config=ControllerConfig.with_token_file(token))
        with ControllerClient(f"127.0.0.1:{port}", token_file=token) as job:
            job.register_ring(dataclasses.replace(sim.spec, ring_id="job"))
            with ControllerClient(rpc.addrs["tor1"], token_file=token) as tor1:
                tor1.unregister_ring("job")                   # tor1 "restarted"
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5:
                try:
                    job.renew_lease("job")
                except ControllerError as e:
                    assert e.code == "NOT_FOUND" and "tor1 lost it" in e.message, e
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the job never learned that tor1 lost its ring")
            assert time.monotonic() - t0 < 0.6 + 0.5
            assert job.counters()["switch"]["rings_lost"] == 1
        for name in ("tor0", "spine"):
            with ControllerClient(rpc.addrs[name], token_file=token) as c:
                assert "job" not in c.counters()["rings"], name
    finally:
        if fabric_server is not None:
            fabric_server.stop(None)
        rpc.close()
