"""The v1model program (switch/p4): p4c compiles it with no unreviewed warning, and
static checks of its source.

p4c's run: tests/p4tools.py (skipped with the reason without p4c, failing under CI=true).
From the source: the limits agree with the Python side and the README, the element macro
covers every element, the generated per-length actions (ICRC buffer, an emission's
valid words) are up to date and right, the registers
that carry a contribution's header to egress put every bit back where it came from, and
the deparser emits what the parser extracts, in order. The ICRC itself is checked against
BMv2 by tests/test_conformance.py (every opcode and payload length, byte for byte).
"""
from __future__ import annotations

import random
import re
import zlib
from functools import cache
from pathlib import Path

import pytest
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from nr_contract.spec import (CONN_COUNTERS, DEFAULT_SLOTS, LANE_OUTCOMES, MAX_RACKS, MAX_RANKS,
                              MAX_SLOTS, PATH_MTUS, RING_COUNTERS, TOR_COUNTERS, TRANSIT_COUNTERS)
from switch.dataplane.interswitch import Endpoint
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.p4 import program as p4program
from switch.p4.program import (ISCRC_PRE_WORDS, P4_DIR, contract, generated_sources,
                               icrc_words_source, iscrc_words_source, parse_contract,
                               pl_valid_source, unaccepted_warnings)
from tests.p4tools import require_tools
from tests.roce_layers import IMM_OPS, RETH_OPS, WRITE_ONLY, make_ring, write_frame

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


def test_spine_limits_agree_with_the_software_spine() -> None:
    """spine.p4's lanes fit the software spine's bitmap (MAX_RACKS) and its counters are the
    software spine's, each id once within its stride."""
    assert 2 <= C.max_lanes <= MAX_RACKS
    assert set(C.lane_counter_ids) == set(LANE_OUTCOMES)
    spine = SpinePipeline(SpineConfig(Endpoint("02:00:00:00:00:01", "10.0.0.1"), {}))
    assert set(C.is_counter_ids) == set(spine.interswitch)
    assert set(C.spine_counter_ids) == {"completed", "totals_sent"}
    for ids, stride in ((C.lane_counter_ids, C.lctrs), (C.spine_counter_ids, C.sctrs),
                        (C.is_counter_ids, len(C.is_counter_ids))):
        assert sorted(ids.values()) == list(range(len(ids))) and len(ids) <= stride


def test_tor_limits_agree_with_the_software_tor() -> None:
    """tor.p4's counters are the software ToR's (slots_skipped, which grows by more than one
    per pass, is a register), each id once within its stride; its group's replica ids are
    none of a lane's or the continuation's."""
    assert set(C.tor_counter_ids) == set(TOR_COUNTERS) - {"slots_skipped"}
    assert set(C.transit_counter_ids) == set(TRANSIT_COUNTERS)
    for ids, stride in ((C.tor_counter_ids, C.tctrs), (C.transit_counter_ids, C.xctrs)):
        assert sorted(ids.values()) == list(range(len(ids))) and len(ids) <= stride
    rids = {C.cont_rid, C.part_a_rid, C.part_b_rid, C.fwd_rid}
    assert len(rids) == 4 and min(rids) >= C.max_ranks
    steps = int(must(r"#define NR_TOR_STEPS\s+(\d+)", source("limits.p4")).group(1))
    must(r"^\s*(NR_TOR_STEP ){%d}\s*// NR_TOR_STEPS" % steps, source("tor_advance.p4"), re.M)


def test_parse_contract_names_a_missing_constant() -> None:
    with pytest.raises(KeyError, match="max_rings"):
        parse_contract("#define NR_SLOTS 4\n")


def test_readme_states_the_limits() -> None:
    readme = (P4_DIR / "README.md").read_text()
    rows = dict(re.findall(r"^\|\s*`NR_(\w+)`\s*\|\s*(\d+)\s*\|", readme, re.M))
    assert {k.lower(): int(v) for k, v in rows.items()} == {
        "max_rings": C.max_rings, "slots": C.slots, "max_ranks": C.max_ranks,
        "max_elems": C.max_elems, "max_macs": C.max_macs, "max_lanes": C.max_lanes}


