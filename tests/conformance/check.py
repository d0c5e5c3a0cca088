"""Running one vector on a Harness, as every target's and role's conformance test does: the
frames each step makes the switch send must equal the vector's, per port in order and byte
for byte; then the ring/connection counters must equal the vector's. A vector needing a
capability the target lacks is skipped, naming it."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
from scapy.layers.l2 import Ether

from tests.conformance.format import Harness, Vector, per_port


def describe(frames: dict[int, list[bytes]]) -> str:
    """Frames per port as scapy summarises them, for an assertion's message."""
    return "; ".join(f"port {p}: " + ", ".join(Ether(f).summary() for f in fs)
                     for p, fs in sorted(frames.items())) or "nothing"


def check_vector(target: Harness, vector: Vector) -> None:
    """Set `target` up as `vector` says, feed its steps one by one and compare."""
    missing = vector.requires - target.supports
    if missing:
        pytest.skip(f"target lacks {', '.join(sorted(missing))}")
    target.setup(vector.setup)
    for i, step in enumerate(vector.steps):
        got = per_port(target.send(step.in_port, step.frame, len(step.expect)))
        want = per_port(step.expect)
        assert got == want, (f"step {i} ({step.note}): sent {describe(got)}, "
                             f"expected {describe(want)}")
    assert target.counters() == vector.counters


def harness_fixture(factories: dict[str, Callable[[], Harness]]) -> Any:
    """A module-scoped `target` fixture: one harness per factory's name, closed after the
    module's tests ran on it (every conformance test module's parametrization)."""
    @pytest.fixture(scope="module", params=list(factories))
    def target(request: pytest.FixtureRequest) -> Iterator[Harness]:
        harness = factories[request.param]()
        try:
            yield harness
        finally:
            harness.close()
    return target
