"""Every switch target against the conformance vectors (tests/conformance), byte for byte.

Targets: 'software' always; 'native' (libnrdp, built here by `make -C switch/native`: needs
a C compiler and libisal-dev); 'bmv2' needs simple_switch_grpc and p4c on PATH, root and
p4runtime-shell: without them it is skipped saying which is missing, or fails under
CI=true (tests/p4tools.py).
"""
from __future__ import annotations

import pytest
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from tests.conformance.check import check_vector, harness_fixture
from tests.conformance.format import Harness, Vector, from_json, per_port, to_json
from tests.conformance.software_harness import SoftwareHarness
from tests.conformance.vectors import all_vectors, every_opcode_every_length
from tests.p4tools import P4_TOOLS, require_tools

VECTORS = all_vectors()


def bmv2_harness() -> Harness:
    require_tools(*P4_TOOLS)
    from tests.conformance.bmv2_harness import create_harness
    return create_harness()


def native_harness() -> Harness:
    from tests.conformance.native_harness import NativeHarness, build
    build()
    return NativeHarness()


HARNESSES = {"software": SoftwareHarness, "native": native_harness, "bmv2": bmv2_harness}


target = harness_fixture(HARNESSES)


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
def test_vector(target: Harness, vector: Vector) -> None:
    check_vector(target, vector)


BURST = 16     # steps fed back to back: well under BMv2's queues and the sockets' buffers


def test_every_opcode_and_length_in_bursts(target: Harness) -> None:
    """Each WRITE opcode x each payload length: every result byte for byte (so its ICRC,
    which rxe checks, equals scapy's), fed in bursts to keep the BMv2 run short."""
    vector = every_opcode_every_length()
    if vector.requires - target.supports:
        pytest.skip(f"target lacks {', '.join(sorted(vector.requires - target.supports))}")
    target.setup(vector.setup)
    for i in range(0, len(vector.steps), BURST):
        steps = vector.steps[i:i + BURST]
        want = per_port(out for s in steps for out in s.expect)
        got = per_port(target.send_burst([(s.in_port, s.frame) for s in steps],
                                         sum(len(s.expect) for s in steps)))
        assert got == want, f"steps {i}..{i + len(steps) - 1} ({steps[0].note} ...)"
    assert target.counters() == vector.counters


def test_vectors_survive_json() -> None:
    assert from_json(to_json(VECTORS)) == VECTORS


def test_vectors_cover_every_counter() -> None:
    """Each ring counter is exercised (non-zero) by some vector."""
    seen = {name for v in VECTORS for ring in v.counters.values()
            for name, value in ring["counters"].items() if value}
    assert seen == set(next(iter(VECTORS[0].counters.values()))["counters"])


def test_bmv2_vectors_use_256_byte_payloads() -> None:
    """Vectors a fixed 64-element parser must run carry only 256 B payloads (or none)."""
    for v in VECTORS:
        if v.requires:
            continue
        for step in v.steps:
            for frame in [step.frame] + [f for _, f in step.expect]:
                pkt = Ether(frame)
                if IP in pkt and pkt[IP].frag:
                    continue           # a non-first fragment: scapy leaves its UDP undecoded
                load = pkt.lastlayer()
                assert len(frame) < 100 or len(bytes(load)) in (256, 64), (v.name, step.note)
