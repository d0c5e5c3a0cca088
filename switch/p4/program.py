"""The v1model program in switch/p4: where it is, its limits and controller contract, its build.

Three programs share the sources: `netreduce.p4`, the single switch (built into build/p4),
`spine.p4`, the spine role of a two-tier fabric (build/p4-spine: the same files compiled
with NR_ROLE_SPINE plus the spine_*.p4, iscrc.p4 and interswitch.p4 controls), and
`tor.p4`, its ToR role (build/p4-tor: compiled with NR_ROLE_TOR plus the tor_*.p4 controls).
p4c takes minutes on a fresh clone (tor.p4 ~4 min on this 2-core machine): scripts/lab.sh
compiles what a BMv2 switch needs before it starts the switch's readiness clock, with
`--progress`, and every later start finds the build fresh.
`contract()` reads switch/p4/limits.p4, the one place the programs' limits and the ids
the controller must agree on (multicast groups, counter ids) are stated, so the Python
side never restates them. `generated_sources` writes the per-payload-length actions P4
cannot loop over: switch/p4/icrc_words.p4 (the ICRC's hashed buffer, see icrc.p4),
switch/p4/iscrc_words.p4 (the inter-switch CRC32's, see iscrc.p4) and switch/p4/pl_valid.p4
(an emission's valid payload words, see emit.p4). `compile_program` runs p4c's BMv2
backend.

    python -m switch.p4.program [--spine | --tor] [--out DIR] [--progress]  # compile; the paths
    python -m switch.p4.program --generate              # rewrite the generated switch/p4 files
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Callable, Optional, Sequence

P4_DIR = Path(__file__).resolve().parent
MAIN = P4_DIR / "netreduce.p4"
SPINE_MAIN = P4_DIR / "spine.p4"
TOR_MAIN = P4_DIR / "tor.p4"
LIMITS = P4_DIR / "limits.p4"
ICRC_WORDS = P4_DIR / "generated/icrc_words.p4"
ISCRC_WORDS = P4_DIR / "generated/iscrc_words.p4"
PL_VALID = P4_DIR / "generated/pl_valid.p4"
DEFAULT_BUILD = P4_DIR.parents[1] / "build" / "p4"
DEFAULT_SPINE_BUILD = P4_DIR.parents[1] / "build" / "p4-spine"
DEFAULT_TOR_BUILD = P4_DIR.parents[1] / "build" / "p4-tor"
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
    max_lanes: int                  # the spine's: ToRs per ring
    max_transit: int
    lctrs: int
    sctrs: int
    lane_counter_ids: dict[str, int]    # spine, per (ring, lane): NR_LCTR_<NAME>
    spine_counter_ids: dict[str, int]   # spine, per ring: NR_SCTR_<NAME>
    is_counter_ids: dict[str, int]      # spine, inter-switch drops: NR_ISCTR_<NAME>
    tctrs: int
    xctrs: int
    tor_counter_ids: dict[str, int]     # ToR, per ring: NR_TCTR_<NAME>
    transit_counter_ids: dict[str, int]  # ToR, per ring's entering connection: NR_XCTR_<NAME>
    part_a_rid: int                     # ToR: replica ids of a ring's group (limits.p4)
    part_b_rid: int
    fwd_rid: int

    @property
    def max_payload(self) -> int:
        """Payload bytes one packet may carry: the RoCE path MTU a ring must use."""
        return self.max_elems * 4

    def ring_counter_index(self, ring: int, name: str) -> int:
        return ring * self.ctrs + self.counter_ids[name]

    def conn_counter_index(self, ring: int, rank: int, name: str) -> int:
        return (ring * self.max_ranks + rank) * self.ctrs + self.counter_ids[name]

    def lane_counter_index(self, ring: int, lane: int, name: str) -> int:
        return (ring * self.max_lanes + lane) * self.lctrs + self.lane_counter_ids[name]

    def spine_counter_index(self, ring: int, name: str) -> int:
        return ring * self.sctrs + self.spine_counter_ids[name]

    def tor_counter_index(self, ring: int, name: str) -> int:
        return ring * self.tctrs + self.tor_counter_ids[name]

    def transit_counter_index(self, ring: int, name: str) -> int:
        return ring * self.xctrs + self.transit_counter_ids[name]


def parse_contract(text: str) -> Contract:
    """A Contract from the text of limits.p4; KeyError names a missing constant."""
    values = {name.lower(): int(v, 0) for name, v in _DEFINE.findall(text)}

    def ids(prefix: str) -> dict[str, int]:
        return {name[len(prefix):]: v for name, v in values.items() if name.startswith(prefix)}

    plain = {f: values[f] for f in ("max_rings", "slots", "max_ranks", "max_elems", "max_macs",
                                    "ports", "flood_group", "ring_group_base", "cont_rid",
                                    "ctrs", "max_lanes", "max_transit", "lctrs",
                                    "sctrs", "tctrs", "xctrs", "part_a_rid", "part_b_rid",
                                    "fwd_rid")}
    return Contract(**plain, counter_ids=ids("ctr_"), lane_counter_ids=ids("lctr_"),
                    spine_counter_ids=ids("sctr_"), is_counter_ids=ids("isctr_"),
                    tor_counter_ids=ids("tctr_"), transit_counter_ids=ids("xctr_"))


@cache
def contract() -> Contract:
    return parse_contract(LIMITS.read_text())


ICRC_PRE_WORDS = 16     # header-part words of icrc.p4 (w0 .. w15)
ISCRC_PRE_WORDS = 4     # header words of an inter-switch message in iscrc.p4 (w0 .. w3)


def icrc_buffer_words(c: Contract, n: int, pre: int = ICRC_PRE_WORDS) -> list[str]:
    """What action `words_<n>` of icrc_words.p4 (iscrc_words.p4: pre = ISCRC_PRE_WORDS) puts
    in the hashed buffer buf.b0 .. buf.b<pre + max_elems - 1>, in order: zeros, then the
    header part w0 .. w<pre - 1>, then payload words 0 .. n-1 (the header part and the
    payload right-aligned)."""
    return (["0"] * (c.max_elems - n) + [f"w{i}" for i in range(pre)]
            + [f"hdr.pl[{i}].v" for i in range(n)])


def _by_length_table(name: str, key: str, action: str, n_max: int) -> list[str]:
    """A const table `name` on `key` running action `<action>_<n>` for n = 0 .. n_max."""
    lines = [f"    table {name} {{",
             f"        key = {{ {key}: exact; }}",
             "        actions = {"]
    lines += [f"            {action}_{n};" for n in range(n_max + 1)]
    lines += ["        }",
              f"        /* never taken (no packet has more than {n_max} words); it sets every",
              "         * word all the same, so that none is ever used unset */",
              f"        default_action = {action}_0();",
              "        const entries = {"]
    lines += [f"            {n}: {action}_{n}();" for n in range(n_max + 1)]
    lines += ["        }", "    }"]
    return lines


def _action(name: str, statements: list[str]) -> list[str]:
    return ([f"    action {name}() {{"]
            + ["        " + " ".join(statements[i:i + 8]) for i in range(0, len(statements), 8)]
            + ["    }"])


_GENERATED = ("/* GENERATED by `python -m switch.p4.program --generate` (switch/p4/program.py,\n"
              " * {function}): do not edit. Included inside control {control} ({includer}):\n")


def _words_source(c: Contract, pre: int, function: str, control: str, includer: str) -> str:
    n_max = c.max_elems
    lines = [_GENERATED.format(function=function, control=control, includer=includer)
             + " * action words_<n> right-aligns the header part and n payload words in the\n"
             f" * hashed buffer buf.b0 .. b{pre + n_max - 1}, zeros before them,"
             f" n = 0 .. {n_max}. */"]
    for n in range(n_max + 1):
        lines += _action(f"words_{n}",
                         [f"buf.b{j} = {v};" for j, v in enumerate(icrc_buffer_words(c, n, pre))])
    lines += _by_length_table("by_words", "words", "words", n_max)
    return "\n".join(lines) + "\n"


def icrc_words_source(c: Contract) -> str:
    """The text of icrc_words.p4: inside control NrIcrc (icrc.p4), action `words_<n>`
    fills the hashed buffer for a payload of n words (icrc_buffer_words), for
    n = 0 .. c.max_elems; the const table `by_words` runs the one for the packet's
    `words`. icrc.p4 hashes the buffer (a struct: p4c copies no field of it) once, after
    the table: one hash() in the program."""
    return _words_source(c, ICRC_PRE_WORDS, "icrc_words_source", "NrIcrc", "icrc.p4")


def iscrc_words_source(c: Contract) -> str:
    """The text of iscrc_words.p4: as icrc_words.p4, for the CRC32 of an inter-switch
    message (control NrIsCrc, iscrc.p4): its 4 header words and n payload words."""
    return _words_source(c, ISCRC_PRE_WORDS, "iscrc_words_source", "NrIsCrc", "iscrc.p4")


def pl_valid_source(c: Contract) -> str:
    """The text of pl_valid.p4: inside control NrEmit (emit.p4; the ToR's NrTorIngress and
    NrTorEgress include it too), action `valid_<n>` makes
    payload words 0 .. n-1 valid and the others invalid, for n = 0 .. c.max_elems; the
    const table `pl_valid` runs the one for the emitted slot's `meta.emit_words`."""
    n_max = c.max_elems
    lines = [_GENERATED.format(function="pl_valid_source", control="NrEmit",
                               includer="emit.p4; the ToR's tor_ingress.p4, tor_egress.p4")
             + f" * action valid_<n> makes payload words 0 .. n-1 valid, the others invalid,"
             f" n = 0 .. {n_max}. */"]
    for n in range(n_max + 1):
        lines += _action(f"valid_{n}",
                         [f"hdr.pl[{i}].{'setValid' if i < n else 'setInvalid'}();"
                          for i in range(n_max)])
    lines += _by_length_table("pl_valid", "meta.emit_words", "valid", n_max)
    return "\n".join(lines) + "\n"


