"""The rendezvous store: a small TCP key-value store that rank 0 serves from daemon threads
at MASTER_ADDR:MASTER_PORT, torchrun style (the wire protocol: `ring_setup.store_protocol`;
the ranks' side: `ring_setup.rendezvous`).

Who may talk to the store: only the job's ranks. A connection proves the job's secret
before anything else (the hello), and the store proves it back; a connection that fails
(or says nothing for HELLO_TIMEOUT) is closed having changed nothing. The store listens on
MASTER_ADDR only, holds at most `max_connections` connections, bounds lines (MAX_LINE),
stored bytes (MAX_STORED) and every server-side wait (MAX_WAIT); a rank may write only its
own keys ("<name>/<rank>") and speak only for itself. A malformed request gets an error
naming what is wrong and changes nothing.

Liveness: the store marks rank r failed, with the reason, when
- r aborts (`abort`),
- a connection of r closes before every rank has left: r's process died (the kernel closes
  its sockets at once, SIGKILL included), or r finalized alone,
- r's watch has been silent for SILENCE_TIMEOUT (its host hung or is unreachable).
A failure is final: the store keeps it until it stops. Notices (not failures): the store
keeps the first reason per epoch and answers every watch at once when an epoch above the
one it last saw exists.
"""
from __future__ import annotations

import hmac
import json
import secrets
import socket
import threading
import time
from typing import Any

from ring_setup.store_protocol import (HELLO_TIMEOUT, MAX_KEYS, MIN_SECRET, SECRET_ENV,
                                       SILENCE_TIMEOUT, BadRequest, RendezvousError, key_rank,
                                       mac, parse_wait, read_request)

MAX_STORED = 64 << 20    # bytes of keys and values the store holds
MAX_NOTICES = 1 << 20    # notice epochs


