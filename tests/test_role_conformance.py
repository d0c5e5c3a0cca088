"""The two fabric roles (ToR, spine) of every target against the role vectors
(tests/conformance/roles.py), byte for byte and counter for counter.

Targets: 'software' (both roles) and 'bmv2' (both roles too: switch/p4/spine.p4 and
switch/p4/tor.p4, each vector on a simple_switch_grpc as a fresh one is: conformance/
bmv2_harness.py; vectors tagged many_carried are beyond both programs and skipped there). 'bmv2' needs simple_switch_grpc and p4c on PATH,
root and p4runtime-shell: without them it is skipped saying which is missing, or fails under
CI=true (tests/p4tools.py).
"""
from __future__ import annotations

import json
import struct
import subprocess
import zlib
from typing import Any, Iterator

import pytest
from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from nr_contract.spec import RingSpec
from switch.control.fabric import SpineTarget, TorTarget
from switch.control.fabric_rpc import SpineSwitch, TorSwitch
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Endpoint
from tests.conformance.check import check_vector, harness_fixture
from tests.conformance.format import (ANY_PAYLOAD_LENGTH, Harness, Vector, from_json, per_port,
                                      to_json)
from tests.conformance.role_harness import RoleHarness, spine_args, tor_args
from tests.conformance.role_model import MANY_CARRIED
from tests.conformance.roles import RACKS_2X2, all_role_vectors
from tests.conformance.tor_model import TorModel
from tests.p4tools import P4_TOOLS, require_tools
from tests.roce_layers import icrc_ok

VECTORS = all_role_vectors()

def bmv2_role_harness() -> Harness:
    require_tools(*P4_TOOLS)
    from tests.conformance.bmv2_role_harness import create_role_harness
    return create_role_harness()


target = harness_fixture({"software": RoleHarness, "bmv2": bmv2_role_harness})


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
def test_vector(target: Harness, vector: Vector) -> None:
    role = vector.setup["role"]
    if role not in getattr(target, "roles", ()):
        pytest.skip(f"the target has no {role} role")
    check_vector(target, vector)      # the single switch's check, step by step, then counters


def test_tor_slots_in_bursts(target: Harness) -> None:
    """Slot after slot, each fed as one burst (both contributions, then the total): the
    partial a pass sends keeps the rack's sums while the total right behind it is taken
    (BMv2 builds partials in egress; a first tor.p4 wrote the total over the sums they
    read), results and counters as the model's."""
    s = TorModel("tor_bursts", "48 slots in bursts", tor=0, racks=RACKS_2X2, slots=16)
    for k in range(48):
        s.complete(k, total=True)
    vector = s.vector()
    target.setup(vector.setup)
    for i in range(0, len(vector.steps), 3):
        steps = vector.steps[i:i + 3]
        got = per_port(target.send_burst([(x.in_port, x.frame) for x in steps],
                                         sum(len(x.expect) for x in steps)))
        assert got == per_port(out for x in steps for out in x.expect), f"slot {i // 3}"
    assert target.counters() == vector.counters


def test_vectors_survive_json() -> None:
    assert from_json(to_json(VECTORS)) == VECTORS


def counter_names(node: Any, path: str) -> Iterator[tuple[str, int]]:
    """(name, value) of every counter under `node`: ranks and ToR ids left out of the
    names, next_emit / next_total left out."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in ("rank", "next_emit", "next_total"):
                yield from counter_names(value, path if key.isdigit() else f"{path}.{key}")
    elif isinstance(node, list):
        for item in node:
            yield from counter_names(item, path)
    elif isinstance(node, int):
        yield path, node


def role_counter_names(counters: dict[str, Any]) -> Iterator[tuple[str, int]]:
    yield from counter_names(counters["interswitch"], "interswitch")
    for ring in counters["rings"].values():
        yield from counter_names(ring, "ring")


# a ToR never counts an overrun: rule 7 frees the window first (N >= 2W)
NEVER = {"tor": {"ring.counters.drop_overrun", "ring.connections.counters.drop_overrun"},
         "spine": set()}


def test_every_counter_is_exercised() -> None:
    """Each role's counters are each non-zero in some vector (except NEVER's)."""
    for role in NEVER:
        named = [c for v in VECTORS if v.setup["role"] == role
                 for c in role_counter_names(v.counters)]
        assert {n for n, _ in named} - {n for n, value in named if value} == NEVER[role], role


def mirrored(vector: Vector) -> list[tuple[Any, ...]]:
    """What TorSwitch / SpineSwitch pass to the pipeline for the setup's registrations."""
    setup, calls = vector.setup, []

    class Recorder:
        def __init__(self, config: Any) -> None:
            self.config = config

        def register_ring(self, *args: Any) -> None:
            calls.append(args)

    if setup["role"] == "tor":
        config, _ = tor_args(setup)
        tor = TorTarget(Recorder(config), setup["macs"].get)   # type: ignore[arg-type]
        switch: Any = TorSwitch(tor, setup["macs"])
    else:
        switch = SpineSwitch(SpineTarget(Recorder(spine_args(setup)[0])))  # type: ignore[arg-type]
    for ring in setup["rings"]:
        switch.register_in_fabric(RingSpec.from_dict(ring["spec"]), ring["slots"],
                                  tuple(ring["racks"]))
    return calls


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
def test_setup_is_what_the_fabric_switches_pass(vector: Vector) -> None:
    """The harness's pipeline arguments are exactly those TorSwitch / SpineSwitch derive from
    the ring and its racks (what a ToR or the spine receives from the fabric)."""
    if vector.setup["role"] == "tor":
        want = [tuple(r) for r in tor_args(vector.setup)[1]]
    else:
        want = [tuple(r) for r in spine_args(vector.setup)[1]]
    got = [tuple(list(a) if isinstance(a, tuple) else a for a in call)
           for call in mirrored(vector)]
    assert got == want


