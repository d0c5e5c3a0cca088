"""The native pipeline (switch/native, libnrdp) beyond the conformance vectors: under ASan +
UBSan, fuzzed (libFuzzer, seeded from the vectors' frames), bounded tables, and a
differential check against the Python pipeline (the oracle) over generated loss,
duplication, reordering, re-cuts and corruption.

Needs a C compiler and libisal-dev (libnrdp), clang for the sanitizer and fuzz builds:
a missing clang skips those two saying so, or fails them under CI=true (p4tools.unavailable).
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_native import Blob
from nr_contract.spec import RingSpec, required_slots
from switch.control.target import resolve_ports
from switch.native.binding import LIBRARY, SANITIZED, NativePipeline
from tests.conformance.native_harness import NativeHarness, build
from tests.conformance.software_harness import SoftwareHarness
from tests.conformance.vectors import all_vectors
from tests.p4tools import unavailable
from tests.roce_layers import (WRITE_FIRST, WRITE_LAST, WRITE_LAST_IMM, WRITE_MIDDLE, WRITE_ONLY,
                               WRITE_ONLY_IMM, mac_ports, make_ring, write_frame)

NATIVE = LIBRARY.parent
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    build()


def need_clang() -> None:
    if shutil.which("clang") is None:
        unavailable("clang not on PATH (apt-get install clang: sanitizer and fuzz builds)")


def test_vectors_under_asan_and_ubsan() -> None:
    """Every vector's steps through libnrdp_san.so in a Python preloading clang's ASan
    runtime: no report (any aborts the run), every step and counter as the vector says."""
    need_clang()
    build("sanitize")
    runtime = subprocess.run(["clang", "-print-file-name=libclang_rt.asan-x86_64.so"],
                             capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    done = subprocess.run([sys.executable, "-m", "conformance.native_harness", str(SANITIZED)],
                          cwd=TESTS, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = int(done.stdout.split()[0])
    assert steps >= 900, done.stdout      # all_vectors + every_opcode_every_length: 966


def fuzz_seed(setup: dict[str, Any], frames: list[tuple[int, bytes]],
              one_armed: bool = False) -> bytes:
    """A vector's rings and frames in fuzz_pipeline.c's input format; one-armed: each frame
    from its port's neighbour MAC (02:00:00:00:00:port), addressed to the server."""
    out = bytearray([len(setup["rings"]) | (0x80 if one_armed else 0)])
    macs = dict(setup["macs"])
    for ring in setup["rings"]:
        spec = RingSpec.from_dict(ring["spec"])
        ports = resolve_ports(spec, macs.get)
        out += bytes([spec.world_size, (spec.mtu // 256).bit_length() - 1,
                      ring["slots"].bit_length() - 1])
        for c in spec.connections:
            out += struct.pack("!5I2B", *(int.from_bytes(bytes(map(int, ip.split("."))), "big")
                                          for ip in (c.src_ip, c.dst_ip)),
                               c.src_qpn, c.dst_qpn, c.psn0, ports[c.src_ip], ports[c.dst_ip])
    for port, frame in frames:
        if one_armed:
            port, frame = 1, frame[:6] + bytes([2, 0, 0, 0, 0, port]) + frame[12:]
        out += struct.pack("!BH", port, len(frame)) + frame
    return bytes(out)


def test_fuzz_30_seconds(tmp_path: Path) -> None:
    """libFuzzer for ~30 s from the vectors' frames, in-path and one-armed: no crash, no
    sanitizer report, every built frame's ICRC right, every output on a registered port or
    routed right (fuzz_pipeline.c)."""
    need_clang()
    build("fuzz")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, v in enumerate(all_vectors()):
        frames = [(s.in_port, s.frame) for s in v.steps]
        (corpus / f"{i}-{v.name}").write_bytes(fuzz_seed(v.setup, frames))
        (corpus / f"{i}-{v.name}-1arm").write_bytes(fuzz_seed(v.setup, frames, one_armed=True))
    done = subprocess.run([str(NATIVE / "fuzz_pipeline"), "-max_total_time=30",
                           "-rss_limit_mb=1024", "-max_len=20000", str(corpus)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = int(re.search(r"Done (\d+) runs", done.stderr).group(1))
    assert runs >= 1000, done.stderr[-2000:]


def test_table_is_bounded_and_unregister_forgets() -> None:
    """A pipe of 4 connections takes one 4-rank ring, refuses another ('no room'); once the
    first is gone its frames are not the pipeline's (None) and the second fits."""
    a, b = make_ring(4, ring_id="a"), make_ring(4, ring_id="b", qpn_base=0x100)
    ports = resolve_ports(a, mac_ports(4).get)
    pipe = NativePipeline(max_rings=4, max_conns=4)
    try:
        pipe.register_ring(a, ports, 16)
        with pytest.raises(ValueError, match="no room"):
            pipe.register_ring(b, ports, 16)
        frame = write_frame(a.connections[0], 0, WRITE_ONLY, np.arange(64))
        assert pipe.process(frame, ports[a.connections[0].src_ip]) == []     # held
        pipe.unregister_ring("a")
        assert pipe.process(frame, ports[a.connections[0].src_ip]) is None
        pipe.register_ring(b, ports, 16)
        assert list(pipe.counters()) == ["b"]
        with pytest.raises(ValueError, match="not 32-bit"):
            pipe.register_ring(a, {**ports, a.connections[0].src_ip: 1 << 32}, 16)
        with pytest.raises(ValueError, match="already registered by ring b"):
            pipe.register_ring(make_ring(4, ring_id="c", qpn_base=0x100), ports, 16)
    finally:
        pipe.close()


def test_compute_only_through_libnrio() -> None:
    """libnrio.so built against the pipeline (io.mk): its nrio_compute runs a 4-rank ring's
    MTU 4096 WRITEs, rank-interleaved in PSN order, through a NativePipeline: every slot
    completes, each result goes to all 4 ranks (4 outputs per 4 contributions)."""
    from switch.native import nrio
    try:
        build("io")
    except RuntimeError as e:
        unavailable(f"libnrio.so does not build (libxdp-dev libbpf-dev?): {e}")
    spec = make_ring(4, mtu=4096, psn0=(0xFFFFF0, 1, 2, 3))
    ports = resolve_ports(spec, mac_ports(4).get)
    data = np.arange(1024, dtype=np.int32)
    todo = [(ports[c.src_ip], write_frame(c, k, WRITE_MIDDLE, data + c.rank))
            for k in range(64) for c in spec.connections]
    pipe = NativePipeline()
    try:
        pipe.register_ring(spec, ports, required_slots(spec))
        lib = nrio.load(nrio.LIBRARY)
        lib.nrio_compute.restype = ctypes.c_int64
        blob = Blob(todo)
        outs = ctypes.c_uint64()
        ns = lib.nrio_compute(ctypes.c_void_p(pipe.address), *blob.args(), blob.n,
                              ctypes.byref(outs))
        counters = pipe.counters()["ring"]["counters"]
    finally:
        pipe.close()
    assert ns > 0 and outs.value == len(todo)
    assert (counters["aggregated"], counters["completed"]) == (len(todo), 64)


# ---- differential: the native pipeline against the Python one ----------------------------

K = 24                     # relative PSNs per rank: beyond the 16 slots (overrun, stale, reuse)
DIFF_RING = make_ring(3, psn0=(0xFFFFF4, 0x20, 0x7FFFFE))       # two wrap within K
MESSAGE = (WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_ONLY, WRITE_FIRST, WRITE_LAST_IMM,
           WRITE_ONLY_IMM, WRITE_MIDDLE)
RNG = np.random.default_rng(38)


SHIFTS = 3                 # re-cuts per rank at most (each moves its later packets 1 PSN)


def _frames() -> dict[tuple[int, int, int, str], bytes]:
    """(rank, k, shift, 'data' | 'empty') -> that rank's scapy-built frame for its packet k
    once re-cut `shift` times: PSN psn0 + k + shift (rxe sends a message again as one empty
    WRITE_ONLY there, every later packet one PSN late: docs/pipeline.md rule 7a)."""
    out = {}
    for c in DIFF_RING.connections:
        for k in range(K):
            op = MESSAGE[k % len(MESSAGE)]
            words = 64 if op in (WRITE_FIRST, WRITE_MIDDLE) else 64 - 8 * (k % 3)
            payload = RNG.integers(-2**31, 2**31, words, dtype=np.int64).astype(np.int32)
            for shift in range(SHIFTS):
                psn = (c.psn0 + k + shift) & 0xFFFFFF
                out[c.rank, k, shift, "data"] = write_frame(c, k, op, payload, ip_id=k, psn=psn)
                out[c.rank, k, shift, "empty"] = write_frame(
                    c, k, WRITE_ONLY_IMM, b"", reth=(0x7F00AA000000 + k, 0x2A, 0),
                    imm=0x900 + k, ackreq=True, psn=psn)
    return out


FRAMES = _frames()
SETUP = {"ports": sorted(set(mac_ports(3).values())), "macs": mac_ports(3),
         "rings": [{"spec": DIFF_RING.to_dict(), "slots": required_slots(DIFF_RING)}]}
IN_PORT = resolve_ports(DIFF_RING, mac_ports(3).get)


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple[int, bytes]]:
    """Each rank's K packets delayed (jitter), some lost, duplicated, retransmitted late,
    corrupted or sent from a wrong port (then sent right later, as RC retransmits), some
    re-cut by an empty WRITE_ONLY."""
    events = []
    for c in DIFF_RING.connections:
        shift = 0
        for k in range(K):
            kind = draw(st.sampled_from(["ok"] * 12 + ["lost", "late", "dup", "corrupt",
                                                       "empty", "wrong_port"]))
            port, at = IN_PORT[c.src_ip], k + draw(st.integers(0, 6))
            sent = []
            if kind == "empty" and shift + 1 < SHIFTS:       # re-cut before packet k
                sent.append((at, port, FRAMES[c.rank, k, shift, "empty"]))
                shift += 1
            good = FRAMES[c.rank, k, shift, "data"]
            if kind == "corrupt":
                i = draw(st.integers(0, len(good) - 1))
                sent.append((at, port, good[:i] + bytes([good[i] ^ draw(st.integers(1, 255))])
                             + good[i + 1:]))
            elif kind == "wrong_port":
                sent.append((at, 1 + port % 3, good))
            if kind != "lost":
                sent.append((at, port, good))
            if kind in ("late", "dup"):
                sent.append((at + draw(st.integers(1, 20)), port, good))
            events += sent
    events.sort(key=lambda e: e[0])         # stable: a packet's copies keep their order
    return [(port, frame) for _, port, frame in events]


RUNS = []


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schedules())
def differential(schedule: list[tuple[int, bytes]]) -> None:
    python, native = SoftwareHarness(), NativeHarness()
    try:
        python.setup(SETUP)
        native.setup(SETUP)
        for i, (port, frame) in enumerate(schedule):
            assert native.send(port, frame) == python.send(port, frame), f"frame {i}"
        assert native.pipe is not None
        assert native.pipe.counters() == python.target.pipeline.counters()
    finally:
        native.close()
    RUNS.append(sum(python.counters()["ring"]["counters"].values()))


def test_differential_against_the_python_pipeline() -> None:
    """The same frames in, the same frames (in order, per port) and the same counters,
    next_emit and RETHs out, over >= 250 generated schedules; some complete slots."""
    differential()
    assert len(RUNS) >= 250
    assert sum(RUNS) > 0


@given(st.binary(max_size=300), st.binary(max_size=5000), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_crc32_shift_concatenates_as_zlib_does(a: bytes, b: bytes, seed: int) -> None:
    """What a result's ICRC rests on (one CRC pass per slot): zlib's CRC-32 of a + b equals
    nrdp_crc32_shift(crc(a), nrdp_crc32_xpow(len b)) ^ crc(b), with zlib as the oracle."""
    lib = ctypes.CDLL(str(LIBRARY))
    lib.nrdp_crc32_xpow.restype = lib.nrdp_crc32_shift.restype = ctypes.c_uint32
    lib.nrdp_crc32_xpow.argtypes = [ctypes.c_uint64]
    lib.nrdp_crc32_shift.argtypes = [ctypes.c_uint32, ctypes.c_uint32]
    start = zlib.crc32(seed.to_bytes(4, "little"))      # any state, as a header's CRC is
    head = zlib.crc32(a, start)
    want = zlib.crc32(b, head)
    assert lib.nrdp_crc32_shift(head, lib.nrdp_crc32_xpow(len(b))) ^ zlib.crc32(b) == want
