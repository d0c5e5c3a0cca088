"""Developer benchmarks and profiles of the switch targets and of lab calls (`python -m
benchmarks.NAME --help`). Not installed: run from the repository's root."""