class StoreServer:
    """The store (rank 0): a dict guarded by one condition, one thread per client (see the
    module doc for who may connect and the bounds).

    Invariants: a request reaches `_handle` only on a connection that proved the secret, as
    the rank it proved; a refused request changes nothing; the store holds at most
    `max_connections` connections and MAX_STORED bytes."""

    def __init__(self, port: int, world_size: int, host: str, secret: bytes,
                 max_connections: int | None = None) -> None:
        if len(secret) < MIN_SECRET:
            raise RendezvousError("rendezvous: the store needs the job's secret "
                                  f"({SECRET_ENV}, at least {MIN_SECRET} characters)")
        self.world_size = world_size
        self._secret = secret
        # each rank keeps 2 (requests, watch) and briefly a third (abort); room to spare
        self.max_connections = max_connections or 4 * world_size + 8
        self.refused_connections = 0            # over max_connections, or failed hello
        self._stored = 0
        self._cond = threading.Condition()
        self._data: dict[str, Any] = {}
        self._aborted: dict[int, str] = {}      # failed ranks (see the module doc)
        self._notices: dict[int, str] = {}      # notice epoch -> its first reason
        self._left: set[int] = set()
        self._gave_up: set[int] = set()         # ranks whose get timed out on missing keys
        self._seen: dict[int, float] = {}       # rank -> end of its last watch (monotonic)
        self._watching: set[int] = set()        # ranks with a watch request in progress
        self._conns: set[socket.socket] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
        except OSError as exc:
            self._listener.close()
            raise RendezvousError(f"rendezvous: rank 0 cannot serve the store on "
                                  f"{host}:{port} (MASTER_ADDR must be an address of rank 0's "
                                  f"host): {exc}") from exc
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._accepting = True
        self._acceptor = threading.Thread(target=self._accept_loop, name="nr-store-accept",
                                          daemon=True)
        self._acceptor.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                break
            with self._cond:
                full = len(self._conns) >= self.max_connections
                if full:
                    self.refused_connections += 1
                else:
                    self._conns.add(conn)
            if full:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="nr-store-conn",
                             daemon=True).start()
        self._listener.close()

    def _stop_accepting(self) -> None:
        """Refuse new connections from now on (caller holds the condition)."""
        if self._accepting:
            self._accepting = False
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, give clients `grace` seconds to hang up, then cut them off."""
        with self._cond:
            self._stop_accepting()
            self._cond.wait_for(lambda: not self._conns, timeout=grace)
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._acceptor.join(timeout=grace)

    def _serve(self, conn: socket.socket) -> None:
        rank: int | None = None          # whose connection this is, once it proved the secret
        notifier = False                 # a connection that published a notice: its close
        #                                  is the end of that request, not of its rank
        try:
            with conn, conn.makefile("rb") as reader:
                nonce = secrets.token_hex(16)
                conn.settimeout(HELLO_TIMEOUT)
                conn.sendall(json.dumps({"challenge": nonce}).encode() + b"\n")
                try:
                    reply, rank = self._hello(read_request(reader), nonce)
                except (BadRequest, OSError) as exc:
                    reply, rank = {"ok": False, "error": str(exc)}, None
                if rank is None:
                    with self._cond:
                        self.refused_connections += 1
                conn.sendall(json.dumps(reply).encode() + b"\n")
                if rank is None:
                    return
                conn.settimeout(None)
                while True:
                    try:
                        req = read_request(reader)
                    except BadRequest as exc:
                        if str(exc) == "closed":
                            break
                        reply = {"ok": False, "error": str(exc)}
                    else:
                        notifier = notifier or req.get("op") == "notice"
                        try:
                            reply = self._handle(req, rank)
                        except BadRequest as exc:
                            reply = {"ok": False, "error": str(exc)}
                    conn.sendall(json.dumps(reply).encode() + b"\n")
        except (OSError, BadRequest):
            pass
        finally:
            with self._cond:
                self._conns.discard(conn)
                if rank is not None and not notifier:
                    self._connection_closed(rank)
                self._cond.notify_all()

    def _connection_closed(self, rank: int) -> None:
        """A connection of `rank` closed (caller holds the condition): a failure unless
        every rank has left, or some failure is known already (the ranks that learn of it
        exit: consequences, not culprits)."""
        if len(self._left) == self.world_size or self._aborted or rank in self._gave_up:
            return          # (a rank that gave up waiting for others is not their culprit)
        if rank in self._left:
            why = "it finalized and left while other ranks had not (its QPs are gone)"
        else:
            why = ("its process died or closed its connection to the store without "
                   "finalizing")
        self._aborted[rank] = why

    def _check_silence(self) -> None:
        """Declare failed every watching rank silent for SILENCE_TIMEOUT (holds the lock)."""
        now = time.monotonic()
        for r, seen in self._seen.items():
            if r not in self._aborted and r not in self._left and r not in self._watching \
                    and now - seen > SILENCE_TIMEOUT:
                self._aborted[r] = (f"silent for {now - seen:.0f}s (no liveness message: its "
                                    f"host hung or is unreachable)")

    def _hello(self, req: dict[str, Any], nonce: str) -> tuple[dict[str, Any], int | None]:
        """The first request of a connection: (reply, the rank it proved or None)."""
        if req.get("op") != "hello":
            return {"ok": False, "error": "the first request must be hello"}, None
        rank, world_size = req.get("rank"), req.get("world_size")
        theirs, proof = req.get("nonce"), req.get("mac")
        if not (isinstance(theirs, str) and isinstance(proof, str) and 0 < len(theirs) <= 64):
            return {"ok": False, "error": "hello needs nonce and mac"}, None
        if not hmac.compare_digest(proof, mac(self._secret, "hello", nonce, theirs, rank,
                                             world_size)):
            return {"ok": False, "error": f"not this job's secret ({SECRET_ENV}): every rank "
                    "must have the same"}, None
        if world_size != self.world_size:
            return {"ok": False, "error": f"rank {rank} has world size {world_size} but rank "
                    f"0 has {self.world_size}"}, None
        if not (isinstance(rank, int) and 0 <= rank < self.world_size):
            return {"ok": False, "error": f"rank {rank!r} is not in 0..{self.world_size - 1}"}, None
        return {"ok": True, "mac": mac(self._secret, "store", theirs, nonce)}, rank

    def _handle(self, req: dict[str, Any], rank: int) -> dict[str, Any]:
        """One request of `rank`'s connection; BadRequest (nothing changed) if malformed."""
        op = req.get("op")
        if "rank" in req and req["rank"] != rank:
            raise BadRequest(f"rank {rank}'s connection cannot speak for rank {req['rank']!r}")
        with self._cond:
            if op == "set":
                key, value = req.get("key"), req.get("value")
                if key_rank(key) != rank:
                    raise BadRequest(f"rank {rank} may set only its own keys NAME/{rank}, "
                                     f"not {key!r}")
                size = len(key) + len(json.dumps(value))
                if key not in self._data and self._stored + size > MAX_STORED:
                    raise BadRequest(f"the store is full ({MAX_STORED} bytes)")
                if req.get("exclusive") and key in self._data:
                    return {"ok": False, "error": f"{key!r} was published twice: two processes "
                            f"claim the same rank"}
                self._stored += size if key not in self._data else 0
                self._data[key] = value
                self._cond.notify_all()
                return {"ok": True}
            if op == "get":
                keys, timeout = req.get("keys"), parse_wait(req)
                if not (isinstance(keys, list) and 0 < len(keys) <= MAX_KEYS
                        and all(isinstance(k, str) for k in keys)):
                    raise BadRequest(f"get needs keys: a list of 1..{MAX_KEYS} strings")
                self._cond.wait_for(lambda: self._aborted or all(k in self._data for k in keys),
                                    timeout=timeout)
                if self._aborted:
                    return {"ok": False, "aborted": {str(r): m for r, m in self._aborted.items()}}
                missing = [k for k in keys if k not in self._data]
                if missing:
                    if not req.get("poll"):       # (a poll asks again: it gave up nothing)
                        self._gave_up.add(rank)
                    return {"ok": False, "missing": missing}
                return {"ok": True, "values": {k: self._data[k] for k in keys}}
            if op == "abort":
                self._aborted.setdefault(rank, str(req.get("reason"))[:1000])
                self._cond.notify_all()
                return {"ok": True}
            if op == "notice":
                epoch = req.get("epoch")
                if isinstance(epoch, bool) or not isinstance(epoch, int) \
                        or not 0 < epoch <= MAX_NOTICES:
                    raise BadRequest(f"a notice's epoch is a number in 1..{MAX_NOTICES}, not "
                                     f"{epoch!r}")
                reason = self._notices.setdefault(epoch, str(req.get("reason"))[:1000])
                self._cond.notify_all()
                return {"ok": True, "reason": reason}
            if op == "watch":
                timeout, seen = parse_wait(req), req.get("notice", 0)
                if isinstance(seen, bool) or not isinstance(seen, int):
                    raise BadRequest(f"watch: notice must be the epoch last seen, not {seen!r}")
                self._watching.add(rank)
                self._check_silence()
                self._cond.wait_for(lambda: bool(self._aborted) or self._newest() > seen,
                                    timeout=timeout)
                self._watching.discard(rank)
                self._seen[rank] = time.monotonic()
                reply = {"ok": True, "failed": {str(r): m for r, m in self._aborted.items()}}
                newest = self._newest()
                if newest > seen:
                    reply["notice"] = [newest, self._notices[newest]]
                return reply
            if op == "leave":
                timeout = parse_wait(req)
                self._left.add(rank)
                self._cond.notify_all()
                self._cond.wait_for(lambda: len(self._left) == self.world_size,
                                    timeout=timeout)
                if len(self._left) == self.world_size:
                    self._stop_accepting()
                return {"ok": True, "missing": sorted(set(range(self.world_size)) - self._left)}
        raise BadRequest(f"unknown request {str(op)[:40]!r}")


    def _newest(self) -> int:
        """The highest notice epoch published (0: none; caller holds the condition)."""
        return max(self._notices, default=0)
