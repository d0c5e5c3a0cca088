"""Static checks of the v1model program (switch/p4) that need no p4c.

p4c and BMv2 are not installable on these machines, so what can be checked from the
source is checked here: the limits agree with the Python side and the README, the element
macro covers every element, the ICRC field list evaluated with BMv2's rules (fields packed
back to back, fields of invalid headers skipped) gives scapy's ICRC, the registers that
carry a contribution's header to egress put every bit back where it came from, and the
deparser emits what the parser extracts, in order.
"""
from __future__ import annotations

import re
import zlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from roce_layers import (IMM_OPS, RETH_OPS, WRITE_FIRST, WRITE_LAST_IMM, WRITE_MIDDLE,
                         WRITE_ONLY, WRITE_ONLY_IMM, make_ring, write_frame)
from switch.p4program import P4_DIR, contract, parse_contract
from switch.pipeline import (CONN_COUNTERS, DEFAULT_SLOTS, MAX_RANKS, MAX_SLOTS, PATH_MTUS,
                             RING_COUNTERS)

C = contract()
Layout = dict[str, list[tuple[str, int]]]          # header type -> [(field, width)]


def source(name: str) -> str:
    return (P4_DIR / name).read_text()


def must(pattern: str, text: str, flags: int = 0) -> re.Match[str]:
    m = re.search(pattern, text, flags)
    assert m, f"not in the P4 source: {pattern}"
    return m


@cache
def header_types() -> Layout:
    return {name: [(f, int(w)) for w, f in re.findall(r"bit<(\d+)>\s+(\w+);", body)]
            for name, body in re.findall(r"header\s+(\w+)\s*\{(.*?)\}", source("headers.p4"),
                                         re.S)}


@cache
def instances() -> dict[str, str]:
    """headers_t member -> header type, in declaration order."""
    body = must(r"struct headers_t\s*\{(.*?)\}", source("headers.p4"), re.S).group(1)
    return {name: typ for typ, name in re.findall(r"(\w+)(?:\[\w+\])?\s+(\w+);", body)}


def field_width(header: str, field: str) -> int:
    return dict(header_types()[instances()[header]])[field]


