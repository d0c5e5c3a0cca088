"""The RC model's property scenarios (tests/rcmodel/scenarios.py: real Communicators and
Streams, model rxe, loss, duplication, reordering and delay in every direction, PSN wrap,
retries, re-cuts) run with the native pipeline beside the Python one as a differential
check: every frame the model's switch sees goes through both, and their outputs (frames,
ports, order) and counters must be equal after every frame. The Python pipeline's
outputs go on the wire, so the model's runs are the property test's own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings

import tests.rcmodel.fabric
import tests.rcmodel.world
from nr_contract.spec import DEFAULT_SLOTS, RingSpec
from switch.dataplane.pipeline import AggregationPipeline
from switch.native.binding import NativePipeline
from tests.conformance.native_harness import build
from tests.rcmodel.scenarios import check_run, scenarios

if TYPE_CHECKING:
    from switch.dataplane.ports import Emit


class DifferentialPipeline(AggregationPipeline):
    """The Python pipeline (the oracle: its outputs are emitted) and a NativePipeline fed
    the same frames and registrations; AssertionError at the first frame they differ on."""

    frames = 0                   # over every instance: frames both pipelines handled

    def __init__(self) -> None:
        super().__init__()
        self.native = NativePipeline()

    def register_ring(self, spec: RingSpec, ports: dict[str, int],
                      slots: int = DEFAULT_SLOTS) -> None:
        super().register_ring(spec, ports, slots)
        self.native.register_ring(spec, ports, slots)

    def unregister_ring(self, ring_id: str) -> None:
        super().unregister_ring(ring_id)
        self.native.unregister_ring(ring_id)

    def process(self, frame: memoryview, in_port: int, emit: Emit) -> bool:
        native = self.native.process(bytes(frame), in_port)
        out: list[tuple[int, bytes]] = []
        mine = super().process(frame, in_port, lambda p, parts: out.append((p, b"".join(parts))))
        assert (native is not None, native or []) == (mine, out), f"frame {bytes(frame)!r}"
        assert self.native.counters() == self.counters()
        DifferentialPipeline.frames += 1
        for port, f in out:
            emit(port, (f,))
        return mine


@pytest.fixture()
def differential(monkeypatch: pytest.MonkeyPatch) -> None:
    build()
    monkeypatch.setattr(tests.rcmodel.world, "AggregationPipeline", DifferentialPipeline)
    monkeypatch.setattr(tests.rcmodel.fabric, "AggregationPipeline", DifferentialPipeline)


def test_rc_properties_with_the_native_pipeline_beside(differential: None) -> None:
    """25 of the property test's scenarios (its own generator, derandomized): every frame
    agrees, in every scenario (thousands of frames in all)."""
    seen: list[int] = []

    def scenario(s: dict) -> None:
        DifferentialPipeline.frames = 0
        check_run(s)
        seen.append(DifferentialPipeline.frames)

    settings(max_examples=25, deadline=None, derandomize=True,
             suppress_health_check=[HealthCheck.too_slow])(given(scenarios())(scenario))()
    assert len(seen) >= 20 and min(seen) > 0 and sum(seen) > 2_000, seen
