"""The v1model program in switch/p4: where it is, its limits and controller contract, its build.

`contract()` reads switch/p4/limits.p4, the one place the program's limits and the ids
the controller must agree on (multicast groups, counter ids) are stated, so the Python
side never restates them. `compile_program` runs p4c's BMv2 backend.

    python -m switch.p4program [--out DIR]    # compile; prints the two output paths
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Optional, Sequence

P4_DIR = Path(__file__).resolve().parent / "p4"
MAIN = P4_DIR / "netreduce.p4"
LIMITS = P4_DIR / "limits.p4"
DEFAULT_BUILD = P4_DIR.parents[1] / "build" / "p4"
P4C = "p4c"

_DEFINE = re.compile(r"^#define\s+NR_(\w+)\s+(0x[0-9A-Fa-f]+|\d+)\b", re.M)


@dataclass(frozen=True)
class Contract:
    """The integer `#define NR_*` constants of limits.p4 (see that file for each meaning)."""

    max_rings: int
    slots: int
    max_ranks: int
    max_elems: int
    max_macs: int
    ports: int
    flood_group: int
    ring_group_base: int
    cont_rid: int
    ctrs: int
    counter_ids: dict[str, int]     # lower-case counter name -> id (NR_CTR_<NAME>)

    @property
    def max_payload(self) -> int:
        """Payload bytes one packet may carry: the RoCE path MTU a ring must use."""
        return self.max_elems * 4

    def ring_counter_index(self, ring: int, name: str) -> int:
        return ring * self.ctrs + self.counter_ids[name]

    def conn_counter_index(self, ring: int, rank: int, name: str) -> int:
        return (ring * self.max_ranks + rank) * self.ctrs + self.counter_ids[name]


def parse_contract(text: str) -> Contract:
    """A Contract from the text of limits.p4; KeyError names a missing constant."""
    values = {name.lower(): int(v, 0) for name, v in _DEFINE.findall(text)}
    ctrs = {name[4:]: v for name, v in values.items() if name.startswith("ctr_")}
    plain = {f: values[f] for f in ("max_rings", "slots", "max_ranks", "max_elems", "max_macs",
                                    "ports", "flood_group", "ring_group_base", "cont_rid",
                                    "ctrs")}
    return Contract(**plain, counter_ids=ctrs)


@cache
def contract() -> Contract:
    return parse_contract(LIMITS.read_text())


@dataclass(frozen=True)
class Build:
    """The two files p4c writes: the BMv2 JSON and the P4Info (text format)."""

    json: Path
    p4info: Path


def build_paths(out_dir: Path) -> Build:
    return Build(out_dir / "netreduce.json", out_dir / "netreduce.p4info.txt")


def compile_command(out_dir: Path) -> list[str]:
    b = build_paths(out_dir)
    return [P4C, "--target", "bmv2", "--arch", "v1model", "--p4runtime-files", str(b.p4info),
            "-o", str(out_dir), str(MAIN)]


def compile_program(out_dir: Path = DEFAULT_BUILD) -> Build:
    """Compile switch/p4 with p4c into out_dir (skipped when the outputs are newer than
    every source); RuntimeError carries p4c's messages."""
    if shutil.which(P4C) is None:
        raise RuntimeError(f"{P4C} is not on PATH: it comes with p4lang/p4c (not packaged "
                           "for Debian or PyPI); see switch/p4/README.md")
    b = build_paths(out_dir)
    newest_source = max(p.stat().st_mtime for p in P4_DIR.glob("*.p4"))
    if all(p.exists() and p.stat().st_mtime > newest_source for p in (b.json, b.p4info)):
        return b
    out_dir.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(compile_command(out_dir), capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"p4c failed ({run.returncode}):\n{run.stdout}{run.stderr}")
    return b


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m switch.p4program",
                                 description="compile switch/p4/netreduce.p4 for BMv2")
    ap.add_argument("--out", type=Path, default=DEFAULT_BUILD, help=f"default {DEFAULT_BUILD}")
    args = ap.parse_args(argv)
    try:
        b = compile_program(args.out)
    except RuntimeError as e:
        print(f"p4program: {e}", file=sys.stderr)
        return 1
    print(f"{b.json}\n{b.p4info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