def generated_sources(c: Contract) -> dict[Path, str]:
    """Each generated file of switch/p4 -> its text."""
    return {ICRC_WORDS: icrc_words_source(c), ISCRC_WORDS: iscrc_words_source(c),
            PL_VALID: pl_valid_source(c)}


#: p4c warnings accepted after review, as (kind, start of the message) — kind is the name
#: in `[--Wwarn=<kind>]`. Every other warning fails tests/test_p4_program.py. None remain:
#: the `invalid_header` warnings (RETH/ImmDt fields read while possibly invalid) are gone
#: with icrc.p4, and the P4Info is written in the `.txtpb` format p4c asks for.
ACCEPTED_WARNINGS: tuple[tuple[str, str], ...] = ()

_WARNING = re.compile(r"\[--Wwarn=(\w+)\] warning: (.*)")


def warnings(p4c_output: str) -> list[tuple[str, str]]:
    """(kind, message) of every warning in p4c's output."""
    return _WARNING.findall(p4c_output)


def unaccepted_warnings(p4c_output: str) -> list[tuple[str, str]]:
    """The warnings of p4c's output that ACCEPTED_WARNINGS does not list."""
    return [(kind, msg) for kind, msg in warnings(p4c_output)
            if not any(kind == k and msg.startswith(m) for k, m in ACCEPTED_WARNINGS)]


