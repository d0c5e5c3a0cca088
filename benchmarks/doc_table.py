"""The benchmark tables of the manual, rendered from the committed results.

Every table of measured lab figures in README.md and docs/*.md sits between a line
`<!-- table: NAME -->` and a line `<!-- /table -->`, and the lines between are exactly
`render(NAME)`: the figures come from the JSON documents that `netreduce bench --json`
wrote (docs/figures/*.json, the current results), never from a hand-typed copy.
tests/test_docs.py holds every page to it. After a new run has replaced a JSON file:

    python -m benchmarks.doc_table --write      # rewrite every marked table in the pages
    python -m benchmarks.doc_table --check      # exit 1 naming each table that differs
    python -m benchmarks.doc_table NAME         # print one table (names: --help)

Ratios are the bench's own (`ratios` of its document: algbw of the medians); times are
medians of the timed jobs, per call.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from netreduce.tools.bench.runplan import format_size

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures"
PAGES = ("README.md", "docs/*.md")
BLOCK = re.compile(r"^<!-- table: ([\w-]+) -->\n(.*?)^<!-- /table -->$", re.M | re.S)
MiB = 1 << 20
RATES = 64 << 10          # the sweep's rate column starts here: below, the time is all


def load(name: str) -> dict[str, Any]:
    """A document of docs/figures: a bench run's (`meta`, `results`, `ratios`) or, from
    `--tenants`, one per tenant (`tenants`) with `sharing` and `overlap`. Documents of
    older runs lack later keys (`rtt_us`), so only what a table reads is required."""
    doc = json.loads((FIGURES / name).read_text())
    for d in doc.get("tenants", [doc]):
        missing = {"meta", "results", "ratios"} - set(d)
        if missing:
            raise ValueError(f"docs/figures/{name}: not a bench document (no {sorted(missing)})")
    return doc


def _row(doc: dict[str, Any], key: str, algo: str | None, size: int) -> dict[str, Any]:
    rows = doc["results"] if algo else doc["ratios"]
    for r in rows:
        if r["size_bytes"] == size and (algo is None or r["algo"] == algo):
            return r
    raise KeyError(f"docs/figures/{key}: no {algo or 'ratios'} row at {format_size(size)}")


def _ms(doc: dict[str, Any], key: str, algo: str, size: int) -> str:
    return f"{_row(doc, key, algo, size)['median_ns'] / 1e6:,.1f}"


def _gbps(doc: dict[str, Any], key: str, algo: str, size: int) -> str:
    return f"{_row(doc, key, algo, size)['algbw_gbps']:.4f}"


def _x(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _markdown(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _source(doc: dict[str, Any], key: str, ranks: str = "") -> str:
    """The run's setting and provenance: the line under each table."""
    m = doc["meta"]
    commit = (m["git_commit"] or "unknown")[:7]
    return (f"{ranks or m['workers']} ranks, {m['dtype']}, path MTU {m['mtu']}, median of "
            f"{m['jobs']} jobs, commit {commit} (`docs/figures/{key}`).")


LAB = "bench-n4.json"


def lab(sizes: tuple[int, ...] | None = None) -> list[str]:
    """The single-switch lab: time per call of the link, the switch and the ring, and the
    ratios; every size of the run unless `sizes`."""
    doc = load(LAB)
    rows = []
    for size in sizes or doc["meta"]["sizes"]:
        r = _row(doc, LAB, None, size)
        rows.append([format_size(size)] + [_ms(doc, LAB, a, size) for a in ("link", "switch", "ring")]
                    + [_x(r["switch_over_ring"]), _x(r["switch_over_link"])])
    head = ["size", "link (ms)", "switch (ms)", "ring (ms)", "switch/ring", "switch/link"]
    return _markdown(head, rows) + ["", _source(doc, LAB)]


def sweep() -> list[str]:
    """The latency sweep: every size, the RC round trip and each algorithm in round trips."""
    doc = load(LAB)
    rows = []
    for size in doc["meta"]["sizes"]:
        r = _row(doc, LAB, None, size)
        rows.append([format_size(size)]
                    + [f"{_row(doc, LAB, a, size)['median_ns'] / 1e3:,.0f}"
                       for a in ("link", "switch", "ring", "rtt")]
                    + [_x(r["switch_over_ring"]), _x(r["switch_over_link"]),
                       _x(r["switch_rtts"], ".1f"), _x(r["ring_rtts"], ".1f"),
                       _gbps(doc, LAB, "switch", size) if size >= RATES else "–"])
    head = ["size", "link µs", "switch µs", "ring µs", "RC round trip µs", "switch/ring",
            "switch/link", "switch, round trips", "ring, round trips", "switch Gbit/s"]
    return _markdown(head, rows) + ["", _source(doc, LAB)]


def scaling() -> list[str]:
    """2, 4 and 8 ranks in one 8-host lab: algbw and ratios per size."""
    rows, docs = [], {n: load(f"scaling-n{n}.json") for n in (2, 4, 8)}
    for n, doc in docs.items():
        key = f"scaling-n{n}.json"
        for size in doc["meta"]["sizes"]:
            r = _row(doc, key, None, size)
            rows.append([str(n), format_size(size)]
                        + [_gbps(doc, key, a, size) for a in ("link", "switch", "ring")]
                        + [_x(r["switch_over_ring"]), _x(r["switch_over_link"])])
    head = ["ranks", "size", "link Gbit/s", "switch Gbit/s", "ring Gbit/s", "switch/ring",
            "switch/link"]
    return _markdown(head, rows) + ["", _source(docs[8], "scaling-n{2,4,8}.json", "2, 4 and 8")]


