"""The vector format and the Harness protocol every switch target implements to run it.

A Vector is: setup (switch ports, MAC -> port table, ring registrations), steps (a frame
into a port -> every frame the switch sends, per port in order), and the ring/connection
counters expected after the last step. Frames are whole Ethernet frames without FCS.
Vectors tagged with `requires` need a capability (e.g. "any_payload_length": payloads
other than 256 B) that a harness lists in `supports`, else they are skipped for it.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Protocol, Sequence

FORMAT_VERSION = 1
ANY_PAYLOAD_LENGTH = "any_payload_length"

Frames = Sequence[tuple[int, bytes]]


@dataclass(frozen=True)
class Step:
    in_port: int
    frame: bytes
    expect: tuple[tuple[int, bytes], ...]    # (out port, frame), in emission order
    note: str = ""


@dataclass(frozen=True)
class Vector:
    name: str
    description: str
    setup: dict[str, Any]     # {"ports": [int], "macs": {mac: port}, "rings": [{"spec", "slots"}]}
    steps: tuple[Step, ...]
    counters: dict[str, Any]  # {ring_id: {"counters": {...}, "connections": [{...} per rank]}}
    requires: frozenset[str] = field(default_factory=frozenset)


class Harness(Protocol):
    """A switch target driven frame by frame."""

    supports: frozenset[str]   # the `requires` tags this harness can run

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        """Forget all earlier state, then install the ports, MAC table and rings given."""

    def send(self, in_port: int, frame: bytes,
             expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        """Feed one frame; every frame the switch sent because of it, in emission order.
        `expect`: how many frames the vector expects (None: not said); a target that
        waits for frames may stop once that many are in and no extra follows."""

    def send_burst(self, frames: Frames,
                   expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        """Feed (in_port, frame)s back to back; every frame the switch sent meanwhile
        (`expect`: as send's, for the whole burst)."""

    def counters(self) -> dict[str, Any]:
        """{ring_id: {"counters": {name: int}, "connections": [{name: int} per rank]}}."""

    def close(self) -> None:
        """Release the target."""


def per_port(frames: Iterable[tuple[int, bytes]]) -> dict[int, list[bytes]]:
    """Frames grouped by port, each port's in order: what a comparison may rely on."""
    out: dict[int, list[bytes]] = defaultdict(list)
    for port, frame in frames:
        out[port].append(frame)
    return dict(out)


def to_json(vectors: Sequence[Vector]) -> str:
    return json.dumps({"format": FORMAT_VERSION, "vectors": [
        {"name": v.name, "description": v.description, "requires": sorted(v.requires),
         "setup": v.setup, "counters": v.counters,
         "steps": [{"in_port": s.in_port, "frame": s.frame.hex(), "note": s.note,
                    "expect": [[p, f.hex()] for p, f in s.expect]} for s in v.steps]}
        for v in vectors]}, indent=1)


def from_json(text: str) -> list[Vector]:
    doc = json.loads(text)
    if doc.get("format") != FORMAT_VERSION:
        raise ValueError(f"vector format {doc.get('format')}, this reader knows {FORMAT_VERSION}")
    return [Vector(v["name"], v["description"], v["setup"],
                   tuple(Step(s["in_port"], bytes.fromhex(s["frame"]),
                              tuple((p, bytes.fromhex(f)) for p, f in s["expect"]), s["note"])
                         for s in v["steps"]),
                   v["counters"], frozenset(v["requires"]))
            for v in doc["vectors"]]