def test_the_element_macro_lists_every_element_once() -> None:
    body = must(r"#define NR_FOR_EACH_ELEM\(M\)(.*?)\n\n", source("payload.p4"), re.S).group(1)
    assert [int(i) for i in re.findall(r"M\((\d+)\)", body)] == list(range(C.max_elems))
    assert "word_t[NR_MAX_ELEMS] pl;" in source("headers.p4")


def test_the_generated_files_are_up_to_date() -> None:
    for path, text in generated_sources(C).items():
        assert path.read_text() == text, \
            f"switch/p4/{path.name} is stale: python -m switch.p4.program --generate"


def test_each_icrc_action_right_aligns_the_header_part_and_its_payload() -> None:
    """words_<n> sets every buffer word once: zeros, the 16 header-part words, n payload
    words, in that order; icrc.p4 hashes 4 bytes of ones and the whole buffer (the struct
    icrc_buf_t, in field order), once."""
    text = icrc_words_source(C)
    size = 16 + C.max_elems
    for n in range(C.max_elems + 1):
        body = must(rf"action words_{n}\(\) \{{(.*?)\n    \}}", text, re.S).group(1)
        sets = re.findall(r"buf\.b(\d+) = ([^;]+);", body)
        assert [int(j) for j, _ in sets] == list(range(size)), n
        assert [v for _, v in sets] == (["0"] * (C.max_elems - n) + [f"w{i}" for i in range(16)]
                                        + [f"hdr.pl[{i}].v" for i in range(n)]), n
        assert f"            {n}: words_{n}();" in text
    icrc = source("icrc.p4")
    assert icrc.count("hash(crc,") == 1
    assert "hash(crc, HashAlgorithm.crc32, 32w0, buf, 64w0x100000000);" in icrc
    assert "buf.ones = 32w0xFFFFFFFF;" in icrc
    struct = must(r"struct icrc_buf_t \{(.*?)\}", icrc, re.S).group(1)
    assert re.findall(r"bit<32> (\w+);", struct) == ["ones"] + [f"b{j}" for j in range(size)]


def test_each_iscrc_action_right_aligns_the_header_and_its_payload() -> None:
    """iscrc_words.p4: as icrc_words.p4 with the inter-switch header's 4 words; iscrc.p4
    hashes the whole buffer (ones, b0..b67) once, then the carried part per hlen."""
    text = iscrc_words_source(C)
    size = ISCRC_PRE_WORDS + C.max_elems
    for n in range(C.max_elems + 1):
        body = must(rf"action words_{n}\(\) \{{(.*?)\n    \}}", text, re.S).group(1)
        sets = re.findall(r"buf\.b(\d+) = ([^;]+);", body)
        assert [int(j) for j, _ in sets] == list(range(size)), n
        assert [v for _, v in sets] == (["0"] * (C.max_elems - n) + ["w0", "w1", "w2", "w3"]
                                        + [f"hdr.pl[{i}].v" for i in range(n)]), n
    iscrc = source("iscrc.p4")
    assert iscrc.count("hash(crc, HashAlgorithm.crc32, 32w0, buf, 64w0x100000000);") == 1
    struct = must(r"struct iscrc_buf_t \{(.*?)\}", iscrc, re.S).group(1)
    assert re.findall(r"bit<32> (\w+);", struct) == ["ones"] + [f"b{j}" for j in range(size)]
    for hlen in (54, 58, 70, 74):
        assert f"hash(crc, HashAlgorithm.crc32, 32w0, c{hlen}, 64w0x100000000);" in iscrc


def bmv2_crc32(data: bytes) -> int:
    """v1model's hash(HashAlgorithm.crc32) of fields packed back to back: zlib's."""
    return zlib.crc32(data)