def targets() -> list[str]:
    """One lab boot at path MTU 256: the software fabric, the BMv2 fabric, one BMv2 switch;
    time per call and, on a fabric, the bytes over its ToR-spine links per call."""
    kinds = (("software fabric", "bench-mtu256-fabric-soft.json"),
             ("BMv2 fabric", "bench-mtu256-fabric-bmv2.json"),
             ("one BMv2 switch", "bench-mtu256-bmv2.json"))
    docs = {key: load(key) for _, key in kinds}
    rows = []
    for size in docs[kinds[0][1]]["meta"]["sizes"]:
        for name, key in kinds:
            doc, r = docs[key], _row(docs[key], key, None, size)
            spine = [_row(doc, key, a, size)["spine_bytes_per_call"] for a in ("switch", "ring")]
            rows.append([name, format_size(size)]
                        + [_ms(doc, key, a, size) for a in ("link", "switch", "ring")]
                        + [_x(r["switch_over_ring"]), _x(r["switch_over_link"])]
                        + [_x(b, ",.0f") for b in spine]
                        + [_x(spine[1] / spine[0] if spine[0] else None)])
    head = ["switch", "size", "link (ms)", "switch (ms)", "ring (ms)", "switch/ring",
            "switch/link", "spine bytes: switch", "spine bytes: ring", "ring/switch"]
    return _markdown(head, rows) + ["", _source(docs[kinds[0][1]], "bench-mtu256-*.json")]


def _shares(row: dict[str, Any]) -> str:
    return " / ".join(f"{s:.0%}" for s in row["shares"])


def tenants() -> list[str]:
    """Two jobs of 2 ranks at once against one job of 2 ranks alone, in one boot."""
    alone, both = load("bench-tenants-alone-2.json"), load("bench-tenants-2x2.json")
    rows = []
    for s in both["sharing"]:
        if s["algo"] == "link":
            continue
        solo = _row(alone, "bench-tenants-alone-2.json", s["algo"], s["size_bytes"])["algbw_gbps"]
        rows.append([s["algo"], format_size(s["size_bytes"]), f"{solo:.4f}"]
                    + [f"{g:.4f}" for g in s["algbw_gbps"]]
                    + [f"{s['aggregate_gbps']:.4f}", f"{s['aggregate_gbps'] / solo:.2f}",
                       _shares(s), f"{s['jain']:.3f}"])
    head = ["algo", "size", "alone (Gbit/s)", "tenant 0", "tenant 1", "aggregate",
            "aggregate/alone", "shares", "Jain"]
    return _markdown(head, rows) + ["", _source(alone, "bench-tenants-{alone-2,2x2}.json", "2 + 2")
                                    + f" The two jobs overlapped for {both['overlap']:.0%}."]


def tenants_fabric() -> list[str]:
    """Three jobs of 2 ranks at once on 2 racks of 3: tenant 1 spans both racks."""
    key = "bench-tenants-fabric-3x2.json"
    doc = load(key)
    rows = [[s["algo"], format_size(s["size_bytes"])] + [f"{g:.4f}" for g in s["algbw_gbps"]]
            + [f"{s['aggregate_gbps']:.4f}", _shares(s), f"{s['jain']:.3f}"]
            for s in doc["sharing"] if s["algo"] != "link"]
    head = ["algo", "size", "tenant 0 (rack 0)", "tenant 1 (both racks)", "tenant 2 (rack 1)",
            "aggregate", "shares", "Jain"]
    return _markdown(head, rows) + ["", _source(doc["tenants"][0], key, "2 + 2 + 2")
                                    + f" The jobs overlapped for {doc['overlap']:.0%}."]


TABLES: dict[str, Callable[[], list[str]]] = {
    "readme": lambda: lab((4, 64, 256 << 10, MiB, 16 * MiB)),
    "sweep": sweep, "scaling": scaling, "targets": targets,
    "tenants": tenants, "tenants-fabric": tenants_fabric}


def render(name: str) -> str:
    """The lines a page holds between the markers of table `name`, newline-terminated."""
    if name not in TABLES:
        raise KeyError(f"doc_table: no table {name!r} (known: {', '.join(TABLES)})")
    return "\n".join(TABLES[name]()) + "\n"


def pages() -> list[Path]:
    return sorted(p for pattern in PAGES for p in ROOT.glob(pattern))


def refresh(text: str) -> str:
    """`text` with every marked table rendered afresh."""
    return BLOCK.sub(lambda m: f"<!-- table: {m[1]} -->\n{render(m[1])}<!-- /table -->", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="tables: " + ", ".join(TABLES))
    p.add_argument("name", nargs="?", help="print this table")
    p.add_argument("--check", action="store_true", help="exit 1 if a page's table is stale")
    p.add_argument("--write", action="store_true", help="rewrite the pages' tables")
    args = p.parse_args(argv)
    if args.name:
        sys.stdout.write(render(args.name))
        return 0
    stale = []
    for page in pages():
        text = page.read_text()
        new = refresh(text)
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if args.write:
                page.write_text(new)
    for name in stale:
        print(f"{'rewrote' if args.write else 'stale'}: {name}")
    return 1 if stale and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