def decode(frame: bytes) -> dict[str, dict[str, int]]:
    """The valid headers of a RoCE WRITE frame, as the program's parser would extract them
    (hdr.pl[i] are the payload words), by the layouts of headers.p4."""
    opcode = frame[42]
    order = ["eth", "ipv4", "udp", "bth"] + ["reth"] * (opcode in RETH_OPS) \
        + ["immdt"] * (opcode in IMM_OPS)
    bits = "".join(f"{b:08b}" for b in frame)
    pos = 0
    out: dict[str, dict[str, int]] = {}
    for h in order:
        out[h] = {}
        for f, w in header_types()[instances()[h]]:
            out[h][f] = int(bits[pos:pos + w], 2)
            pos += w
    for i in range((len(frame) - pos // 8 - 4) // 4):
        out[f"pl[{i}]"] = {"v": int(bits[pos:pos + 32], 2)}
        pos += 32
    out["icrc"] = {"v": int.from_bytes(frame[-4:], "big")}
    return out


def concat(parts: list[tuple[int, int]]) -> int:
    value = 0
    for width, v in parts:
        value = value << width | v
    return value


def test_limits_agree_with_the_software_target() -> None:
    assert set(C.counter_ids) == set(RING_COUNTERS) | set(CONN_COUNTERS)
    assert len(set(C.counter_ids.values())) == len(C.counter_ids)
    assert max(C.counter_ids.values()) < C.ctrs
    assert C.max_ranks == MAX_RANKS                           # the bitmap is a bit<32>
    assert C.slots & (C.slots - 1) == 0 and DEFAULT_SLOTS <= C.slots <= MAX_SLOTS
    assert C.max_payload in PATH_MTUS                         # a RoCE path MTU
    assert C.max_payload & (C.max_payload - 1) == 0           # the parser's length mask
    assert C.ring_group_base > C.flood_group and C.cont_rid >= C.max_ranks


def test_parse_contract_names_a_missing_constant() -> None:
    with pytest.raises(KeyError, match="max_rings"):
        parse_contract("#define NR_SLOTS 4\n")


def test_readme_states_the_limits() -> None:
    readme = (P4_DIR / "README.md").read_text()
    rows = dict(re.findall(r"^\|\s*`NR_(\w+)`\s*\|\s*(\d+)\s*\|", readme, re.M))
    assert {k.lower(): int(v) for k, v in rows.items()} == {
        "max_rings": C.max_rings, "slots": C.slots, "max_ranks": C.max_ranks,
        "max_elems": C.max_elems, "max_macs": C.max_macs}


def test_the_element_macro_lists_every_element_once() -> None:
    body = must(r"#define NR_FOR_EACH_ELEM\(M\)(.*?)\n\n", source("payload.p4"), re.S).group(1)
    assert [int(i) for i in re.findall(r"M\((\d+)\)", body)] == list(range(C.max_elems))
    assert "word_t[NR_MAX_ELEMS] pl;" in source("headers.p4")


def icrc_fields() -> list[str]:
    m = must(r"hash\(crc, HashAlgorithm\.crc32, 32w0, \{(.*?)\}, 64w0x100000000\);",
             source("egress.p4"), re.S)
    body = m.group(1).replace("NR_FOR_EACH_ELEM(NR_PL_FIELD)",
                              "".join(f", hdr.pl[{i}].v" for i in range(C.max_elems)))
    return [x.strip() for x in body.split(",")]


def evaluate_icrc(frame: bytes) -> int:
    """hdr.icrc.v as egress.p4 computes it for the frame's headers (BMv2 semantics)."""
    hdr = decode(frame)
    parts: list[tuple[int, int]] = []
    for item in icrc_fields():
        if m := re.fullmatch(r"(\d+)w(0x[0-9A-Fa-f]+|\d+)", item):
            parts.append((int(m.group(1)), int(m.group(2), 0)))
        else:
            m = re.fullmatch(r"hdr\.(\w+(?:\[\d+\])?)\.(\w+)", item)
            assert m, item
            h, f = m.groups()
            if h in hdr:                       # BMv2 skips fields of invalid headers
                parts.append((field_width(h.split("[")[0], f), hdr[h][f]))
    nbits = sum(w for w, _ in parts)
    assert nbits % 8 == 0
    crc = zlib.crc32(concat(parts).to_bytes(nbits // 8, "big"))
    swap = must(r"hdr\.icrc\.v = (.*?);", source("egress.p4")).group(1)
    return concat([(int(hi) - int(lo) + 1, crc >> int(lo) & (1 << int(hi) - int(lo) + 1) - 1)
                   for hi, lo in re.findall(r"crc\[(\d+):(\d+)\]", swap)])


@pytest.mark.parametrize("opcode,size", [(WRITE_FIRST, 256), (WRITE_MIDDLE, 256),
                                         (WRITE_LAST_IMM, 128), (WRITE_ONLY, 4),
                                         (WRITE_ONLY_IMM, 256), (WRITE_MIDDLE, 0)])
def test_icrc_field_list_gives_the_rocev2_icrc(opcode: int, size: int) -> None:
    c = make_ring(3, psn0=[0xFFFFF0, 5, 6]).connections[0]
    data = np.random.default_rng(size).integers(-2**31, 2**31, size // 4, dtype=np.int32)
    frame = write_frame(c, 20, opcode, data, ackreq=True, ip_id=0xBEEF, imm=0x12345678,
                        reth=(0x7F00DEADBEEF, 0x1234, 640))
    masked = bytearray(frame)
    masked[15] = masked[22] = masked[46] = 0x5A                  # TOS, TTL, BTH byte 4: masked
    masked[24:26] = masked[40:42] = b"\x12\x34"                   # IP and UDP checksums: masked
    assert evaluate_icrc(frame) == evaluate_icrc(bytes(masked)) == decode(frame)["icrc"]["v"]


def register_widths() -> dict[str, int]:
    return {name: int(w) for w, name in re.findall(r"register<bit<(\d+)>>\(\w+\)\s+(\w+);",
                                                   source("state.p4"))}


def contribution_layout() -> dict[str, list[str]]:
    """contrib register -> the header fields ingress concatenates into it, MSB first."""
    agg = source("aggregate.p4")
    defs = {name: expr for name, expr in re.findall(r"bit<\d+> (\w+) = ([^;]*\+\+[^;]*);", agg)}
    out = {}
    for reg, expr in re.findall(r"(contrib_\w+)\.write\(c, ([^;]*)\);", agg, re.S):
        expr = defs.get(expr.strip(), expr)
        out[reg] = [p.strip() for p in expr.split("++")]
    return out


def test_contribution_registers_put_every_bit_back() -> None:
    egress, widths = source("egress.p4"), register_widths()
    layout = contribution_layout()
    assert set(layout) == {n for n in widths if n.startswith("contrib_")}
    for reg, fields in layout.items():
        sizes = [field_width(*must(r"^hdr\.(\w+)\.(\w+)$", f).groups()) for f in fields]
        assert sum(sizes) == widths[reg], reg
        target = must(rf"{reg}\.read\(([\w.]+), c\);", egress).group(1)
        if target.startswith("hdr."):                             # read straight into the field
            assert fields == [target], reg
            continue
        restored = dict((f"hdr.{h}.{f}", (int(hi), int(lo))) for h, f, hi, lo in re.findall(
            rf"hdr\.(\w+)\.(\w+) = {target}\[(\d+):(\d+)\];", egress))
        top = widths[reg]
        for f, w in zip(fields, sizes):
            assert restored.pop(f) == (top - 1, top - w), (reg, f)
            top -= w
        assert not restored, (reg, restored)


def test_egress_rebuilds_every_header_field() -> None:
    egress = source("egress.p4")
    written = set(re.findall(r"hdr\.(\w+)\.(\w+)\s*=", egress)) \
        | set(re.findall(r"\.read\(hdr\.(\w+)\.(\w+),", egress))
    for h in ("eth", "ipv4", "udp", "bth", "reth", "immdt"):
        for f, _ in header_types()[instances()[h]]:
            if (h, f) != ("ipv4", "csum"):
                assert (h, f) in written, f"egress never sets hdr.{h}.{f}"
    checksum = must(r"update_checksum\(.*?\{(.*?)\}", source("deparser.p4"), re.S).group(1)
    assert [x.strip() for x in checksum.split(",")] == \
        [f"hdr.ipv4.{f}" for f, _ in header_types()["ipv4_t"] if f != "csum"]


def test_ipv4_checksum_fields_give_the_header_checksum() -> None:
    frame = write_frame(make_ring(2).connections[1], 3, WRITE_ONLY, bytes(256), ip_id=77)
    hdr = decode(frame)["ipv4"]
    words = concat([(w, hdr[f]) for f, w in header_types()["ipv4_t"] if f != "csum"])
    total = sum(words >> s & 0xFFFF for s in range(0, 144, 16))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    assert ~total & 0xFFFF == Ether(frame)[IP].chksum == hdr["csum"]


def test_deparser_emits_the_headers_in_wire_order() -> None:
    emitted = re.findall(r"pkt\.emit\(hdr\.(\w+)\);", source("deparser.p4"))
    assert emitted == list(instances())
    extracted = re.findall(r"pkt\.extract\(hdr\.(\w+)", source("parser.p4"))
    assert sorted(extracted) == sorted(instances())


def test_every_source_is_included() -> None:
    main = source("netreduce.p4")
    included = set(re.findall(r'#include "(\w+\.p4)"', "".join(
        p.read_text() for p in P4_DIR.glob("*.p4"))))
    assert included | {"netreduce.p4"} == {p.name for p in Path(P4_DIR).glob("*.p4")}
    assert "V1Switch(NrParser(), NrVerifyChecksum(), NrIngress(), NrEgress()" in main
