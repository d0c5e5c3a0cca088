"""Conformance vectors: docs/pipeline.md as input frames and the exact frames a switch must emit.

`format` defines vectors and the Harness a switch target implements to run them;
`vectors` crafts them with scapy; `software_harness` runs them on the Python switch.
A BMv2 harness lives in `bmv2_harness` (module function `create_harness() -> Harness`).
"""
