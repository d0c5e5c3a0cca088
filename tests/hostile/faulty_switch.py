"""`python -m tests.hostile.faulty_switch ARGS`: the real switch (`switch.daemon.main`) with
one fault injected for the tests: a ring whose id starts with "faulty" gets an aggregator
pool whose `offer` raises, as a bug in the aggregation code would."""
from __future__ import annotations

import sys

from nr_contract import spec as contract
from switch.daemon import main
from switch.dataplane import pipeline

_register = pipeline.AggregationPipeline.register_ring


def _register_with_fault(self: pipeline.AggregationPipeline, spec, ports, slots=contract.DEFAULT_SLOTS):
    _register(self, spec, ports, slots)
    if spec.ring_id.startswith("faulty"):
        def offer(*args: object, **kw: object) -> str:
            raise RuntimeError("injected fault in AggregatorPool.offer")
        self._rings[spec.ring_id].pool.offer = offer


pipeline.AggregationPipeline.register_ring = _register_with_fault
sys.exit(main())