def check_interswitch(frame: bytes) -> None:
    pkt = Ether(frame)
    assert pkt[UDP].sport == pkt[UDP].dport == interswitch.PORT and pkt[UDP].chksum == 0
    assert pkt[IP].flags == "DF" and pkt[IP].len == len(frame) - 14
    pkt[IP].chksum = None
    assert Ether(raw(pkt))[IP].chksum == Ether(frame)[IP].chksum, "IPv4 checksum"
    body = frame[interswitch.OFF:]
    assert struct.pack("<I", zlib.crc32(body[:-4])) == body[-4:], "CRC32"


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
def test_frames_parse_with_scapy(vector: Vector) -> None:
    """Every frame dissects and rebuilds byte for byte; every frame a role is expected to
    send is well formed: a RoCE one with scapy's ICRC, a partial or total with its IPv4
    checksum and CRC32."""
    for step in vector.steps:
        for frame in [step.frame] + [f for _, f in step.expect]:
            pkt = Ether(frame)
            assert raw(pkt) == frame, step.note
            assert ARP in pkt or UDP in pkt or IP in pkt, step.note
        for _, frame in step.expect:
            if frame == step.frame:
                continue                       # forwarded unchanged
            if BTH in Ether(frame):
                assert icrc_ok(frame), step.note
            else:
                check_interswitch(frame)


def test_untagged_vectors_keep_the_p4_limits() -> None:
    """What a P4 program of the roles can be asked to run: one ring of path MTU 256 and at
    most 256 slots; 256 B payloads in every RoCE WRITE, partial and total (unless tagged
    any_payload_length); one carried header per partial or total (unless many_carried)."""
    for v in VECTORS:
        ring, = v.setup["rings"]
        assert ring["spec"]["mtu"] == 256 and ring["slots"] in (2, 4, 8, 16, 32, 64, 128, 256)
        for step in v.steps:
            for frame in [step.frame] + [f for _, f in step.expect]:
                try:
                    msg = interswitch.decode(memoryview(frame))
                except interswitch.Corrupt:
                    continue                   # damaged on purpose (or not a message at all)
                if MANY_CARRIED not in v.requires:
                    assert len(msg.carried) <= 1, (v.name, step.note)
                if ANY_PAYLOAD_LENGTH not in v.requires:
                    assert len(msg.payload) == 256, (v.name, step.note)
            pkt = Ether(step.frame)
            if ANY_PAYLOAD_LENGTH not in v.requires and BTH in pkt and Raw in pkt:
                assert len(pkt[Raw].load) == 256, (v.name, step.note)


