"""The lab's BMv2 switch and two-tier fabric, started by scripts/lab.sh (`python -m
labswitches.bmv2_lab --help`, `python -m labswitches.fabric_lab --help`). Not installed: run
from the repository's root."""
