"""The native target: the controller's `Target` over the C data plane (switch/native).

Frames never reach Python: libnrio's worker threads (`switch.native.nrio.NativeIO`) run
every received frame through their own libnrdp pipeline (`switch.native.binding.
NativePipeline`, one per worker). This class only registers rings, reads counters and
answers port lookups, with `SoftwareTarget`'s semantics. Invariant: a ring lives in the
pipeline of the one worker that owns all of its ports (`NativeIO.port_worker`), so every
contribution of a slot meets on one core; a ring whose ports span workers is refused.
In one-armed mode (`router`, switch/native/router.h) there is one worker, a ring's hosts
are the router's neighbours while it is registered, and their ports its neighbour ports,
as SoftwareTarget's.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Optional, Protocol, Sequence

from switch.control.target import Target, normalize_mac, resolve_ports
from switch.native.binding import NativePipeline, NativeRouter
from switch.native.nrio import KINDS
from nr_contract.spec import RingSpec


KIND_CODES = {name: code for code, name in KINDS.items()}   # af_xdp-driver 1, -generic 2,
                                                            # af_packet 3 (nrio.h)


class PortIO(Protocol):
    """What the target reads of the switch's packet I/O (NativeIO's shape)."""

    workers: int

    def port_worker(self, number: int) -> int: ...

    def port_counters(self) -> dict[int, dict[str, int | str]]: ...

    def worker_stats(self) -> list[dict[str, int]]: ...


class NativeTarget(Target):
    """Rings in `pipes[w]`, the pipeline worker w of `io` runs; the static port map `macs`
    (MAC -> port) is the only way a ring's ports are found."""

    name = "native"

    def __init__(self, io: PortIO, pipes: Sequence[NativePipeline],
                 macs: Mapping[str, int], max_rings: int,
                 router: Optional[NativeRouter] = None) -> None:
        if len(pipes) != io.workers:
            raise ValueError(f"{len(pipes)} pipelines for {io.workers} workers")
        if router is not None and len(pipes) != 1:
            raise ValueError(f"one-armed mode runs one worker, not {len(pipes)}")
        self.router = router
        self.io = io
        self.pipes = list(pipes)
        self.max_rings = max_rings
        self._macs = {normalize_mac(m): p for m, p in macs.items()}
        self._worker: dict[str, int] = {}          # ring id -> the worker holding it
        self._lock = threading.Lock()

    def port_of_mac(self, mac: str) -> Optional[int]:
        if self.router is not None:
            return self.router.router.port_of_mac(mac)
        return self._macs.get(normalize_mac(mac))

    def worker_of_ports(self, ring_id: str, ports: dict[str, int]) -> int:
        """The one worker owning every port of the ring; ValueError names the split."""
        workers = {ip: self.io.port_worker(p) for ip, p in ports.items()}
        missing = sorted(ip for ip, w in workers.items() if w < 0)
        if missing:
            raise ValueError(f"ring {ring_id}: ports of {', '.join(missing)} are not ports of "
                             "this switch's I/O")
        if len(set(workers.values())) != 1:
            split = ", ".join(f"{ip} port {ports[ip]} on worker {w}"
                              for ip, w in sorted(workers.items()))
            raise ValueError(f"ring {ring_id}: its ports are on different workers ({split}); "
                             "a ring's ports must all be on one worker (--port-worker)")
        return next(iter(workers.values()))

    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        learned = self.router is not None and self.router.router.add_ring(spec)
        try:
            if learned:
                self.router.sync()
            return self._register(spec, slots)
        except Exception:
            if learned:
                self._forget(spec.ring_id)
            raise

    def _forget(self, ring_id: str) -> None:
        """One-armed: the ring's neighbours go with it."""
        if self.router is not None:
            self.router.router.remove_ring(ring_id)
            self.router.sync()

    def _register(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        ports = resolve_ports(spec, self.port_of_mac)
        # one-armed: every neighbour port is the one port's, on worker 0
        worker = 0 if self.router is not None else self.worker_of_ports(spec.ring_id, ports)
        with self._lock:
            old = self._worker.get(spec.ring_id)
            if old is None and len(self._worker) >= self.max_rings:
                raise ValueError(f"ring {spec.ring_id}: the native switch holds "
                                 f"{self.max_rings} rings at most")
            self._worker[spec.ring_id] = worker
        try:
            self.pipes[worker].register_ring(spec, ports, slots)
        except Exception:
            if old is None:
                with self._lock:
                    self._worker.pop(spec.ring_id, None)
            raise
        return {"ring_id": spec.ring_id, "slots": slots, "ports": ports}

    def unregister_ring(self, ring_id: str) -> None:
        with self._lock:
            worker = self._worker.pop(ring_id, None)
        if worker is None:
            raise KeyError(f"ring {ring_id} is not registered")
        self.pipes[worker].unregister_ring(ring_id)
        self._forget(ring_id)

    def counters(self) -> dict[str, Any]:
        """SoftwareTarget's shape; "switch" sums the workers' frames and outputs and counts
        the ports on the AF_PACKET fallback. A port's counters are integers but its ifname
        (the Counters RPC's PortCounters): its "kind" is libnrio's code, `KIND_CODES`."""
        rings: dict[str, Any] = {}
        for pipe in self.pipes:
            rings.update(pipe.counters())
        ports = {str(n): {**c, "kind": KIND_CODES[str(c["kind"])]}
                 for n, c in self.io.port_counters().items()}
        stats = self.io.worker_stats()
        switch = {"workers": len(stats),
                  "frames": sum(s["frames"] for s in stats),
                  "outputs": sum(s["outputs"] for s in stats),
                  "ownership_errors": sum(s["ownership_errors"] for s in stats),
                  "fallback_ports": sum(int(c["fallback"]) for c in ports.values()),
                  **(self.router.counters() if self.router is not None else {})}
        return {"target": self.name, "rings": rings, "ports": ports, "switch": switch}

    def limits(self) -> dict[str, Any]:
        return {**super().limits(), "max_rings": self.max_rings}
