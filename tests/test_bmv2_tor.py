"""The BMv2 ToR target without BMv2: a ToR registration -> table entries and groups, refusals
by name of what tor.p4 cannot hold, bookkeeping and counters over the fake P4Runtime session
of tests/test_bmv2.py; TorSwitch serves it like the software ToR."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from nr_contract.spec import TOR_COUNTERS, TRANSIT_COUNTERS, RingSpec
from switch.control.bmv2_tor import Bmv2TorTarget, plan_tor_ring
from switch.control.fabric import TorTarget
from switch.control.fabric_rpc import TorSwitch
from switch.dataplane.interswitch import Endpoint, ring_tag
from switch.dataplane.tor import TorConfig, TorPipeline, check_tor_ring
from switch.p4.program import contract
from tests.conformance.role_harness import tor_args
from tests.conformance.roles import all_role_vectors
from tests.fake_p4runtime import FakeSession
from tests.roce_layers import make_ring

C = contract()
CONFIG = TorConfig(0, 100, Endpoint("02:4e:53:00:00:01", "10.78.0.1"),
                   Endpoint("02:4e:53:00:00:fe", "10.78.0.254"))
PORTS = {1: "h0", 2: "h1", 100: "up"}
SPEC = make_ring(4, msg_size=256, window=2)          # racks 0 0 1 1: this ToR has ranks 0, 1
LOCAL = {SPEC.connections[0].src_ip: 1, SPEC.connections[1].src_ip: 2}


@pytest.fixture
def session() -> FakeSession:
    return FakeSession()


@pytest.fixture
def tor(session: FakeSession) -> Bmv2TorTarget:
    return Bmv2TorTarget(session, CONFIG, PORTS, {"02:4e:53:00:00:fe": 100})


def test_plan_translates_the_registration() -> None:
    lanes = check_tor_ring(CONFIG, SPEC, LOCAL)
    plan = plan_tor_ring(CONFIG, SPEC, LOCAL, lanes, 16, 2, 7, C)
    assert plan.group.group_id == C.ring_group_base + 2
    # results of 0 -> 1 (lane 0, rank 1's port) and 3 -> 0 (lane 2, rank 0's port), the
    # continuation and both partials on the uplink, the transit copy of 3 -> 0 to port 1
    assert plan.group.replicas == ((2, 0), (1, 2), (100, C.cont_rid), (100, C.part_a_rid),
                                   (100, C.part_b_rid), (1, C.fwd_rid))
    tables = [e.table.rsplit(".", 1)[1] for e in plan.install_order]
    assert tables == ["ring_table"] + ["replica_table"] * 3 + ["tor_tags"] \
        + ["conn_table"] * 2 + ["tor_transit"]
    ring = dict(plan.install_order[0].params)
    assert ring == {"epoch": 7, "slot_mask": 15, "full": 3, "w2": 4, "tor_id": 0,
                    "uplink": 100, "tag": ring_tag(SPEC.ring_id), "me_mac": CONFIG.me.mac,
                    "me_ip": CONFIG.me.ip, "spine_mac": CONFIG.spine.mac,
                    "spine_ip": CONFIG.spine.ip, "has_leave": 1, "leave_lane": 1,
                    "leave_rank": 1, "has_enter": 1, "enter_lane": 2, "enter_rank": 3}
    conns = [dict(e.params) for e in plan.install_order if e.table.endswith("conn_table")]
    assert [(p["rank"], p["in_port"], p["out_port"]) for p in conns] == [(0, 1, 2), (1, 2, 100)]
    transit, = (dict(e.params) for e in plan.install_order if e.table.endswith("tor_transit"))
    assert transit == {"ring": 2, "psn0": SPEC.connections[3].psn0, "out_port": 1}


def test_register_is_idempotent_and_unregister_removes_everything(
        tor: Bmv2TorTarget, session: FakeSession) -> None:
    before = dict(session.entries), dict(session.groups)
    tor.register_ring(SPEC, LOCAL, 16)
    tor.register_ring(SPEC, LOCAL, 16)
    assert len(session.entries) == len(before[0]) + 8
    with pytest.raises(ValueError, match="already registered differently"):
        tor.register_ring(SPEC, LOCAL, 32)
    other = RingSpec.from_dict({**SPEC.to_dict(), "ring_id": "other"})
    with pytest.raises(ValueError, match="connection of rank 0 is already registered by ring"):
        tor.register_ring(other, LOCAL, 16)
    tor.unregister_ring(SPEC.ring_id)
    assert (session.entries, session.groups) == before
    with pytest.raises(KeyError, match="not registered at the ToR"):
        tor.unregister_ring(SPEC.ring_id)


INTERLEAVED = {SPEC.connections[0].src_ip: 1, SPEC.connections[2].src_ip: 2}


@pytest.mark.parametrize("spec,local,slots,why", [
    (make_ring(4, msg_size=1024, window=2, mtu=1024), LOCAL, 16, "path MTU 1024"),
    (SPEC, INTERLEAVED, 16, "racks not contiguous: many_carried"),
    (SPEC, {c.src_ip: c.rank + 1 for c in SPEC.connections}, 16, "every rank is in rack 0"),
    (SPEC, LOCAL, 512, "512 slots"),
    (SPEC, {"10.9.9.9": 1}, 16, "not a non-empty subset"),   # TorPipeline's own checks first
])
def test_what_the_program_cannot_hold_is_refused_by_name(tor: Bmv2TorTarget, spec: RingSpec,
                                                         local: dict, slots: int,
                                                         why: str) -> None:
    with pytest.raises(ValueError, match=why):
        tor.register_ring(spec, local, slots)


def test_a_fifth_ring_is_refused(tor: Bmv2TorTarget) -> None:
    for i in range(C.max_rings):
        tor.register_ring(make_ring(4, ring_id=f"r{i}", qpn_base=0x100 * (i + 1)), LOCAL, 16)
    with pytest.raises(ValueError, match=f"holds {C.max_rings} rings"):
        tor.register_ring(make_ring(4, ring_id="r9", qpn_base=0x900), LOCAL, 16)


def test_counters_have_the_software_tors_shape(session: FakeSession) -> None:
    values: dict = {}
    tor = Bmv2TorTarget(session, CONFIG, PORTS, {},
                        read_register=lambda name, i: values.get((name, i)))
    session.values["tor_ctr"][C.tor_counter_index(0, "totals")] = (3, 0)
    tor.register_ring(SPEC, LOCAL, 16)                              # baseline: 3
    session.values["tor_ctr"][C.tor_counter_index(0, "totals")] = (5, 0)
    session.values["tor_transit_ctr"][C.transit_counter_index(0, "forwarded")] = (1, 0)
    session.values["ring_ctr"][C.ring_counter_index(0, "completed")] = (2, 0)
    session.values["conn_ctr"][C.conn_counter_index(0, 1, "aggregated")] = (4, 0)
    session.values["tor_is_ctr"][C.is_counter_ids["drop_corrupt"]] = (6, 0)
    values["ring_next", 0] = 1 << 24 | 9                # epoch 1, next_emit 9
    values["tor_skipped", 0] = 1 << 32 | 7              # epoch 1, 7 slots skipped
    software = TorPipeline(CONFIG)
    software.register_ring(SPEC, LOCAL, 16)
    got, want = tor.counters()[SPEC.ring_id], software.counters()[SPEC.ring_id]
    assert got.keys() == want.keys() and got["counters"].keys() == want["counters"].keys()
    assert got["connections"][1] == {**want["connections"][1], "counters": {
        **want["connections"][1]["counters"], "aggregated": 4}}
    assert got["tor"] == {**dict.fromkeys(TOR_COUNTERS, 0), "totals": 2, "slots_skipped": 7}
    assert got["transit"] == [{"rank": 3, "out_port": 1, "counters": {
        **dict.fromkeys(TRANSIT_COUNTERS, 0), "forwarded": 1}}]
    assert (got["next_emit"], got["counters"]["completed"]) == (9, 2)
    assert tor.interswitch == {**software.interswitch, "drop_corrupt": 6}
    values["ring_next", 0] = 9 << 24 | 5               # another epoch's: nothing emitted yet
    assert tor.counters()[SPEC.ring_id]["next_emit"] == 0


def test_tor_switch_serves_it_like_the_software_tor() -> None:
    """The fabric's TorSwitch wraps the BMv2 ToR as it wraps a TorPipeline: the same
    registration arguments (a role vector's), the same counters shape."""
    vector = next(v for v in all_role_vectors() if v.name == "tor_partial_up_total_down")
    config, [(spec, local, slots)] = tor_args(vector.setup)
    ring = vector.setup["rings"][0]
    target = Bmv2TorTarget(FakeSession(), config, {1: "a", 2: "b", 100: "up"},
                           vector.setup["macs"])
    switch = TorSwitch(TorTarget(target, target.port_of_mac,     # type: ignore[arg-type]
                                 target.port_counters), vector.setup["macs"])
    switch.register_in_fabric(RingSpec.from_dict(ring["spec"]), ring["slots"],
                              tuple(ring["racks"]))
    assert target._rings[spec.ring_id].args[1:4] == (spec, local, slots)
    snap = switch.counters()
    assert {"tor.partials_sent", "aggregated"} <= set(snap["rings"][spec.ring_id]["counters"])


def test_bmv2_lab_serves_it_as_a_tor_switch_with_its_limits() -> None:
    """`python -m labswitches.bmv2_lab --role tor` serves the BMv2 ToR to the fabric's controller
    as a ToR process serves the software one, publishing tor.p4's limits (path MTU 256)."""
    from labswitches.bmv2_lab import served
    target = Bmv2TorTarget(FakeSession(), CONFIG, PORTS, {"02:4e:52:00:00:01": 1})
    switch = served(SimpleNamespace(target=target))          # type: ignore[arg-type]
    assert isinstance(switch, TorSwitch)
    assert switch.limits()["path_mtus"] == [256] and switch.limits()["max_slots"] == 256
    assert switch.limits()["max_rings"] == 4                   # limits.p4's NR_MAX_RINGS
    assert switch.port_of_mac("02:4e:52:00:00:01") == 1


def test_bmv2_lab_names_a_missing_tor_option(capsys: pytest.CaptureFixture[str]) -> None:
    from labswitches import bmv2_lab
    assert bmv2_lab.main(["--role", "tor", "--port", "1=nrtap0", "--port", "100=up",
                          "--uplink", "100"]) == 1
    assert "--role tor needs --tor-id, --me, --spine" in capsys.readouterr().err
