"""Every switch target against the conformance vectors (tests/conformance), byte for byte.

Targets: 'software' always; 'bmv2' when tests/conformance/bmv2_harness.py exists and
simple_switch_grpc and p4c are on PATH (else skipped, saying which is missing).
"""
from __future__ import annotations

import importlib
import shutil
from typing import Iterator

import pytest
from scapy.layers.l2 import Ether

from conformance.format import Harness, Vector, from_json, per_port, to_json
from conformance.software_harness import SoftwareHarness
from conformance.vectors import all_vectors

VECTORS = all_vectors()
BMV2_TOOLS = ("simple_switch_grpc", "p4c")


def bmv2_harness() -> Harness:
    missing = [t for t in BMV2_TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"bmv2 target: {', '.join(missing)} not on PATH")
    try:
        module = importlib.import_module("conformance.bmv2_harness")
    except ModuleNotFoundError as e:
        if e.name != "conformance.bmv2_harness":
            raise
        pytest.skip("bmv2 target: tests/conformance/bmv2_harness.py not written yet")
    return module.create_harness()


@pytest.fixture(scope="module", params=["software", "bmv2"])
def target(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = SoftwareHarness() if request.param == "software" else bmv2_harness()
    try:
        yield harness
    finally:
        harness.close()


def describe(frames: dict[int, list[bytes]]) -> str:
    return "; ".join(f"port {p}: " + ", ".join(Ether(f).summary() for f in fs)
                     for p, fs in sorted(frames.items())) or "nothing"


@pytest.mark.parametrize("vector", VECTORS, ids=[v.name for v in VECTORS])
def test_vector(target: Harness, vector: Vector) -> None:
    missing = vector.requires - target.supports
    if missing:
        pytest.skip(f"target lacks {', '.join(sorted(missing))}")
    target.setup(vector.setup)
    for i, step in enumerate(vector.steps):
        got, want = per_port(target.send(step.in_port, step.frame)), per_port(step.expect)
        assert got == want, (f"step {i} ({step.note}): sent {describe(got)}, "
                             f"expected {describe(want)}")
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
                load = Ether(frame).lastlayer()
                assert len(frame) < 100 or len(bytes(load)) in (256, 64), (v.name, step.note)