@dataclass(frozen=True)
class Build:
    """What p4c writes: the BMv2 JSON, the P4Info (protobuf text format), its messages."""

    json: Path
    p4info: Path
    log: Path


def build_paths(out_dir: Path, main: Path = MAIN) -> Build:
    """What p4c writes for the program `main` (netreduce.p4, spine.p4 or tor.p4) into
    out_dir."""
    return Build(out_dir / f"{main.stem}.json", out_dir / f"{main.stem}.p4info.txtpb",
                 out_dir / "p4c.log")


def compile_command(out_dir: Path, main: Path = MAIN) -> list[str]:
    b = build_paths(out_dir, main)
    return [P4C, "--target", "bmv2", "--arch", "v1model", "--p4runtime-files", str(b.p4info),
            "-o", str(out_dir), str(main)]


def inputs_digest(out_dir: Path, main: Path = MAIN) -> str:
    """What a build is made from: the SHA-256 of p4c's command line and of every switch/p4
    source (name and bytes), written beside the build (INPUTS_FILE)."""
    h = hashlib.sha256("\0".join(compile_command(out_dir, main)).encode())
    for src in sorted(P4_DIR.rglob("*.p4")):
        h.update(f"\0{src.relative_to(P4_DIR)}\0".encode())
        h.update(src.read_bytes())
    return h.hexdigest()


#: in a build directory: inputs_digest() of the build there
INPUTS_FILE = "inputs.sha256"
#: with a `progress` callback: seconds between the lines saying p4c (or a wait) goes on
PROGRESS_EVERY = 30.0


def _quiet(message: str) -> None:
    """compile_program's default `progress`: says nothing."""


def _lock(lock: IO[str], what: str, progress: Callable[[str], None]) -> None:
    """Take `lock` (exclusive), saying so every PROGRESS_EVERY s while another holds it."""
    t0, said = time.monotonic(), None
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        if said is None:
            progress(f"{what}: another process compiles it: waiting for it")
            said = now
        elif now - said >= PROGRESS_EVERY:
            progress(f"{what}: still waiting for the other compile ({now - t0:.0f} s)")
            said = now
        time.sleep(0.2)


