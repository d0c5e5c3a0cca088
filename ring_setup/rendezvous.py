"""Rendezvous: a small TCP key-value store served by rank 0, torchrun style.

Rank 0 serves the store from daemon threads at MASTER_ADDR:MASTER_PORT; every rank
(rank 0 included) is a client. Ranks publish JSON values under "<name>/<rank>" and wait
for everyone's; a wait that runs out names the ranks that never showed up. The store stays
up after setup for small control exchanges and for liveness; the data path never uses it.

Liveness (separate from progress): once joined, every rank keeps a watch connection
(`Rendezvous.watch()`), a long poll the store answers at once when some rank failed, else
after `WATCH_INTERVAL`. The store marks rank r failed, with the reason, when
- r aborts (`abort`: its communicator failed; any thread may call it),
- a connection of r closes before every rank has left: r's process died (the kernel closes
  its sockets at once, SIGKILL included), or r finalized alone,
- r's watch has been silent for `SILENCE_TIMEOUT` (its host hung or is unreachable).
Every rank's watch then learns it within a round trip (`Rendezvous.check_peers()` raises
`PeerFailed` naming the ranks); a watch that loses the store itself reports rank 0, whose
process serves it. A failure is final: the store keeps it until it stops.

Notices (not failures): any rank may publish a notice of epoch e (`Rendezvous.notice`: the
switch stopped aggregating, netreduce/comm.py). The store keeps the first reason per
epoch; every watch is answered at once when an epoch above the one it last saw exists,
so every rank learns the highest epoch within a round trip (`notice_epoch`, `notices`,
and `on_notice` callbacks on the watch thread). A notice breaks nothing: what it asks
for is agreed with keys of its own (`gather`).

Who may talk to the store: only the job's ranks. Every rank holds the job's secret
(NR_JOB_SECRET, which `netreduce launch` sets to a fresh random value per run; under torch,
rank 0 passes one through torch's store with the store's port). A connection proves it
before anything else, by an HMAC-SHA256 of a nonce the store sent, and the store proves it
back; a connection that fails (or says nothing for HELLO_TIMEOUT) is closed having changed
nothing. The store listens on MASTER_ADDR only, holds at most `max_connections`
connections, bounds lines (MAX_LINE), stored bytes (MAX_STORED) and every server-side wait
(MAX_WAIT); a rank may write only its own keys ("<name>/<rank>") and speak only for itself.
A malformed request gets an error naming what is wrong and changes nothing.

Wire protocol: one JSON object per line each way, one request at a time per connection.
  (store)                            -> challenge {nonce}
  hello {rank, world_size, nonce, mac} -> ok + mac | error, then closed (bad secret, rank
                                        out of range, world size disagreement)
  set   {key, value, exclusive}      -> ok | error (exclusive key already set, not ours)
  get   {keys, timeout, poll}        -> ok + values | missing keys | aborted ranks (poll:
                                        the rank will ask again, it did not give up)
  abort {rank, reason}               -> ok   (every pending and later get fails with it)
  notice {rank, epoch, reason}       -> ok   (the first reason of an epoch is kept)
  watch {rank, timeout, notice}      -> ok + failed ranks and reasons ({} when none within
                                        timeout) + the highest notice [epoch, reason] when
                                        above `notice` (the epoch last seen); marks the rank
                                        alive
  leave {rank, timeout}              -> ok + missing ranks; once all ranks have left the
                                        server stops accepting before it answers anyone, so a
                                        rank that quickly rejoins reaches the next store.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

DEFAULT_PORT = 29500
DEFAULT_TIMEOUT = 30.0
WATCH_INTERVAL = 1.0     # a watch request returns after this long when nothing failed
# A dead process is seen at once (its connections close); these two only bound how long a
# hung host or store goes unnoticed, so they are generous: in the TCG lab a busy rank's
# store thread can go several seconds without the GIL or a vCPU (a watch timing out at
# 6 s broke slow BMv2 calls).
SILENCE_TIMEOUT = 60.0   # a rank whose watch is silent this long is declared failed
_MARGIN = 30.0           # extra socket timeout over a server-side wait
SECRET_ENV = "NR_JOB_SECRET"
MIN_SECRET = 16          # characters of NR_JOB_SECRET
HELLO_TIMEOUT = 10.0     # s a new connection has to prove the secret
MAX_LINE = 1 << 20       # bytes of one request or reply line
MAX_STORED = 64 << 20    # bytes of keys and values the store holds
MAX_WAIT = 7200.0        # s: the longest server-side wait a request may ask for
MAX_KEYS = 4096          # keys of one get
MAX_NOTICES = 1 << 20    # notice epochs
_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,128}/(\d{1,6})")


PortExchange = Callable[["tuple[int, str] | None"], "tuple[int, str]"]


class RendezvousError(RuntimeError):
    """Setup could not agree with the other ranks."""


class RendezvousTimeout(RendezvousError):
    """Some rank never showed up; the message names it."""


class UntrustedStore(RendezvousError):
    """Whatever answers at MASTER_ADDR:MASTER_PORT could not prove the job's secret."""


