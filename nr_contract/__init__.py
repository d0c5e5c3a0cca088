"""What hosts and switches agree on, owned by neither side: `spec` (limits, counters'
names, RingSpec, the pace a target publishes), the controller's typed API (`control.proto`
and its generated modules), its thin client (`client`) and token files (`tokens`).

Invariant: this package imports nothing of `netreduce`, `flowctl`, `ring_setup` or `switch`;
both sides import it (tests/test_layers.py holds the rule).
"""
