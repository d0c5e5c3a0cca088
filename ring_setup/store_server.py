"""The rendezvous store: a small TCP key-value store that rank 0 serves from daemon threads
at MASTER_ADDR:MASTER_PORT, torchrun style (the wire protocol: `ring_setup.store_protocol`;
the ranks' side: `ring_setup.rendezvous`).

Who may talk to the store: only the job's ranks. A connection proves a rank's key (derived
from the job's secret: it proves that rank only) before anything else (the hello), and the
store proves it back; then every line each way carries its MAC, and a line that fails it
closes the connection (the rank counts as failed). A connection that fails its hello,
or has not finished its hello HELLO_TIMEOUT after it was accepted, is closed having changed
nothing. The store listens on MASTER_ADDR only; it bounds the connections waiting to prove
the secret per address and in all, and those of each rank (`Admission`), lines (MAX_LINE),
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
from collections import Counter
from typing import Any

from ring_setup.store_protocol import (HELLO_TIMEOUT, MAX_HELLO, MAX_KEYS, MAX_LINE,
                                       MAX_STORED, MIN_SECRET, RANK_KEY_ENV, SECRET_ENV,
                                       SILENCE_TIMEOUT, BadRequest, Forged, LineSocket,
                                       RendezvousError, Session, decode_request, job_key,
                                       key_rank, mac, parse_wait, rank_key, session_key, wrap)

MAX_NOTICES = 1 << 20    # notice epochs
PENDING_PER_PEER = 16    # connections of one address waiting to prove the secret
RANK_CONNECTIONS = 8     # connections that proved one rank (a rank keeps 2, and briefly
#                          one per abort and notice)
_REFUSAL_SEND = 1.0      # s to send a refused hello its answer
MAX_REASON = 1000        # characters of an abort's or a notice's reason
_ENTRY = 64              # bytes counted for each entry besides its key and value (JSON)


class Admission:
    """Who holds the store's connections (the server's condition guards it). Invariants: at
    most `per_peer` connections from one address and `in_all` in all are waiting to prove a
    rank's key; at most RANK_CONNECTIONS proved each rank. A new connection over a waiting
    bound makes room by cutting the oldest waiting one of its own address (else of the
    address with most waiting): a peer that keeps connections open only pushes out its own,
    and a rank's hello, answered within a round trip, is the newest of its address."""

    def __init__(self, world_size: int) -> None:
        self.per_peer = PENDING_PER_PEER
        self.in_all = 4 * PENDING_PER_PEER + 2 * world_size
        self.refused = 0                        # cut, or failed its hello; once each
        self._waiting: dict[socket.socket, str] = {}   # -> its address; oldest first
        self._per_address: Counter[str] = Counter()    # waiting connections per address
        self._ranks: Counter[int] = Counter()          # connections that proved each rank

    def arrive(self, conn: socket.socket, addr: str) -> socket.socket | None:
        """Count `conn` (from `addr`) as waiting; the connection it pushes out (to be shut
        down), if any."""
        crowded = None
        if self._per_address[addr] >= self.per_peer:
            crowded = addr
        elif len(self._waiting) >= self.in_all:
            crowded = self._per_address.most_common(1)[0][0]
        victim = None
        if crowded is not None:
            victim = next(c for c, a in self._waiting.items() if a == crowded)
            self.refuse(victim)
        self._waiting[conn] = addr
        self._per_address[addr] += 1
        return victim

    def refuse(self, conn: socket.socket) -> None:
        """`conn` will not be served (cut, or its hello failed)."""
        if self._unwait(conn):
            self.refused += 1

    def waiting(self, conn: socket.socket) -> bool:
        """`conn` waits to prove a rank's key (it was not cut to make room)."""
        return conn in self._waiting

    def admit(self, conn: socket.socket, rank: int) -> str | None:
        """`conn`, waiting, proved `rank`: None if it is served from now on, else why not."""
        if self._ranks[rank] >= RANK_CONNECTIONS:
            self.refuse(conn)
            return f"rank {rank} has {RANK_CONNECTIONS} connections open already"
        self._unwait(conn)
        self._ranks[rank] += 1
        return None

    def close(self, conn: socket.socket, rank: int | None) -> None:
        """`conn` closed: its place is free."""
        if rank is None:
            self.refuse(conn)
        else:
            self._ranks[rank] -= 1

    def _unwait(self, conn: socket.socket) -> bool:
        """Take `conn` off the waiting list: True if it was on it."""
        addr = self._waiting.pop(conn, None)
        if addr is None:
            return False
        self._per_address[addr] -= 1
        if not self._per_address[addr]:
            del self._per_address[addr]
        return True