class BadRequest(ValueError):
    """A request the store refuses; the message says what is wrong with it."""


def _mac(secret: bytes, *parts: object) -> str:
    return hmac.new(secret, "|".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def new_secret() -> str:
    """A fresh job secret (what `netreduce launch` puts in NR_JOB_SECRET)."""
    return secrets.token_hex(16)


class PeerFailed(RendezvousError):
    """Some rank died, went silent or aborted (`failures`: rank -> reason)."""

    def __init__(self, failures: Mapping[int, str]) -> None:
        self.failures = dict(sorted(failures.items()))
        super().__init__("; ".join(f"rank {r}: {why}" for r, why in self.failures.items()))

    @property
    def ranks(self) -> list[int]:
        return list(self.failures)


def ranks_phrase(ranks: list[int]) -> str:
    """"rank 3" or "ranks 0, 2": how every error message names ranks."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


@dataclass(frozen=True)
class RendezvousConfig:
    """Who this rank is and where the store is. Invariant: 0 <= rank < world_size."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int = DEFAULT_PORT
    timeout: float = DEFAULT_TIMEOUT
    secret: bytes = b""      # the job's secret (empty: not known yet, see Rendezvous.join)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise RendezvousError(f"rendezvous: rank {self.rank} outside world size "
                                  f"{self.world_size}")
        if not self.timeout > 0:
            raise RendezvousError(f"rendezvous: timeout {self.timeout} must be > 0 s")

    @property
    def where(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @classmethod
    def resolve(cls, rank: int | None = None, world_size: int | None = None,
                master_addr: str | None = None, master_port: int | None = None,
                timeout: float = DEFAULT_TIMEOUT,
                env: Mapping[str, str] = os.environ) -> "RendezvousConfig":
        """Explicit arguments win; the rest come from RANK, WORLD_SIZE, MASTER_ADDR and
        MASTER_PORT (default 29500), as torchrun and netreduce.tools.launch set them, and
        the job's secret from NR_JOB_SECRET (netreduce launch sets it)."""
        def pick(value: Any, var: str, default: Any = None) -> Any:
            if value is not None:
                return value
            if var in env:
                return env[var]
            if default is None:
                raise RendezvousError(f"rendezvous: {var} is not set: pass it explicitly or run "
                                      f"under netreduce.tools.launch / torchrun")
            return default
        secret = env.get(SECRET_ENV, "")
        if secret and len(secret) < MIN_SECRET:
            raise RendezvousError(f"rendezvous: {SECRET_ENV} must be at least {MIN_SECRET} "
                                  f"characters (e.g. python -c 'import secrets; "
                                  f"print(secrets.token_hex(16))')")
        try:
            return cls(rank=int(pick(rank, "RANK")), world_size=int(pick(world_size, "WORLD_SIZE")),
                       master_addr=str(pick(master_addr, "MASTER_ADDR")),
                       master_port=int(pick(master_port, "MASTER_PORT", DEFAULT_PORT)),
                       timeout=float(timeout), secret=secret.encode())
        except ValueError as exc:
            raise RendezvousError(f"rendezvous: bad setting: {exc}") from exc


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
                    reply, rank = self._hello(_read_request(reader), nonce)
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
                        req = _read_request(reader)
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
        theirs, mac = req.get("nonce"), req.get("mac")
        if not (isinstance(theirs, str) and isinstance(mac, str) and 0 < len(theirs) <= 64):
            return {"ok": False, "error": "hello needs nonce and mac"}, None
        if not hmac.compare_digest(mac, _mac(self._secret, "hello", nonce, theirs, rank,
                                             world_size)):
            return {"ok": False, "error": f"not this job's secret ({SECRET_ENV}): every rank "
                    "must have the same"}, None
        if world_size != self.world_size:
            return {"ok": False, "error": f"rank {rank} has world size {world_size} but rank "
                    f"0 has {self.world_size}"}, None
        if not (isinstance(rank, int) and 0 <= rank < self.world_size):
            return {"ok": False, "error": f"rank {rank!r} is not in 0..{self.world_size - 1}"}, None
        return {"ok": True, "mac": _mac(self._secret, "store", theirs, nonce)}, rank

    def _handle(self, req: dict[str, Any], rank: int) -> dict[str, Any]:
        """One request of `rank`'s connection; BadRequest (nothing changed) if malformed."""
        op = req.get("op")
        if "rank" in req and req["rank"] != rank:
            raise BadRequest(f"rank {rank}'s connection cannot speak for rank {req['rank']!r}")
        with self._cond:
            if op == "set":
                key, value = req.get("key"), req.get("value")
                m = _KEY.fullmatch(key) if isinstance(key, str) else None
                if m is None or int(m[1]) != rank:
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
                keys, timeout = req.get("keys"), _wait(req)
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
                timeout, seen = _wait(req), req.get("notice", 0)
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
                timeout = _wait(req)
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


def _read_request(reader: Any) -> dict[str, Any]:
    """The next request line as a JSON object; BadRequest("closed") at end of stream."""
    line = reader.readline(MAX_LINE + 1)
    if not line:
        raise BadRequest("closed")
    if len(line) > MAX_LINE:
        raise OSError(f"a line over {MAX_LINE} bytes")      # cannot resynchronise: close
    try:
        req = json.loads(line)
    except ValueError:
        raise BadRequest("not JSON") from None
    if not isinstance(req, dict):
        raise BadRequest("a request is a JSON object")
    return req


def _wait(req: dict[str, Any]) -> float:
    timeout = req.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 <= timeout <= MAX_WAIT:
        raise BadRequest(f"timeout must be a number of seconds in 0..{MAX_WAIT:g}, not "
                         f"{timeout!r}")
    return float(timeout)


class StoreClient:
    """One connection to the store."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._where = where

    @classmethod
    def connect(cls, config: RendezvousConfig) -> "StoreClient":
        """Connect and prove the job's secret, retrying until the store is up or
        `config.timeout` passes."""
        if len(config.secret) < MIN_SECRET:
            raise RendezvousError(f"rendezvous: rank {config.rank}: no job secret: "
                                  f"{SECRET_ENV} is not set (netreduce launch sets it; under "
                                  "torchrun, export the same random value of at least "
                                  f"{MIN_SECRET} characters on every rank)")
        deadline = time.monotonic() + config.timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection((config.master_addr, config.master_port),
                                                timeout=min(2.0, config.timeout))
            except OSError as exc:
                last = exc
                time.sleep(0.2)
                continue
            client = cls(sock, config.where)
            try:
                reply = client._hello(config)
            except UntrustedStore:
                client.close()
                raise
            except RendezvousError as exc:   # a store that was shutting down: try again
                client.close()
                last = exc
                time.sleep(0.2)
                continue
            if not reply["ok"]:
                client.close()
                raise RendezvousError(f"rendezvous: rank {config.rank}: the store at "
                                      f"{config.where} refused it: {reply['error']}")
            return client
        raise RendezvousTimeout(f"rendezvous: rank 0 never joined within {config.timeout:g}s "
                                f"(no store at {config.where}: {last})")

    def _hello(self, config: RendezvousConfig) -> dict[str, Any]:
        """Answer the store's challenge; check that the store holds the secret too."""
        self._sock.settimeout(HELLO_TIMEOUT)
        try:
            line = self._reader.readline(MAX_LINE)
        except OSError as exc:
            raise RendezvousError(f"rendezvous: no challenge from {self._where}: {exc}") from exc
        try:
            challenge = json.loads(line)["challenge"]
        except (ValueError, KeyError, TypeError):
            raise RendezvousError(f"rendezvous: {self._where} sent no challenge (not a "
                                  "netreduce store, or one shutting down)") from None
        mine = secrets.token_hex(16)
        reply = self.request({"op": "hello", "rank": config.rank,
                              "world_size": config.world_size, "nonce": mine,
                              "mac": _mac(config.secret, "hello", challenge, mine, config.rank,
                                          config.world_size)}, wait=0)
        if reply.get("ok") and not hmac.compare_digest(
                str(reply.get("mac")), _mac(config.secret, "store", mine, challenge)):
            raise UntrustedStore(f"rendezvous: the store at {self._where} does not know "
                                 f"this job's secret ({SECRET_ENV}): not our rank 0")
        return reply

    def request(self, req: dict[str, Any], wait: float,
                margin: float = _MARGIN) -> dict[str, Any]:
        """Send one request; `wait` is how long the server may hold it, `margin` how much
        longer the answer may take before the store counts as lost."""
        try:
            self._sock.settimeout(wait + margin)
            self._sock.sendall(json.dumps(req).encode() + b"\n")
            line = self._reader.readline()
        except OSError as exc:
            raise RendezvousError(f"rendezvous: lost the store at {self._where}: {exc}") from exc
        if not line:
            raise RendezvousError(f"rendezvous: the store at {self._where} closed the connection")
        return json.loads(line)

    def interrupt(self) -> None:
        """Make a request in progress (in another thread) fail at once."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


class Rendezvous:
    """This rank's handle on the store (and, on rank 0, the store itself).

    Invariant: once `watch()` ran, `check_peers()` raises `PeerFailed` from the moment this
    rank learned of a failure (its own `abort` included) until the end; `close()` stops
    the watch after this rank has left, so a rank that finalizes is never taken for dead."""

    def __init__(self, config: RendezvousConfig) -> None:
        self.config = config
        self._server: StoreServer | None = None
        self._client: StoreClient | None = None
        self._failures: dict[int, str] = {}
        self._failed = threading.Event()
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self._watch_client: StoreClient | None = None
        self.notices: dict[int, str] = {}     # notice epochs this rank learned -> reason
        self._notice_listeners: list[Callable[[int, str], None]] = []
        self._notice_lock = threading.Lock()
        self._published: set[str] = set()     # keys `gather` published

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def join(self, port_exchange: PortExchange | None = None) -> "Rendezvous":
        """Start the store (rank 0) and connect to it. With `port_exchange` (the store's
        port and the job's secret travel through another store, e.g. torch's on
        MASTER_PORT), rank 0 serves on a port the kernel picks, with its NR_JOB_SECRET or a
        fresh one, and hands both to `port_exchange((port, secret))`; the other ranks use
        what `port_exchange(None)` returns. Without, MASTER_PORT and NR_JOB_SECRET."""
        if self.rank == 0:
            if port_exchange is not None and not self.config.secret:
                self.config = replace(self.config, secret=new_secret().encode())
            if not self.config.secret:
                StoreClient.connect(self.config)       # raises: says what is missing
            self._server = StoreServer(0 if port_exchange else self.config.master_port,
                                       self.world_size, self.config.master_addr,
                                       self.config.secret)
        try:
            if port_exchange is not None:
                port, secret = port_exchange(
                    (self._server.port, self.config.secret.decode()) if self._server else None)
                self.config = replace(self.config, master_port=port, secret=secret.encode())
            self._client = StoreClient.connect(self.config)
        except BaseException:
            self._stop_server()
            raise
        return self

    def all_gather(self, name: str, value: Any, *, waiting_for: str = "joined") -> list[Any]:
        """Publish `value` as this rank's `name`; return every rank's, by rank.
        `waiting_for` completes the timeout message: "rank 2 never <waiting_for> within ..."."""
        client = self._connected()
        reply = client.request({"op": "set", "key": f"{name}/{self.rank}", "value": value,
                                "exclusive": True}, wait=0)
        if not reply["ok"]:
            raise RendezvousError(f"rendezvous: {reply['error']}")
        keys = [f"{name}/{r}" for r in range(self.world_size)]
        reply = client.request({"op": "get", "keys": keys, "timeout": self.config.timeout},
                               wait=self.config.timeout)
        if "aborted" in reply:
            raise RendezvousError("rendezvous: " + "; ".join(
                f"rank {r} failed during setup: {why}" for r, why in sorted(
                    reply["aborted"].items(), key=lambda kv: int(kv[0]))))
        if not reply["ok"]:
            missing = sorted(int(k.rsplit("/", 1)[1]) for k in reply["missing"])
            raise RendezvousTimeout(f"rendezvous: {ranks_phrase(missing)} never {waiting_for} "
                                    f"within {self.config.timeout:g}s (waiting at "
                                    f"{self.config.where})")
        return [reply["values"][k] for k in keys]

    def barrier(self, name: str) -> None:
        self.all_gather(name, True, waiting_for=f"reached {name!r}")

    def gather(self, name: str, value: Any, timeout: float, *, waiting_for: str,
               until: Callable[[], bool] | None = None) -> list[Any] | None:
        """`all_gather` after setup: every rank's `name`, by rank, waiting up to `timeout` s
        (RendezvousTimeout naming the missing ranks); a rank that failed meanwhile is
        `PeerFailed` naming it. With `until`, the wait is cut into WATCH_INTERVAL steps and
        returns None as soon as `until()` holds (gather the same name again later: the
        value is published once). The store may be out of reach for a while (its traffic
        crosses the switch): each request tolerates SILENCE_TIMEOUT of silence."""
        client = self._connected()
        key = f"{name}/{self.rank}"
        if key not in self._published:
            reply = client.request({"op": "set", "key": key, "value": value,
                                    "exclusive": True}, wait=0, margin=SILENCE_TIMEOUT)
            if not reply["ok"]:
                raise RendezvousError(f"rendezvous: {reply['error']}")
            self._published.add(key)
        keys = [f"{name}/{r}" for r in range(self.world_size)]
        end = time.monotonic() + timeout
        while True:
            left = min(max(0.0, end - time.monotonic()), MAX_WAIT)
            step = left if until is None else min(left, WATCH_INTERVAL)
            reply = client.request({"op": "get", "keys": keys, "timeout": step,
                                    "poll": step < left}, wait=step, margin=SILENCE_TIMEOUT)
            if reply.get("ok") or "aborted" in reply or step >= left:
                break
            if until is not None and until():
                return None
        if "aborted" in reply:
            failures = {int(r): why for r, why in reply["aborted"].items()}
            self._note(failures)
            raise PeerFailed(failures)
        if not reply["ok"]:
            missing = sorted(int(k.rsplit("/", 1)[1]) for k in reply["missing"])
            raise RendezvousTimeout(f"rendezvous: {ranks_phrase(missing)} never {waiting_for} "
                                    f"within {timeout:g}s (waiting at {self.config.where})")
        return [reply["values"][k] for k in keys]

    def notice(self, epoch: int, reason: str) -> None:
        """Publish notice `epoch` (see the module doc) over a connection of its own, from any
        thread; returns once the store holds it and this rank learned it with the reason
        the store keeps (the first published: alike on every rank), or could not be
        reached (RendezvousError)."""
        client = StoreClient.connect(replace(self.config, timeout=SILENCE_TIMEOUT))
        try:
            reply = client.request({"op": "notice", "rank": self.rank, "epoch": epoch,
                                    "reason": reason}, wait=0, margin=SILENCE_TIMEOUT)
        finally:
            client.close()
        if not reply.get("ok"):
            raise RendezvousError(f"rendezvous: the store refused a notice: {reply}")
        self._learn(epoch, str(reply["reason"]))

    @property
    def notice_epoch(self) -> int:
        """The highest notice epoch this rank knows of (0: none)."""
        return max(self.notices, default=0)

    def on_notice(self, listener: Callable[[int, str], None]) -> None:
        """Call `listener(epoch, reason)` for every notice epoch learned from now on above the
        highest known (on the watch thread, or the publishing thread: keep it short)."""
        self._notice_listeners.append(listener)

    def _learn(self, epoch: int, reason: str) -> None:
        with self._notice_lock:
            if epoch <= self.notice_epoch:
                return
            self.notices[epoch] = reason
        for listener in list(self._notice_listeners):
            listener(epoch, reason)

    def abort(self, reason: str) -> None:
        """Tell every rank that this rank failed (best effort, from any thread: over a
        connection of its own, so a wait in progress on this rank does not delay it)."""
        self._note({self.rank: reason})
        if self._client is None:
            return
        quick = replace(self.config, timeout=2.0)
        try:
            client = StoreClient.connect(quick)
            try:
                client.request({"op": "abort", "rank": self.rank, "reason": reason}, wait=0)
            finally:
                client.close()
        except RendezvousError:
            pass

    def watch(self) -> None:
        """Start watching the other ranks' liveness (a daemon thread, see the module doc)."""
        if self._watcher is None:
            client = self._watch_client = StoreClient.connect(self.config)
            self._watcher = threading.Thread(target=self._watch, args=(client,),
                                             name=f"nr-watch-{self.rank}", daemon=True)
            self._watcher.start()

    def _watch(self, client: StoreClient) -> None:
        """Ask until a failure is known, then keep the connection open (closing it would
        tell the store this rank died) until `close()`."""
        try:
            while not self._closing.is_set() and not self._failed.is_set():
                try:
                    # the store is lost after the silence it allows a rank: the store's
                    # own traffic crosses the switch, which a go-back-N storm can hold up
                    reply = client.request({"op": "watch", "rank": self.rank,
                                            "timeout": WATCH_INTERVAL,
                                            "notice": self.notice_epoch},
                                           wait=WATCH_INTERVAL, margin=SILENCE_TIMEOUT)
                except RendezvousError as exc:
                    if not self._closing.is_set():
                        self._note({0: f"the store it serves at {self.config.where} is gone "
                                       f"(rank 0's process died or its host is unreachable: "
                                       f"{exc})"})
                    break
                failed = {int(r): why for r, why in reply.get("failed", {}).items()}
                if failed:
                    self._note(failed)
                if "notice" in reply:
                    epoch, reason = reply["notice"]
                    self._learn(int(epoch), str(reason))
            self._closing.wait()
        finally:
            client.close()

    def _note(self, failures: Mapping[int, str]) -> None:
        for r, why in failures.items():
            self._failures.setdefault(r, why)
        self._failed.set()

    def check_peers(self) -> None:
        """Raise `PeerFailed` if some rank (this one included) is known to have failed."""
        if self._failed.is_set():
            raise PeerFailed(dict(self._failures))

    def close(self, timeout: float = 10.0) -> list[int]:
        """Leave: wait up to `timeout` s for every rank to leave too, then disconnect (rank 0
        stops the store). Returns the ranks that did not leave in time."""
        missing: list[int] = []
        if self._client is not None:
            try:
                missing = self._client.request({"op": "leave", "rank": self.rank,
                                                "timeout": timeout}, wait=timeout)["missing"]
            except RendezvousError:
                missing = []
            self._closing.set()
            self._client.close()
            self._client = None
        self._closing.set()
        if self._watch_client is not None:
            self._watch_client.interrupt()
        if self._watcher is not None:
            self._watcher.join(timeout=WATCH_INTERVAL + SILENCE_TIMEOUT)
            self._watcher = None
        self._stop_server()
        return missing

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _connected(self) -> StoreClient:
        if self._client is None:
            raise RendezvousError("rendezvous: not joined (call join() first) or already closed")
        return self._client
