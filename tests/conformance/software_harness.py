"""The Harness for the software target: AggregationPipeline behind SoftwareTarget, plus
the L2 forwarding the dataplane does for frames the pipeline hands back (MAC table from the
vector's setup; unknown or broadcast destinations flood to every other port)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from nr_contract.spec import RingSpec
from switch.control.target import SoftwareTarget
from switch.dataplane.pipeline import AggregationPipeline
from tests.conformance.format import ANY_PAYLOAD_LENGTH, Frames


class SoftwareHarness:
    supports = frozenset({ANY_PAYLOAD_LENGTH})

    def __init__(self) -> None:
        self.setup({"ports": [], "macs": {}, "rings": []})

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        self.ports: list[int] = list(vectors_setup["ports"])
        self.macs: dict[str, int] = dict(vectors_setup["macs"])
        self.target = SoftwareTarget(AggregationPipeline(), self.macs.get)
        for ring in vectors_setup["rings"]:
            self.target.register_ring(RingSpec.from_dict(ring["spec"]), ring["slots"])

    def send(self, in_port: int, frame: bytes,
             expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        buf = bytearray(frame)
        def emit(port: int, parts: Sequence[bytes | memoryview]) -> None:
            out.append((port, b"".join(parts)))

        if not self.target.pipeline.process(memoryview(buf), in_port, emit):
            out += self.l2_forward(in_port, bytes(buf))
        return out

    def l2_forward(self, in_port: int, frame: bytes) -> list[tuple[int, bytes]]:
        """Where the dataplane sends a frame the pipeline hands back: its destination MAC's
        port, or every other port when that is unknown or a group address."""
        dst = ":".join(f"{b:02x}" for b in frame[:6])
        ports = [self.macs[dst]] if dst in self.macs else \
            [p for p in self.ports if p != in_port]
        return [(p, frame) for p in ports]

    def send_burst(self, frames: Frames,
                   expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        return [out for in_port, frame in frames for out in self.send(in_port, frame)]

    def counters(self) -> dict[str, Any]:
        return {rid: {"counters": ring["counters"],
                      "connections": [c["counters"] for c in ring["connections"]]}
                for rid, ring in self.rings().items()}

    def rings(self) -> dict[str, Any]:
        """The pipeline's counters() JSON: per ring its counters and connections'."""
        return self.target.counters()["rings"]

    def close(self) -> None:
        self.setup({"ports": [], "macs": {}, "rings": []})