@pytest.mark.parametrize("words,hlen", [(0, None), (1, 54), (17, 58), (64, 70), (64, 74),
                                        (64, None), (3, 74)])
def test_the_inter_switch_crc32_as_iscrc_p4_computes_it(words: int, hlen: int | None) -> None:
    """iscrc.p4's two facts, with zlib as BMv2's crc32: the header (its first word XOR
    ones) and payload right-aligned behind 4 bytes of ones and zero words give
    zlib.crc32(header | payload); the carried part chained through ~h1 gives the whole."""
    rng = random.Random(words * 100 + (hlen or 0))
    head = bytes(rng.randrange(256) for _ in range(16))
    payload = bytes(rng.randrange(256) for _ in range(4 * words))
    carried = b"" if hlen is None else bytes(rng.randrange(256) for _ in range(4 + hlen))
    w0 = int.from_bytes(head[:4], "big") ^ 0xFFFFFFFF
    buf = (bytes(4 * (C.max_elems - words)) + w0.to_bytes(4, "big") + head[4:] + payload)
    crc = bmv2_crc32(b"\xff" * 4 + buf)
    assert crc == zlib.crc32(head + payload)
    if carried:
        r = ~crc & 0xFFFFFFFF
        c0 = int.from_bytes(carried[:4], "big") ^ int.from_bytes(r.to_bytes(4, "little"), "big")
        crc = bmv2_crc32(b"\xff" * 4 + c0.to_bytes(4, "big") + carried[4:])
    assert crc == zlib.crc32(head + payload + carried)


def test_each_emission_validity_action_keeps_exactly_its_words() -> None:
    text = pl_valid_source(C)
    for n in range(C.max_elems + 1):
        body = must(rf"action valid_{n}\(\) \{{(.*?)\n    \}}", text, re.S).group(1)
        calls = re.findall(r"hdr\.pl\[(\d+)\]\.(setValid|setInvalid)\(\);", body)
        assert calls == [(str(i), "setValid" if i < n else "setInvalid")
                         for i in range(C.max_elems)], n
        assert f"            {n}: valid_{n}();" in text


def test_the_icrc_header_part_is_right_aligned() -> None:
    """Each branch of icrc.p4 fills the 16 header-part words with zeros, then the 4 bytes
    of ones, the 10 IPv4/UDP/BTH words and exactly the extension words of its branch."""
    body = source("icrc.p4")
    heads = ["ones", "ip0", "ip1", "ip2", "ip3", "ip4", "udp0", "udp1", "bth0", "bth1", "bth2"]
    reth = ["hdr.reth.va[63:32]", "hdr.reth.va[31:0]", "hdr.reth.rkey", "hdr.reth.dma_len"]
    branches = re.findall(r"if \((.*?)\) \{\s*NR_ICRC_SET_PRE\((.*?)\)\s*\}|"
                          r"else \{\s*NR_ICRC_SET_PRE\((.*?)\)\s*\}", body, re.S)
    seen = []
    for cond, args, plain in branches:
        words = [a.strip() for a in (args or plain).split(",")]
        ext = (reth if "reth" in cond else []) + (["hdr.immdt.imm"] if "immdt" in cond else [])
        assert len(words) == 16
        assert words == ["0"] * (16 - len(heads) - len(ext)) + heads + ext, cond
        seen.append(len(ext))
    assert sorted(seen) == [0, 1, 4, 5]


def test_p4c_compiles_without_unreviewed_warnings() -> None:
    """p4c's messages (build/p4/p4c.log, written by the compile) hold only the warnings
    switch.p4.program.ACCEPTED_WARNINGS lists."""
    require_tools(p4program.P4C)
    build = p4program.compile_program()
    assert unaccepted_warnings(build.log.read_text()) == []


def test_p4c_compiles_the_spine_without_unreviewed_warnings() -> None:
    """The same for the spine program (build/p4-spine)."""
    require_tools(p4program.P4C)
    build = p4program.compile_program(p4program.DEFAULT_SPINE_BUILD, p4program.SPINE_MAIN)
    assert build.json.name == "spine.json"
    assert unaccepted_warnings(build.log.read_text()) == []


