"""The controller's client: typed calls (control.proto), answers as plain dicts.

Imports only grpc, the generated modules, the token files and `nr_contract.spec`: the host
library uses it without loading any of the switch's data-plane code.
Credentials (control.proto header): the secret of the first entry of the token file
(`token_file`, else the file `$NR_CONTROLLER_TOKEN` names; neither: no credentials) goes with
every call as `authorization: Bearer SECRET`; with a CA file (`ca_file`, else
`$NR_CONTROLLER_CA`) the channel is TLS and verifies the switch's certificate, else clear.
Invariant: a client never speaks clear text to an address other hosts reach (`local_address`
false) unless told so in so many words (`insecure=True` or `$NR_CONTROLLER_INSECURE=1`): it
raises `ControllerError` first, before any byte is sent.
"""
from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import grpc

from nr_contract.spec import RingSpec
from nr_contract import control_pb2 as pb
from nr_contract import control_pb2_grpc
from nr_contract.tokens import CA_ENV, INSECURE_ENV, TOKEN_ENV, read_token_file

logger = logging.getLogger(__name__)
_warned_plaintext: set[str] = set()     # addresses warned about once per process


def local_address(addr: str) -> bool:
    """A unix socket, `localhost` or a loopback IP address (127.0.0.0/8, ::1): traffic that
    never leaves the machine. A name is looked up nowhere: `127.x.example` is not local."""
    if addr.startswith(("unix:", "unix-abstract:")):
        return True
    host = addr.rsplit(":", 1)[0] if not addr.startswith("[") else addr[1:].split("]", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

DEFAULT_ADDR = "10.77.0.254:50051"


class ControllerError(RuntimeError):
    """A failed controller call: `code` is the gRPC status name, the message says why."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def spec_message(spec: RingSpec) -> pb.RingSpec:
    """The proto form of `spec`; a value the proto cannot carry (a float, a negative or
    too large integer, a list for a string) raises ValueError naming the field."""
    msg = pb.RingSpec()
    fields = [(msg, "spec", name, getattr(spec, name))
              for name in ("ring_id", "world_size", "mtu", "msg_size", "window")]
    for r, c in enumerate(spec.connections):
        conn = msg.connections.add()
        fields += [(conn, f"spec.connections[{r}]", name, getattr(c, name))
                   for name in pb.Connection.DESCRIPTOR.fields_by_name]
    for target, path, name, value in fields:
        if isinstance(value, bool):
            raise ValueError(f"{path}.{name}: {value!r} is a bool, not a number")
        try:
            setattr(target, name, value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}.{name}: {value!r} cannot be sent: {e}") from None
    return msg


def limits_dict(limits: pb.TargetLimits) -> dict[str, Any]:
    return {"path_mtus": list(limits.path_mtus), "max_slots": limits.max_slots,
            "max_ranks": limits.max_ranks, "max_rings": limits.max_rings,
            "free_rings": limits.free_rings, "max_slot_memory": limits.max_slot_memory,
            "default_lease_ms": limits.default_lease_ms,
            "max_in_flight": limits.max_in_flight, "ack_timeout": limits.ack_timeout,
            "capacity": limits.capacity}


def _connection_dict(c: pb.ConnectionCounters) -> dict[str, Any]:
    reth = ({"va": c.reth.va, "rkey": c.reth.rkey, "dma_len": c.reth.dma_len}
            if c.HasField("reth") else None)
    return {"rank": c.rank, "src_ip": c.src_ip, "dst_ip": c.dst_ip, "dst_qpn": c.dst_qpn,
            "psn0": c.psn0, "in_port": c.in_port, "out_port": c.out_port, "reth": reth,
            "counters": dict(c.counters)}


def counters_dict(reply: pb.CountersReply) -> dict[str, Any]:
    """{"target", "rings": {id: {world_size, slots, next_emit, counters, connections}},
    "ports": {"N": {ifname, ...}}, "leases": {id: {owner, remaining_ms}}, "switch": {...},
    "static_macs": {mac: port}}."""
    return {"target": reply.target,
            "rings": {r.ring_id: {"world_size": r.world_size, "slots": r.slots,
                                  "next_emit": r.next_emit, "counters": dict(r.counters),
                                  "connections": [_connection_dict(c) for c in r.connections]}
                      for r in reply.rings},
            "ports": {str(p.port): {"ifname": p.ifname, **dict(p.counters)}
                      for p in reply.ports},
            "leases": {r.ring_id: {"owner": r.owner, "remaining_ms": r.lease_remaining_ms}
                       for r in reply.rings},
            "switch": dict(reply.switch), "static_macs": dict(reply.static_macs)}


# a controller that restarted is reached again within 0.1-1 s, not gRPC's default 1-120 s
RECONNECT = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
             ("grpc.max_reconnect_backoff_ms", 1000))


class ControllerClient:
    """Calls the controller at `addr`; waits up to `timeout` s for it to answer each call,
    and up to `program_timeout` s (default `timeout`) for the calls that make it program
    or read its target (RegisterRing, UnregisterRing, Counters): a fabric's controller
    programs every switch of the ring's racks one after the other, and under load a BMv2
    switch takes seconds to apply a ring's entries (docs/multirack.md)."""

    PROGRAMMING = frozenset({"RegisterRing", "UnregisterRing", "Counters"})

    def __init__(self, addr: str = DEFAULT_ADDR, timeout: float = 10.0, *,
                 program_timeout: Optional[float] = None,
                 token_file: Optional[str | Path] = None, ca_file: Optional[str | Path] = None,
                 insecure: Optional[bool] = None):
        """`insecure`: may speak clear text to a non-local address (None: as
        `$NR_CONTROLLER_INSECURE` says, '1' for yes)."""
        self.addr = addr
        self.timeout = timeout
        self.program_timeout = max(timeout, program_timeout or timeout)
        token_file = token_file or os.environ.get(TOKEN_ENV) or None
        ca_file = ca_file or os.environ.get(CA_ENV) or None
        self._metadata: tuple[tuple[str, str], ...] = ()
        if token_file is not None:
            _, secret = read_token_file(token_file)[0]
            self._metadata = (("authorization", f"Bearer {secret}"),)
        self._tls = ca_file is not None
        if ca_file is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
            self._channel = grpc.secure_channel(addr, creds, options=RECONNECT)
        else:
            if insecure is None:
                insecure = os.environ.get(INSECURE_ENV) == "1"
            if not local_address(addr):
                if not insecure:
                    raise ControllerError(
                        "UNAVAILABLE", f"controller at {addr}: no CA file to speak TLS with "
                        f"(give ca_file or ${CA_ENV}); clear text to an address other hosts "
                        f"reach only with insecure=True or {INSECURE_ENV}=1")
                if addr not in _warned_plaintext:
                    _warned_plaintext.add(addr)
                    logger.warning("controller %s: INSECURE, clear text (%s=1): anyone who "
                                   "can capture this traffic can read %s", addr, INSECURE_ENV,
                                   "and replay the token's secret" if self._metadata
                                   else "the rings' keys")
            self._channel = grpc.insecure_channel(addr, options=RECONNECT)
        self._stub = control_pb2_grpc.ControllerStub(self._channel)

    def _call(self, method: str, request: Any, timeout: Optional[float] = None) -> Any:
        """`method`; with `timeout`, a probe: fails at once (UNAVAILABLE) when the
        controller cannot be reached, else waits for it up to the client's timeout."""
        rpc = getattr(self._stub, method)
        wait = timeout is None
        if timeout is None:
            timeout = self.program_timeout if method in self.PROGRAMMING else self.timeout
        try:
            return rpc(request, timeout=timeout, wait_for_ready=wait,
                       metadata=self._metadata)
        except grpc.RpcError as e:
            code, detail = e.code(), e.details()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                detail = f"controller at {self.addr} did not answer {method} in {timeout} s"
                if not self._tls:
                    detail += (f" (over clear text: a controller serving TLS never answers "
                               f"that; give ca_file or ${CA_ENV})")
            raise ControllerError(code.name, detail) from None

    def watch_connection(self, dropped: Callable[[], None]) -> Callable[[], None]:
        """Call `dropped()` (on a gRPC thread: keep it short) each time the connection to
        the controller, once up, goes down (its process stopped: GOAWAY, or the link
        broke); returns the function that stops watching."""
        up = [False]

        def changed(state: grpc.ChannelConnectivity) -> None:
            if state == grpc.ChannelConnectivity.READY:
                up[0] = True
            elif up[0]:
                up[0] = False
                dropped()
        self._channel.subscribe(changed, try_to_connect=False)
        return lambda: self._channel.unsubscribe(changed)

    def ping(self) -> dict[str, Any]:
        reply = self._call("Ping", pb.PingRequest())
        return {"target": reply.target, "limits": limits_dict(reply.limits),
                "auth_required": reply.auth_required}

    def register_ring(self, spec: RingSpec, slots: Optional[int] = None,
                      lease_ms: Optional[int] = None, racks: Sequence[int] = ()
                      ) -> dict[str, Any]:
        """Register `spec` (slots / lease_ms None: the switch's defaults; `racks`: every
        rank's ToR id, only when a fabric's controller programs one of its switches)."""
        reply = self._call("RegisterRing", pb.RegisterRingRequest(
            spec=spec_message(spec), slots=slots or 0, lease_ms=lease_ms or 0, racks=racks))
        return {"ring_id": reply.ring_id, "slots": reply.slots, "ports": dict(reply.ports),
                "lease_ms": reply.lease_ms}

    def renew_lease(self, ring_id: str, timeout: Optional[float] = None) -> dict[str, Any]:
        """Renew `ring_id`'s lease (`timeout`: a probe, see `_call`)."""
        reply = self._call("RenewLease", pb.RenewLeaseRequest(ring_id=ring_id), timeout)
        return {"ring_id": reply.ring_id, "lease_ms": reply.lease_ms}

    def unregister_ring(self, ring_id: str) -> dict[str, Any]:
        return {"ring_id": self._call("UnregisterRing",
                                      pb.UnregisterRingRequest(ring_id=ring_id)).ring_id}

    def counters(self, ring_id: Optional[str] = None, connections: bool = True
                 ) -> dict[str, Any]:
        """Every ring's counters (or `ring_id`'s), with per-connection detail unless
        `connections` is False (see `counters_dict` for the shape)."""
        return counters_dict(self._call("Counters", pb.CountersRequest(
            ring_id=ring_id or "", connections=connections)))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