class StoreServer:
    """The store (rank 0): a dict guarded by one condition, one thread per client (see the
    module doc for who may connect and the bounds).

    Invariants: a request reaches `_handle` only on a connection that proved the secret, as
    the rank it proved; a refused request changes nothing; the connections are bounded as
    `Admission` says, the stored bytes by MAX_STORED."""

    def __init__(self, port: int, world_size: int, host: str, secret: bytes) -> None:
        if len(secret) < MIN_SECRET:
            raise RendezvousError("rendezvous: the store needs the job's secret "
                                  f"({SECRET_ENV}, at least {MIN_SECRET} characters)")
        self.world_size = world_size
        self._secret = secret
        self._job_key = job_key(secret)
        self.admission = Admission(world_size)
        self._stored = 0                        # bytes counted (`_charge`), every entry
        self._cond = threading.Condition()
        self._data: dict[str, Any] = {}
        self._sizes: dict[str, int] = {}        # key -> what `_charge` counted for it
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

    @property
    def refused_connections(self) -> int:
        """Connections closed without being served: cut to make room, or a failed hello."""
        return self.admission.refused

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, (addr, _) = self._listener.accept()
            except OSError:
                break
            with self._cond:
                self._conns.add(conn)
                victim = self.admission.arrive(conn, addr)
            if victim is not None:
                _cut(victim)
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
                _cut(conn)
        self._acceptor.join(timeout=grace)

    def _serve(self, conn: socket.socket) -> None:
        rank: int | None = None          # whose connection this is, once it proved the secret
        notifier = False                 # a connection that published a notice: its close
        #                                  is the end of that request, not of its rank
        forged = False                   # closed for a line that failed its MAC
        line = LineSocket(conn)
        try:
            with conn:
                rank = self._greet(line)
                if rank is None:
                    return
                while True:
                    try:
                        req = decode_request(line.read_line(MAX_LINE))
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
                    line.write_line(json.dumps(reply).encode())
        except Forged:
            forged = True
        except (OSError, BadRequest):
            pass
        finally:
            with self._cond:
                self._conns.discard(conn)
                self.admission.close(conn, rank)
                if rank is not None and (forged or not notifier):
                    self._connection_closed(rank, forged)
                self._cond.notify_all()

    def _greet(self, line: LineSocket) -> int | None:
        """The hello, within HELLO_TIMEOUT in all: the rank the connection proved and is
        admitted as, or None (it was answered why not)."""
        deadline = time.monotonic() + HELLO_TIMEOUT
        nonce = secrets.token_hex(16)
        line.write_line(json.dumps({"challenge": nonce}).encode(), deadline)
        session = b""
        try:
            reply, rank, session = self._hello(
                decode_request(line.read_line(MAX_HELLO, deadline)), nonce)
        except TimeoutError:
            reply, rank = {"ok": False, "error": f"no hello within {HELLO_TIMEOUT:g}s"}, None
        except (BadRequest, OSError) as exc:
            reply, rank = {"ok": False, "error": str(exc)}, None
        with self._cond:
            if not self.admission.waiting(line.sock):
                return None             # cut to make room: shut down, the rank tries again
            if rank is None:
                self.admission.refuse(line.sock)
            else:
                why = self.admission.admit(line.sock, rank)
                if why is not None:
                    rank, reply = None, {"ok": False, "error": why}
        # a refusal may be sent a little past the deadline (it says why); an admitted rank's
        # answer is not cut short (its loss would fail the rank)
        line.write_line(json.dumps(reply).encode(),
                        time.monotonic() + _REFUSAL_SEND if rank is None else None)
        if rank is not None:
            line.session = Session(session, "store")
        return rank

    def _connection_closed(self, rank: int, forged: bool) -> None:
        """A connection of `rank` closed (caller holds the condition; `forged`: by the store,
        for a line that failed its MAC): a failure unless every rank has left, or some
        failure is known already (the ranks that learn of it exit: consequences, not
        culprits)."""
        if len(self._left) == self.world_size or self._aborted or rank in self._gave_up:
            return          # (a rank that gave up waiting for others is not their culprit)
        if forged:
            why = ("a line on its connection to the store failed its MAC (altered, injected "
                   "or replayed on the way): the store closed it")
        elif rank in self._left:
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

    def _hello(self, req: dict[str, Any], nonce: str
               ) -> tuple[dict[str, Any], int | None, bytes]:
        """The first request of a connection: (reply, the rank it proved or None, the
        connection's session key)."""
        if req.get("op") != "hello":
            return {"ok": False, "error": "the first request must be hello"}, None, b""
        rank, world_size = req.get("rank"), req.get("world_size")
        theirs, proof = req.get("nonce"), req.get("mac")
        if not (_integer(rank) and _integer(world_size) and isinstance(theirs, str)
                and isinstance(proof, str) and 0 < len(theirs) <= 64):
            return {"ok": False, "error": "hello needs rank and world_size (integers), nonce "
                    "and mac"}, None, b""
        key = rank_key(self._secret, rank)
        if not hmac.compare_digest(proof, mac(key, "hello", nonce, theirs, rank, world_size)):
            return {"ok": False, "error": f"not rank {rank}'s key: derived from another "
                    f"secret than this job's ({SECRET_ENV}), or another rank's "
                    f"({RANK_KEY_ENV})"}, None, b""
        if world_size != self.world_size:
            return {"ok": False, "error": f"rank {rank} has world size {world_size} but rank "
                    f"0 has {self.world_size}"}, None, b""
        if not 0 <= rank < self.world_size:
            return {"ok": False, "error": f"rank {rank!r} is not in 0..{self.world_size - 1}"
                    }, None, b""
        session = session_key(key, nonce, theirs)
        wrapped = wrap(self._job_key, session)
        return ({"ok": True, "mac": mac(key, "store", theirs, nonce, wrapped),
                 "job_key": wrapped}, rank, session)

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
                if req.get("exclusive") and key in self._data:
                    return {"ok": False, "error": f"{key!r} was published twice: two processes "
                            f"claim the same rank"}
                self._sizes[key] = self._charge(self._sizes.get(key, 0), key, value)
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
            if op == "abort":      # (counted, never refused: one per rank)
                if rank not in self._aborted:
                    self._aborted[rank] = str(req.get("reason"))[:MAX_REASON]
                    self._stored += _ENTRY + len(json.dumps(self._aborted[rank]))
                self._cond.notify_all()
                return {"ok": True}
            if op == "notice":
                epoch = req.get("epoch")
                if isinstance(epoch, bool) or not isinstance(epoch, int) \
                        or not 0 < epoch <= MAX_NOTICES:
                    raise BadRequest(f"a notice's epoch is a number in 1..{MAX_NOTICES}, not "
                                     f"{epoch!r}")
                if epoch not in self._notices:
                    reason = str(req.get("reason"))[:MAX_REASON]
                    self._charge(0, epoch, reason)
                    self._notices[epoch] = reason
                reason = self._notices[epoch]
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


    def _charge(self, old: int, key: object, value: Any) -> int:
        """Count an entry (`key`, `value`) in place of one of `old` bytes (0: a new entry);
        its size, or BadRequest (nothing counted) if the store would hold more than
        MAX_STORED bytes. Caller holds the condition."""
        size = _ENTRY + len(json.dumps(key)) + len(json.dumps(value))
        if self._stored - old + size > MAX_STORED:
            raise BadRequest(f"the store is full ({MAX_STORED} bytes)")
        self._stored += size - old
        return size

    def _newest(self) -> int:
        """The highest notice epoch published (0: none; caller holds the condition)."""
        return max(self._notices, default=0)


def _integer(value: object) -> bool:
    """`value` is a JSON integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _cut(conn: socket.socket) -> None:
    """End `conn` now: its thread's read returns and the thread closes it."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
