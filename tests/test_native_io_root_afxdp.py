"""The native packet I/O (switch/native: AF_XDP ports, the AF_PACKET fallback, a worker)
on real frames over veth pairs in a namespace of its own: needs root, a kernel with
AF_XDP (CONFIG_XDP_SOCKETS) and libxdp; skipped otherwise (failed under CI=true).

Every conformance vector's frames go in at the driver sides; what comes out at each port
must be, byte for byte and in order, what the Python data plane sends for the same frame
(SoftwareHarness: the pipeline, then L2 for what it hands back). Built against
pipeline_stub.h (L2 only), the vectors run with no ring registered on either side: every
frame crosses the I/O (forwarded or flooded), none is aggregated; built against the
pipeline (libnrio.so, `pipeline`: native), the vectors' rings are registered on both
sides and the results come out aggregated. Path MTU 4096 frames (two UMEM chunks each:
multi-buffer receive and send) go through too.
Bounded: at most MAX_FRAMES frames a case, each step waits at most STEP_WAIT s.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conformance.software_harness import SoftwareHarness
from tests.conformance.vectors import all_vectors
from tests.native_rig import collect, in_netns, veths
from tests.roce_layers import WRITE_MIDDLE, mac_ports, make_ring, write_frame

ROOT = Path(__file__).resolve().parents[1]
MAX_FRAMES = 400


def _skip_or_fail(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def libraries() -> dict[str, Path]:
    """By pipeline: 'stub' (L2 only) and 'native' (libnrdp's) builds of libnrio."""
    if os.geteuid() != 0:
        _skip_or_fail("needs root (a network namespace, veth pairs, AF_XDP sockets)")
    if not Path("/usr/include/xdp/xsk.h").exists() or not shutil.which("make"):
        _skip_or_fail("needs libxdp-dev, libbpf-dev and make (scripts/install.sh)")
    run = subprocess.run(["make", "-s", "-f", "switch/native/io.mk", "stub",
                          "switch/native/libnrio.so"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return {"stub": ROOT / "switch/native/libnrio_stub.so",
            "native": ROOT / "switch/native/libnrio.so"}


def _cases() -> list[tuple[str, dict, list[tuple[int, bytes]]]]:
    """(name, setup, frames): every vector's input frames, and path MTU 4096 WRITEs."""
    cases = [(v.name, v.setup, [(s.in_port, s.frame) for s in v.steps]) for v in all_vectors()]
    spec = make_ring(3, mtu=4096)
    rng = np.random.default_rng(38)
    big = [(c.rank + 1, write_frame(c, k, WRITE_MIDDLE,
                                    rng.integers(-2**31, 2**31, 1024, dtype=np.int32)))
           for k in range(8) for c in spec.connections]
    cases.append(("mtu4096_writes", {"ports": [1, 2, 3], "macs": mac_ports(3), "rings": []},
                  big))
    return cases


@pytest.mark.parametrize("mode,link_mtu,pipeline", [
    ("driver", 1500, "stub"), ("generic", 9000, "stub"), ("af_packet", 9000, "stub"),
    ("driver", 1500, "native"), ("generic", 9000, "native")])
def test_native_io_forwards_vectors_as_python_does_root_afxdp(
        libraries: dict[str, Path], mode: str, link_mtu: int, pipeline: str) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.conformance.native_harness import NativeHarness
    from switch.dataplane.ports import open_port
    from switch.native.nrio import NativeIO, stub_pipe

    library = libraries[pipeline]

    cases = _cases()
    ports = sorted({p for _, setup, frames in cases for p in setup["ports"]})
    gen = in_netns()
    next(gen)
    try:
        links = veths(ports, link_mtu)
        drivers = {p: open_port(p, drv) for p, (_, drv) in links.items()}
        sent = 0
        for name, setup, frames in cases:
            if mode == "driver" and any(len(f) > 1500 for _, f in frames):
                continue                           # larger than the link (driver XDP's limit)
            if pipeline == "stub":                 # which registers no ring
                setup = {**setup, "rings": []}
                native, pipe = None, stub_pipe(setup["macs"], setup["ports"])
                address = ctypes.addressof(pipe)
            else:
                native = NativeHarness()
                native.setup(setup)
                assert native.pipe is not None
                native.pipe.set_l2(setup["macs"], setup["ports"])
                address = native.pipe.address
            oracle = SoftwareHarness()
            oracle.setup(setup)
            with NativeIO({p: links[p][0] for p in setup["ports"]}, mode=mode,
                          library=library, ring_size=512, idle_poll_us=100) as io:
                kinds = {c["kind"] for c in io.port_counters().values()}
                assert kinds == {"af_xdp-driver" if mode == "driver" else
                                 "af_xdp-generic" if mode == "generic" else "af_packet"}
                io.start([address])
                for in_port, frame in frames[:MAX_FRAMES - sent]:
                    # the data plane's L2 never sends a frame back where it came from
                    # (switch/dataplane/ports.py), the harness's would; results may go there
                    want = [(p, f) for p, f in oracle.send(in_port, frame)
                            if (p, f) != (in_port, frame)]
                    drivers[in_port].sock.send(frame)
                    got = collect({p: drivers[p].sock for p in setup["ports"]}, len(want))
                    for port in setup["ports"]:
                        assert [f for p, f in got if p == port] == \
                            [f for p, f in want if p == port], (name, in_port, port)
                    sent += 1
                io.stop()
                stats = io.worker_stats()[0]
                counters = io.port_counters()
            if native is not None:
                assert native.counters() == oracle.counters(), name
                native.close()
            assert stats["ownership_errors"] == 0
            assert sum(int(c["rx_dropped"]) + int(c["tx_errors"]) for c in counters.values()) == 0
            if mode == "generic" and name == "mtu4096_writes":
                assert sum(int(c["rx_gathered"]) for c in counters.values()) == len(frames)
                assert sum(int(c["tx_copied"]) for c in counters.values()) == 0   # chunks handed over
            if mode != "af_packet":                # every chunk back: free or on a fill ring
                assert stats["chunks_free"] + len(setup["ports"]) * 512 == stats["chunks_total"]
        assert sent > 100
    finally:
        for d in locals().get("drivers", {}).values():
            d.sock.close()
        next(gen, None)
