"""The Harness for the native target: libnrdp's pipeline (switch/native/binding.py) with the
software harness's L2 forwarding for the frames it hands back (NOT_MINE). Ports come from
the vector's MAC table exactly as the software target resolves them."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Optional

from nr_contract.spec import RingSpec
from switch.control.target import resolve_ports
from switch.native.binding import LIBRARY, NativePipeline
from tests.conformance.format import ANY_PAYLOAD_LENGTH
from tests.conformance.software_harness import SoftwareHarness


def build(target: str = "all") -> None:
    """`make -C switch/native TARGET` (a no-op when built); RuntimeError with make's output."""
    done = subprocess.run(["make", "-s", "-C", str(LIBRARY.parent), target],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"make -C switch/native {target} failed:\n{done.stdout}{done.stderr}")


class NativeHarness(SoftwareHarness):
    supports = frozenset({ANY_PAYLOAD_LENGTH})

    def __init__(self, library: Path = LIBRARY) -> None:
        self.library = library
        self.pipe: Optional[NativePipeline] = None
        super().__init__()

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        self.ports: list[int] = list(vectors_setup["ports"])
        self.macs: dict[str, int] = dict(vectors_setup["macs"])
        if self.pipe is not None:
            self.pipe.close()
        self.pipe = NativePipeline(path=self.library)
        for ring in vectors_setup["rings"]:
            spec = RingSpec.from_dict(ring["spec"])
            self.pipe.register_ring(spec, resolve_ports(spec, self.macs.get), ring["slots"])

    def send(self, in_port: int, frame: bytes,
             expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        assert self.pipe is not None
        out = self.pipe.process(bytes(frame), in_port)
        return self.l2_forward(in_port, bytes(frame)) if out is None else out

    def rings(self) -> dict[str, Any]:
        assert self.pipe is not None
        return self.pipe.counters()

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None


def run_vectors(library: Path) -> int:
    """Every single-switch vector through `library`'s pipeline, steps and counters checked
    against the vector; returns how many steps ran (AssertionError naming the first miss)."""
    from tests.conformance.format import per_port
    from tests.conformance.vectors import all_vectors, every_opcode_every_length
    harness = NativeHarness(library)
    steps = 0
    try:
        for vector in all_vectors() + [every_opcode_every_length()]:
            harness.setup(vector.setup)
            for i, step in enumerate(vector.steps):
                got = per_port(harness.send(step.in_port, step.frame))
                assert got == per_port(step.expect), f"{vector.name} step {i} ({step.note})"
                steps += 1
            assert harness.counters() == vector.counters, f"{vector.name}: counters"
    finally:
        harness.close()
    return steps


if __name__ == "__main__":
    import sys
    print(run_vectors(Path(sys.argv[1])), "steps passed")
