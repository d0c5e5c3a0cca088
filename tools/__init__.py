"""Developer harnesses and benchmarks, outside the installed packages: run from the
repository's root (`python -m tools.NAME --help`). `bmv2_lab` and `fabric_lab` start the lab's
BMv2 switch and two-tier fabric (scripts/lab.sh calls them); `bench_*` measure the switch.
"""
