"""The switch controller: a gRPC service with JSON messages, the Target interface, the client.

Service `netreduce.Controller`, no protobuf codegen: every request and response is a JSON
object encoded as UTF-8 bytes.
    RegisterRing   {"spec": RingSpec dict, "slots"?: int} -> {"ring_id", "slots", "ports"}
    UnregisterRing {"ring_id": str}                       -> {"ring_id"}
    Counters       {}                                     -> {"target", "rings", "ports"}
    Ping           {}                                     -> {"target": name, "limits": TargetLimits}
Errors come back as gRPC status: INVALID_ARGUMENT (a bad request or registration),
NOT_FOUND (unknown ring), INTERNAL (anything else), each with a message saying what.
Invariant: the controller never touches packets; it resolves ports from MACs and hands
rings to a Target, which installs them in its data plane.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from abc import ABC, abstractmethod
from concurrent import futures
from typing import Any, Callable, Optional

import grpc

from ring_setup.spec import RingSpec
from switch.pipeline import DEFAULT_SLOTS, MAX_RANKS, MAX_SLOTS, PATH_MTUS, AggregationPipeline

SERVICE = "netreduce.Controller"
DEFAULT_ADDR = "10.77.0.254:50051"
log = logging.getLogger(__name__)

PortOfMac = Callable[[str], Optional[int]]


def normalize_mac(mac: str) -> str:
    """'02:4E:52:0:0:1' -> '02:4e:52:00:00:01'."""
    return ":".join(f"{int(b, 16):02x}" for b in mac.split(":"))


def resolve_ports(spec: RingSpec, port_of_mac: PortOfMac) -> dict[str, int]:
    """Each rank's IP -> the switch port its MAC was seen on; ValueError says who is missing."""
    ports: dict[str, int] = {}
    n = spec.world_size
    for c in spec.connections:
        for end, rank, ip, mac in (("src", c.rank, c.src_ip, c.src_mac),
                                   ("dst", (c.rank + 1) % n, c.dst_ip, c.dst_mac)):
            port = port_of_mac(normalize_mac(mac))
            if port is None:
                raise ValueError(f"{end} MAC {mac} of rank {rank} ({ip}) not seen on any "
                                 "switch port")
            if ports.setdefault(ip, port) != port:
                raise ValueError(f"rank {rank} ({ip}) is seen on switch ports "
                                 f"{ports[ip]} and {port}")
    return ports


@dataclasses.dataclass(frozen=True)
class TargetLimits:
    """What a target can aggregate (the fields of TargetLimits in switch/api/control.proto):
    a ring outside these is refused at registration. `max_rings` 0: no fixed number (then
    `free_rings` is 0 too); `max_slot_memory` 0: no limit; `default_lease_ms` 0: no lease."""

    path_mtus: tuple[int, ...]
    max_slots: int
    max_ranks: int
    max_rings: int
    free_rings: int
    max_slot_memory: int = 0
    default_lease_ms: int = 0


class Target(ABC):
    """A switch data plane the controller can program."""

    name: str

    @abstractmethod
    def limits(self) -> TargetLimits:
        """What this target can aggregate now (free_rings counts the rings in use)."""

    @abstractmethod
    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        """Install the ring; returns {"ring_id", "slots", "ports": {ip: port}}."""

    @abstractmethod
    def unregister_ring(self, ring_id: str) -> None:
        """Remove the ring (KeyError if unknown)."""

    @abstractmethod
    def counters(self) -> dict[str, Any]:
        """{"target": name, "rings": {ring_id: ...}, "ports": {port: {...}}} (JSON-able)."""

    @abstractmethod
    def port_of_mac(self, mac: str) -> Optional[int]:
        """The switch port where frames from `mac` (lowercase, colon form) arrive."""


class SoftwareTarget(Target):
    """The Python switch: an AggregationPipeline plus what its dataplane knows of ports."""

    name = "software"

    def __init__(self, pipeline: AggregationPipeline, port_of_mac: PortOfMac,
                 port_counters: Callable[[], dict[Any, dict[str, Any]]] = dict):
        self.pipeline = pipeline
        self._port_of_mac = port_of_mac
        self._port_counters = port_counters

    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        ports = resolve_ports(spec, self._port_of_mac)
        self.pipeline.register_ring(spec, ports, slots)
        return {"ring_id": spec.ring_id, "slots": slots, "ports": ports}

    def unregister_ring(self, ring_id: str) -> None:
        self.pipeline.unregister_ring(ring_id)

    def counters(self) -> dict[str, Any]:
        return {"target": self.name, "rings": self.pipeline.counters(),
                "ports": {str(p): c for p, c in self._port_counters().items()}}

    def port_of_mac(self, mac: str) -> Optional[int]:
        return self._port_of_mac(mac)

    def limits(self) -> TargetLimits:
        return TargetLimits(path_mtus=PATH_MTUS, max_slots=MAX_SLOTS, max_ranks=MAX_RANKS,
                            max_rings=0, free_rings=0)