def _run_p4c(command: list[str], log: Path, what: str,
             progress: Callable[[str], None]) -> int:
    """p4c's exit code, its messages in `log`, saying every PROGRESS_EVERY s that it runs."""
    progress(f"{what}: compiling with p4c (a first build takes minutes; later runs reuse it)")
    t0 = last = time.monotonic()
    with open(log, "w") as out:
        p4c = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while p4c.poll() is None:
            time.sleep(0.2)
            if time.monotonic() - last >= PROGRESS_EVERY:
                last = time.monotonic()
                progress(f"{what}: p4c still compiling ({last - t0:.0f} s)")
    progress(f"{what}: p4c {'done' if p4c.returncode == 0 else 'FAILED'} in "
             f"{time.monotonic() - t0:.0f} s")
    return p4c.returncode


def compile_program(out_dir: Path = DEFAULT_BUILD, main: Path = MAIN,
                    progress: Callable[[str], None] = _quiet) -> Build:
    """Compile the program `main` (switch/p4/netreduce.p4, or spine.p4 / tor.p4 into its own
    out_dir, e.g. DEFAULT_SPINE_BUILD / DEFAULT_TOR_BUILD) with p4c into out_dir, skipped when
    out_dir holds a build of the same inputs (`inputs_digest`: the sources' bytes, not their
    times, so a copied or restored build is never taken for a fresh one); p4c's messages go to
    `log`; RuntimeError carries them on a failure.
    One compile at a time per out_dir (a lock file in it): a caller that comes while another
    process compiles waits for it and then finds the build fresh, so a test run may start
    p4c in the background and let the tests that need the build wait for it.
    `progress` is told what happens, one line each: the build is fresh; p4c starts, goes on
    (every PROGRESS_EVERY s) and ends; or another process's compile is waited for."""
    if shutil.which(P4C) is None:
        raise RuntimeError(f"{P4C} is not on PATH: it comes with p4lang/p4c (not packaged "
                           "for Debian or PyPI); see switch/p4/README.md")
    b = build_paths(out_dir, main)
    what = f"{main.name} -> {out_dir}"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".compile.lock", "w") as lock:
        _lock(lock, what, progress)
        digest, stamp = inputs_digest(out_dir, main), out_dir / INPUTS_FILE
        if all(p.exists() for p in (b.json, b.p4info, b.log)) and stamp.exists() \
                and stamp.read_text().strip() == digest:
            progress(f"{what}: up to date (its sources did not change)")
            return b
        stamp.unlink(missing_ok=True)
        code = _run_p4c(compile_command(out_dir, main), b.log, what, progress)
        if code == 0:
            stamp.write_text(digest + "\n")
    if code != 0:
        raise RuntimeError(f"p4c failed ({code}):\n{b.log.read_text()}")
    return b


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m switch.p4.program",
                                 description="compile switch/p4/netreduce.p4 (or spine.p4, "
                                             "tor.p4) for BMv2")
    role = ap.add_mutually_exclusive_group()
    role.add_argument("--spine", action="store_true",
                      help=f"the spine program, {SPINE_MAIN.name} (default build "
                           f"{DEFAULT_SPINE_BUILD})")
    role.add_argument("--tor", action="store_true",
                      help=f"the ToR program, {TOR_MAIN.name} (default build "
                           f"{DEFAULT_TOR_BUILD})")
    ap.add_argument("--out", type=Path, help=f"default {DEFAULT_BUILD}")
    ap.add_argument("--generate", action="store_true",
                    help=f"rewrite {ICRC_WORDS.name}, {ISCRC_WORDS.name} and {PL_VALID.name} "
                         "from limits.p4 instead of compiling")
    ap.add_argument("--progress", action="store_true",
                    help="say on stderr what happens: fresh, compiling (every "
                         f"{PROGRESS_EVERY:g} s while p4c runs), done")
    args = ap.parse_args(argv)
    if args.generate:
        for path, text in generated_sources(contract()).items():
            path.write_text(text)
            print(path)
        return 0
    def say(message: str) -> None:
        print(f"p4program: {message}", file=sys.stderr, flush=True)
    progress = say if args.progress else _quiet
    try:
        if args.spine:
            b = compile_program(args.out or DEFAULT_SPINE_BUILD, SPINE_MAIN, progress)
        elif args.tor:
            b = compile_program(args.out or DEFAULT_TOR_BUILD, TOR_MAIN, progress)
        else:
            b = compile_program(args.out or DEFAULT_BUILD, progress=progress)
    except RuntimeError as e:
        print(f"p4program: {e}", file=sys.stderr)
        return 1
    print(f"{b.json}\n{b.p4info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