def test_p4c_compiles_the_tor_without_unreviewed_warnings() -> None:
    """The same for the ToR program (build/p4-tor)."""
    require_tools(p4program.P4C)
    build = p4program.compile_program(p4program.DEFAULT_TOR_BUILD, p4program.TOR_MAIN)
    assert build.json.name == "tor.json"
    assert unaccepted_warnings(build.log.read_text()) == []


def test_unaccepted_warnings_are_found() -> None:
    log = ("x.p4(3): [--Wwarn=invalid_header] warning: accessing a field of a potentially "
           "invalid header hdr.reth\n[--Wwarn=deprecated] warning: something\n")
    assert [k for k, _ in unaccepted_warnings(log)] == ["invalid_header", "deprecated"]


def register_widths() -> dict[str, int]:
    return {name: int(w) for w, name in re.findall(r"register<bit<(\d+)>>\(\w+\)\s+(\w+);",
                                                   source("state.p4"))}


def contribution_layout() -> dict[str, list[str]]:
    """contrib register -> the header fields ingress concatenates into it, MSB first."""
    agg = source("contribute.p4")
    defs = {name: expr for name, expr in re.findall(r"bit<\d+> (\w+) = ([^;]*\+\+[^;]*);", agg)}
    out = {}
    for reg, expr in re.findall(r"(contrib_\w+)\.write\(c, ([^;]*)\);", agg, re.S):
        expr = defs.get(expr.strip(), expr)
        out[reg] = [p.strip() for p in expr.split("++")]
    return out


def test_contribution_registers_put_every_bit_back() -> None:
    egress, widths = source("result.p4"), register_widths()
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
    egress = source("egress.p4") + source("result.p4")
    written = set(re.findall(r"hdr\.(\w+)\.(\w+)\s*=", egress)) \
        | set(re.findall(r"\.read\(hdr\.(\w+)\.(\w+),", egress))
    for h in ("eth", "ipv4", "udp", "bth", "reth", "immdt"):
        for f, _ in header_types()[instances()[h]]:
            if (h, f) != ("ipv4", "csum"):
                assert (h, f) in written, f"egress never sets hdr.{h}.{f}"
    deparser = source("deparser.p4")
    checksum = must(r"#define NR_IPV4_CSUM_FIELDS\s*\\\s*\{(.*?)\}", deparser, re.S).group(1)
    assert [x.strip(" \\\n") for x in checksum.split(",")] == \
        [f"hdr.ipv4.{f}" for f, _ in header_types()["ipv4_t"] if f != "csum"]
    for call in ("verify_checksum", "update_checksum"):
        must(rf"{call}\(\s*[^,]+,\s*NR_IPV4_CSUM_FIELDS,\s*hdr\.ipv4\.csum,", deparser)


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
    assert sorted(set(extracted)) == sorted(instances())     # icrc: the ICRC or the CRC32


def test_every_source_is_included() -> None:
    main = source("netreduce.p4")
    included = set(re.findall(r'#include "([\w/]+\.p4)"', "".join(
        p.read_text() for p in P4_DIR.rglob("*.p4"))))
    assert included | {"netreduce.p4", "spine.p4", "tor.p4"} == \
        {str(p.relative_to(P4_DIR)) for p in Path(P4_DIR).rglob("*.p4")}
    assert "V1Switch(NrParser(), NrVerifyChecksum(), NrIngress(), NrEgress()" in main
    spine = source("spine.p4")
    assert spine.index("#define NR_ROLE_SPINE") < spine.index("#include")
    assert "V1Switch(NrParser(), NrVerifyChecksum(), NrSpineIngress(), NrSpineEgress()" in spine
    tor = source("tor.p4")
    assert tor.index("#define NR_ROLE_TOR") < tor.index("#include")
    assert "V1Switch(NrParser(), NrVerifyChecksum(), NrTorIngress(), NrTorEgress()" in tor
