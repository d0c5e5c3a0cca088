"""The BMv2 spine target without BMv2: a spine registration -> table entries and groups,
refusals by name of what spine.p4 cannot hold, bookkeeping and counters over the fake
P4Runtime session of tests/test_bmv2.py; SpineSwitch serves it like the software spine."""
from __future__ import annotations

import pytest

from nr_contract.spec import LANE_OUTCOMES, RingSpec
from switch.control.bmv2_spine import Bmv2SpineTarget, plan_spine_ring, transit_match
from switch.control.fabric import SpineTarget
from switch.control.fabric_rpc import SpineSwitch
from switch.dataplane.interswitch import Endpoint, ring_tag
from switch.dataplane.packets import conn_key
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.p4.program import contract
from tests.conformance.role_harness import spine_args
from tests.conformance.roles import all_role_vectors
from tests.fake_p4runtime import FakeSession

C = contract()
ME = Endpoint("02:4e:53:00:00:fe", "10.78.0.254")
CONFIG = SpineConfig(ME, {j: (j + 1, Endpoint(f"02:4e:53:00:00:{j + 1:02x}", f"10.78.0.{j + 1}"))
                          for j in range(10)})
PORTS = {j + 1: f"veth{j}" for j in range(10)}
ROUTES = {1: 1, 3: 0}                       # racks 0 0 1 1: 1 -> 2 enters rack 1, 3 -> 0 rack 0
TRANSIT = {conn_key("10.77.0.2", "10.77.0.3", 0x11): 0, conn_key("10.77.0.4", "10.77.0.1", 0x12): 1}


@pytest.fixture
def session() -> FakeSession:
    return FakeSession()


@pytest.fixture
def spine(session: FakeSession) -> Bmv2SpineTarget:
    return Bmv2SpineTarget(session, CONFIG, PORTS, {"02:4e:53:00:00:01": 1})


def test_plan_translates_the_registration() -> None:
    plan = plan_spine_ring(CONFIG, "r", [0, 1], 16, ROUTES, TRANSIT, 2, 7, C)
    assert plan.group.group_id == C.ring_group_base + 2
    assert plan.group.replicas == ((1, 0), (2, 1))          # (ToR port, rid = lane)
    tables = [e.table.split(".")[1] for e in plan.install_order]
    assert tables == ["spine_lane_out"] * 2 + ["spine_lanes"] * 2 + ["spine_routes"] * 2 \
        + ["spine_rings"] + ["spine_transit"] * 2
    ring = next(e for e in plan.install_order if e.table.endswith("spine_rings"))
    assert ring.match == (("tag", ring_tag("r")),)
    assert dict(ring.params) == {"ring": 2, "epoch": 7, "slot_mask": 15, "full": 3}
    routes = {e.match[1][1]: dict(e.params)["to_lane"] for e in plan.install_order
              if e.table.endswith("spine_routes")}
    assert routes == {1: 1, 3: 0}
    out = [dict(e.params) for e in plan.install_order if e.table.endswith("spine_lane_out")]
    assert out[1] == {"tor_mac": "02:4e:53:00:00:02", "tor_ip": "10.78.0.2", "tor_id": 1,
                      "me_mac": ME.mac, "me_ip": ME.ip}
    assert transit_match(conn_key("10.77.0.2", "10.77.0.3", 0x11)) == \
        (("src_ip", "10.77.0.2"), ("dst_ip", "10.77.0.3"), ("dest_qp", 0x11))


def test_register_is_idempotent_and_unregister_removes_everything(
        spine: Bmv2SpineTarget, session: FakeSession) -> None:
    before = dict(session.entries), dict(session.groups)
    spine.register_ring("r", [0, 1], 16, 256, ROUTES, TRANSIT)
    spine.register_ring("r", [0, 1], 16, 256, ROUTES, TRANSIT)
    assert len(session.entries) == len(before[0]) + 9
    with pytest.raises(ValueError, match="already registered differently"):
        spine.register_ring("r", [0, 1], 32, 256, ROUTES, TRANSIT)
    with pytest.raises(ValueError, match="another ring's"):
        spine.register_ring("s", [0, 1], 16, 256, {}, TRANSIT)
    spine.unregister_ring("r")
    assert (session.entries, session.groups) == before
    assert session.log[-1] == ("delete", f"group {C.ring_group_base}")
    with pytest.raises(KeyError, match="not registered at the spine"):
        spine.unregister_ring("r")