class ControllerService:
    """The RPC handlers: JSON in, JSON out, Target exceptions mapped to gRPC status."""

    def __init__(self, target: Target):
        self.target = target

    def register_ring(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            spec = RingSpec.from_dict(req["spec"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"RegisterRing needs a complete 'spec': {e}") from e
        slots = req.get("slots", DEFAULT_SLOTS)
        if not isinstance(slots, int):
            raise ValueError(f"RegisterRing: slots must be an integer, not {slots!r}")
        return self.target.register_ring(spec, slots)

    def unregister_ring(self, req: dict[str, Any]) -> dict[str, Any]:
        if "ring_id" not in req:
            raise ValueError("UnregisterRing needs 'ring_id'")
        self.target.unregister_ring(req["ring_id"])
        return {"ring_id": req["ring_id"]}

    def counters(self, req: dict[str, Any]) -> dict[str, Any]:
        return self.target.counters()

    def ping(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"target": self.target.name,
                "limits": dataclasses.asdict(self.target.limits())}

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {"RegisterRing": self.register_ring, "UnregisterRing": self.unregister_ring,
                   "Counters": self.counters, "Ping": self.ping}
        return grpc.method_handlers_generic_handler(
            SERVICE, {name: grpc.unary_unary_rpc_method_handler(_json_rpc(name, fn))
                      for name, fn in methods.items()})


def _json_rpc(name: str, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable:
    """Wrap fn as a raw-bytes unary handler that decodes, calls and maps errors.

    context.abort raises, so a handler either returns the reply or ends the call with status.
    """
    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            req = json.loads(request or b"{}")
            if not isinstance(req, dict):
                raise ValueError("the request must be a JSON object")
            return json.dumps(fn(req)).encode()
        except KeyError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e.args[0]) if e.args else name)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:  # noqa: BLE001 - anything else is the controller's fault
            log.exception("%s failed", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{name}: {type(e).__name__}: {e}")
    return handle


def serve(target: Target, addr: str = DEFAULT_ADDR, max_workers: int = 4
          ) -> tuple[grpc.Server, int]:
    """Start the controller on `addr` ('host:0' picks a port); returns (server, port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    server.add_generic_rpc_handlers((ControllerService(target).handler(),))
    try:
        port = server.add_insecure_port(addr)
    except RuntimeError as e:
        raise OSError(f"controller: cannot listen on {addr}: {e}") from None
    server.start()
    return server, port


class ControllerError(RuntimeError):
    """A failed controller call: `code` is the gRPC status name, the message says why."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ControllerClient:
    """Calls the controller at `addr`; waits up to `timeout` s for it to answer each call."""

    def __init__(self, addr: str = DEFAULT_ADDR, timeout: float = 10.0):
        self.addr = addr
        self.timeout = timeout
        self._channel = grpc.insecure_channel(addr)

    def _call(self, method: str, req: dict[str, Any]) -> dict[str, Any]:
        rpc = self._channel.unary_unary(f"/{SERVICE}/{method}")
        try:
            reply = rpc(json.dumps(req).encode(), timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as e:
            code, detail = e.code(), e.details()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                detail = f"controller at {self.addr} did not answer {method} in {self.timeout} s"
            raise ControllerError(code.name, detail) from None
        return json.loads(reply)

    def register_ring(self, spec: RingSpec, slots: Optional[int] = None) -> dict[str, Any]:
        req: dict[str, Any] = {"spec": spec.to_dict()}
        if slots is not None:
            req["slots"] = slots
        return self._call("RegisterRing", req)

    def unregister_ring(self, ring_id: str) -> dict[str, Any]:
        return self._call("UnregisterRing", {"ring_id": ring_id})

    def counters(self) -> dict[str, Any]:
        return self._call("Counters", {})

    def ping(self) -> dict[str, Any]:
        return self._call("Ping", {})

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