def test_bmv2_spine_drops_what_it_cannot_hold(target: Harness) -> None:
    """spine.p4 (switch/p4/README.md, spine deviation 2): a partial with two carried headers
    or a 260 B payload checks out as far as it is parsed and is drop_mismatch; one cut short
    is drop_corrupt; neither disturbs the slot, whose total then goes down as usual."""
    if isinstance(target, RoleHarness):
        pytest.skip("the BMv2 spine's own limits")
    vector = next(v for v in VECTORS if v.name == "spine_partials_and_totals")
    target.setup(vector.setup)
    ring = vector.setup["rings"][0]
    tag, me = interswitch.ring_tag(ring["ring_id"]), Endpoint(**vector.setup["config"]["me"])
    tors = {t["tor_id"]: Endpoint(t["mac"], t["ip"]) for t in vector.setup["config"]["tors"]}

    def partial(tor: int, payload: bytes, carried: list[tuple[int, bytes]]) -> bytes:
        return interswitch.encode(tors[tor], me, interswitch.Kind.PARTIAL, tor, tag, 0,
                                  payload, carried)

    head = bytes(range(54))
    for frame in (partial(0, bytes(256), [(1, head), (3, head)]),
                  partial(0, bytes(260), [(1, head)]),
                  partial(0, bytes(256), [(1, head)])[:-6]):
        assert target.send(1, frame, 0) == []
    assert target.send(1, partial(0, bytes(256), [(1, head)]), 0) == []
    out = target.send(2, partial(1, bytes(256), [(3, head)]), 2)
    assert sorted(p for p, _ in out) == [1, 2]
    for _, frame in out:
        check_interswitch(frame)
    counters = target.counters()
    assert counters["interswitch"]["drop_corrupt"] == 1
    lanes = counters["rings"][ring["ring_id"]]["per_tor"]
    assert (lanes["0"]["drop_mismatch"], lanes["0"]["partials"], lanes["1"]["partials"]) == \
        (2, 1, 1)


def device_state(harness: Any) -> dict[str, Any]:
    """Everything a BMv2 device holds that a vector could see (its build's registers, in
    full, and counters, every table's entries and default, the multicast groups), as
    simple_switch_CLI prints it, and the port counters."""
    switch = harness.switch
    program = json.loads(switch.build.json.read_text())
    names = {"registers": [r["name"] for r in program["register_arrays"]],
             "counters": [c["name"] for c in program["counter_arrays"]],
             "tables": [t["name"] for p in program["pipelines"] for t in p["tables"]]}
    commands = ([f"register_read {n}" for n in names["registers"]]
                + [f"table_dump {n}" for n in names["tables"]] + ["mc_dump"])
    run = subprocess.run(["simple_switch_CLI", "--thrift-port", str(switch.thrift_port)],
                         input="\n".join(commands) + "\n", capture_output=True, text=True,
                         timeout=300, check=True)
    return {"cli": run.stdout,
            "counters": {n: switch.target.session.read_counter(n) for n in names["counters"]}}


def test_a_reset_bmv2_switch_is_a_fresh_one(target: Harness) -> None:
    """What lets the BMv2 harness reuse one simple_switch_grpc across vectors: reset after a
    vector (its slots, registers, counters, rings and groups left behind), the ToR's device
    holds exactly what a freshly started one holds for the next vector's setup (every
    register in full, counter, table entry and multicast group with its handles). On the
    module's harness: p4runtime-shell has one client per process, so one harness at a time."""
    if not hasattr(target, "resets"):
        pytest.skip("the software target starts afresh at every setup: no switch to reset")
    from tests.conformance.bmv2_harness import switch_key
    tor = sorted((v for v in VECTORS if v.setup["role"] == "tor" and v.setup["rings"]),
                 key=lambda v: len(v.steps))
    first, second = next((a, b) for a in tor for b in tor
                         if a is not b and switch_key(a.setup) == switch_key(b.setup))
    target.close()
    starts, resets = target.starts, target.resets
    try:
        check_vector(target, first)
        target.setup(second.setup)
        assert (target.starts - starts, target.resets - resets) == (1, 1)
        reused = device_state(target)
        target.close()
        target.setup(second.setup)
        assert (target.starts - starts, target.resets - resets) == (2, 1)
        fresh = device_state(target)
        assert "slot_sum=" in fresh["cli"] and "mgrp(" in fresh["cli"]
        assert reused == fresh
    finally:
        target.close()


def test_a_bmv2_tor_forgets_the_horizon_next_emit_passed(target: Harness) -> None:
    """tor.p4 keeps rule 7's horizon (k - 2W of the packet that set it) in a register while
    next_emit catches up with it, and clears it once next_emit is past it: a horizon left
    behind would read as one 2^23 k ahead again after 2^23 more packets (the comparisons are
    modular), and then pass over every slot without its total at once (tor_rule7_skip:
    the horizon 2, next_emit 3 after the skip)."""
    if not hasattr(target, "resets"):
        pytest.skip("the software ToR passes over the slots at once: it keeps no horizon")
    vector = next(v for v in VECTORS if v.name == "tor_rule7_skip")
    check_vector(target, vector)
    switch = target.switch                            # type: ignore[attr-defined]
    assert switch.registers("ring_next", 0) & 0xFFFFFF == 4     # past k=3, emitted last
    assert switch.registers("tor_horizon", 0) == 0