@pytest.mark.parametrize("args,why", [
    (([*range(9)], 16, 256, {}), "9 ToRs, the BMv2 spine program takes 8"),
    (([0, 1], 16, 512, ROUTES), "path MTU 512"),
    (([0, 1], 16, 256, {0: 1, 1: 0, 2: 1, 3: 0}), r"ToR\(s\) \[0, 1\] would carry more than one"),
    (([0, 1], 512, 256, ROUTES), "512 slots"),
    (([0, 11], 16, 256, {}), "not cabled"),          # SpinePipeline's own checks come first
])
def test_what_the_program_cannot_hold_is_refused_by_name(spine: Bmv2SpineTarget, args: tuple,
                                                         why: str) -> None:
    with pytest.raises(ValueError, match=why):
        spine.register_ring("r", *args)


def test_a_fifth_ring_is_refused(spine: Bmv2SpineTarget) -> None:
    for i in range(C.max_rings):
        spine.register_ring(f"r{i}", [0, 1], 16, 256, {})
    with pytest.raises(ValueError, match=f"holds {C.max_rings} rings"):
        spine.register_ring("r9", [0, 1], 16, 256, {})


def test_counters_have_the_software_spines_shape(spine: Bmv2SpineTarget,
                                                 session: FakeSession) -> None:
    session.values["spine_lane_ctr"][C.lane_counter_index(0, 1, "partials")] = (3, 0)
    spine.register_ring("r", [0, 1], 16, 256, ROUTES, TRANSIT)     # baseline: 3
    session.values["spine_lane_ctr"][C.lane_counter_index(0, 1, "partials")] = (5, 0)
    session.values["spine_ring_ctr"][C.spine_counter_index(0, "completed")] = (2, 0)
    session.values["spine_is_ctr"][C.is_counter_ids["drop_corrupt"]] = (4, 0)
    software = SpinePipeline(CONFIG)
    software.register_ring("r", [0, 1], 16, 256, ROUTES, TRANSIT)
    got, want = spine.counters()["r"], software.counters()["r"]
    assert got.keys() == want.keys() and got["counters"].keys() == want["counters"].keys()
    assert got["per_tor"]["1"] == {**dict.fromkeys(LANE_OUTCOMES, 0), "partials": 2}
    assert got["counters"]["completed"] == 2 and got["next_total"] == 2   # no register reader
    assert spine.interswitch == {**software.interswitch, "drop_corrupt": 4}


def test_next_total_comes_from_the_register(session: FakeSession) -> None:
    values = {}
    spine = Bmv2SpineTarget(session, CONFIG, PORTS, {},
                            read_register=lambda name, i: values.get((name, i)))
    spine.register_ring("r", [0, 1], 16, 256, {})
    values["ring_next", 0] = 1 << 24 | 5            # epoch 1, next_total 5
    assert spine.counters()["r"]["next_total"] == 5
    values["ring_next", 0] = 9 << 24 | 5            # another epoch's: nothing totalled yet
    assert spine.counters()["r"]["next_total"] == 0


def test_spine_switch_serves_it_like_the_software_spine(spine: Bmv2SpineTarget) -> None:
    """The fabric's SpineSwitch wraps the BMv2 spine as it wraps a SpinePipeline: the same
    registration arguments (a role vector's), the same counters shape."""
    vector = next(v for v in all_role_vectors() if v.name == "spine_partials_and_totals")
    config, [args] = spine_args(vector.setup)
    ring = vector.setup["rings"][0]
    target = Bmv2SpineTarget(FakeSession(), config, {1: "a", 2: "b"}, {})
    switch = SpineSwitch(SpineTarget(target, target.port_counters))     # type: ignore[arg-type]
    switch.register_in_fabric(RingSpec.from_dict(ring["spec"]), ring["slots"],
                              tuple(ring["racks"]))
    assert target._rings[ring["ring_id"]].args == (args[0], tuple(args[1]), *args[2:])
    snap = switch.counters()
    assert set(snap["rings"][ring["ring_id"]]["counters"]) >= {"completed", "totals_sent",
                                                               "per_tor.0.partials"}
    assert set(snap["ports"]) == {"1", "2"}
    served = SpineSwitch(SpineTarget(target, target.port_counters),   # type: ignore[arg-type]
                         limits=target.limits())
    assert served.limits()["path_mtus"] == [256] and served.limits()["max_slots"] == 256
    assert served.limits()["max_rings"] == 4                   # limits.p4's NR_MAX_RINGS
    assert served.limits()["max_ranks"] == switch.limits()["max_ranks"]   # what Ping needs
