"""Rendezvous, the ranks' side: each rank's handle on the store rank 0 serves
(`ring_setup.store_server`; the wire protocol: `ring_setup.store_protocol`).

Every rank (rank 0 included) is a client. Ranks publish JSON values under "<name>/<rank>"
and wait for everyone's; a wait that runs out names the ranks that never showed up. The
store stays up after setup for small control exchanges and for liveness; the data path
never uses it.

Liveness (separate from progress): once joined, every rank keeps a watch connection
(`Rendezvous.watch()`), a long poll the store answers at once when some rank failed, else
after `WATCH_INTERVAL`. The store marks rank r failed when r aborts (`abort`: its
communicator failed; any thread may call it), when a connection of r closes before every
rank has left, or when r's watch has been silent for `SILENCE_TIMEOUT`. Every rank's watch
then learns it within a round trip (`Rendezvous.check_peers()` raises `PeerFailed` naming
the ranks); a watch that loses the store itself reports rank 0, whose process serves it.

Notices (not failures): any rank may publish a notice of epoch e (`Rendezvous.notice`: the
switch stopped aggregating, netreduce/away.py). The store keeps the first reason per
epoch; every watch is answered at once when an epoch above the one it last saw exists,
so every rank learns the highest epoch within a round trip (`notice_epoch`, `notices`,
and `on_notice` callbacks on the watch thread). A notice breaks nothing: what it asks
for is agreed with keys of its own (`gather`).

Who may talk to the store: only the job's ranks, each as itself. Rank 0 holds the job's
secret (NR_JOB_SECRET, which `netreduce launch` sets to a fresh random value per run), every
other rank its own key derived from it (NR_RANK_KEY, which launch hands it; or derived here
from NR_JOB_SECRET when a rank has that, as under torchrun; under torch, rank 0 passes the
secret through torch's store with the store's port). A rank checks the store's proof too,
so it never believes a process that merely took the port, and every later line each way
carries its MAC (`ring_setup.store_protocol`).
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ring_setup.store_protocol import (DEFAULT_PORT, DEFAULT_TIMEOUT, HELLO_TIMEOUT,
                                       MAX_HELLO, MAX_REPLY, MAX_WAIT, MIN_SECRET,
                                       RANK_KEY_ENV, SECRET_ENV, SILENCE_TIMEOUT,
                                       WATCH_INTERVAL, BadRequest, LineSocket, PeerFailed,
                                       RendezvousError, RendezvousTimeout, Session,
                                       UntrustedStore, decode_request, mac, new_secret,
                                       rank_key, ranks_phrase, session_key, unwrap)
from ring_setup.store_server import StoreServer

_MARGIN = 30.0           # extra socket timeout over a server-side wait

PortExchange = Callable[["tuple[int, str] | None"], "tuple[int, str]"]


@dataclass(frozen=True)
class RendezvousConfig:
    """Who this rank is and where the store is. Invariant: 0 <= rank < world_size."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int = DEFAULT_PORT
    timeout: float = DEFAULT_TIMEOUT
    secret: bytes = b""      # the job's secret (rank 0 needs it; empty: not known yet, see
    #                          Rendezvous.join, or not given to this rank: `key`)
    key: bytes = b""         # this rank's own key (empty: derived from `secret`)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise RendezvousError(f"rendezvous: rank {self.rank} outside world size "
                                  f"{self.world_size}")
        if not self.timeout > 0:
            raise RendezvousError(f"rendezvous: timeout {self.timeout} must be > 0 s")

    @property
    def where(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @property
    def credential(self) -> bytes:
        """What this rank proves itself with: its own key, given or derived from the job's
        secret (b"": neither is known)."""
        if self.key:
            return self.key
        return rank_key(self.secret, self.rank) if len(self.secret) >= MIN_SECRET else b""

    @classmethod
    def resolve(cls, rank: int | None = None, world_size: int | None = None,
                master_addr: str | None = None, master_port: int | None = None,
                timeout: float = DEFAULT_TIMEOUT,
                env: Mapping[str, str] = os.environ) -> "RendezvousConfig":
        """Explicit arguments win; the rest come from RANK, WORLD_SIZE, MASTER_ADDR and
        MASTER_PORT (default 29500), as torchrun and netreduce.tools.launch set them, the
        job's secret from NR_JOB_SECRET and this rank's own key from NR_RANK_KEY (netreduce
        launch gives rank 0 the one, every other rank the other)."""
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
            key = bytes.fromhex(env.get(RANK_KEY_ENV, ""))
        except ValueError:
            key = b"?"
        if key and len(key) != 32:
            raise RendezvousError(f"rendezvous: {RANK_KEY_ENV} must be 64 hex digits (the key "
                                  f"netreduce launch derives for the rank)")
        try:
            return cls(rank=int(pick(rank, "RANK")), world_size=int(pick(world_size, "WORLD_SIZE")),
                       master_addr=str(pick(master_addr, "MASTER_ADDR")),
                       master_port=int(pick(master_port, "MASTER_PORT", DEFAULT_PORT)),
                       timeout=float(timeout), secret=secret.encode(), key=key)
        except ValueError as exc:
            raise RendezvousError(f"rendezvous: bad setting: {exc}") from exc


class StoreClient:
    """One connection to the store."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self._sock = sock
        self._line = LineSocket(sock)
        self._where = where
        self.job_key = b""       # the job's key the store handed (see `job_key`)

    @classmethod
    def connect(cls, config: RendezvousConfig) -> "StoreClient":
        """Connect and prove this rank's key, retrying until the store is up or
        `config.timeout` passes."""
        if not config.credential:
            raise RendezvousError(f"rendezvous: rank {config.rank}: no job secret: "
                                  f"{SECRET_ENV} is not set, nor {RANK_KEY_ENV} (netreduce "
                                  "launch sets them; under torchrun, export the same random "
                                  f"value of at least {MIN_SECRET} characters as {SECRET_ENV} "
                                  "on every rank)")
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
            if not reply.get("ok"):
                client.close()
                raise RendezvousError(f"rendezvous: rank {config.rank}: the store at "
                                      f"{config.where} refused it: {reply.get('error')}")
            return client
        raise RendezvousTimeout(f"rendezvous: rank 0 never joined within {config.timeout:g}s "
                                f"(no store at {config.where}: {last})")

    def _hello(self, config: RendezvousConfig) -> dict[str, Any]:
        """Answer the store's challenge (all within HELLO_TIMEOUT); check that the store
        holds the secret too; from then on every line each way is behind its MAC."""
        deadline = time.monotonic() + HELLO_TIMEOUT
        try:
            line = self._line.read_line(MAX_HELLO, deadline)
        except OSError as exc:
            raise RendezvousError(f"rendezvous: no challenge from {self._where}: {exc}") from exc
        try:
            challenge = str(decode_request(line)["challenge"])
        except (BadRequest, KeyError):
            raise RendezvousError(f"rendezvous: {self._where} sent no challenge (not a "
                                  "netreduce store, or one shutting down)") from None
        key, mine = config.credential, secrets.token_hex(16)
        reply = self._exchange({"op": "hello", "rank": config.rank,
                                "world_size": config.world_size, "nonce": mine,
                                "mac": mac(key, "hello", challenge, mine, config.rank,
                                           config.world_size)},
                               deadline, MAX_HELLO)
        if not reply.get("ok"):
            return reply
        session = session_key(key, challenge, mine)
        try:
            if not hmac.compare_digest(str(reply.get("mac")), mac(key, "store", mine, challenge,
                                                                  reply.get("job_key"))):
                raise ValueError("no proof")
            self.job_key = unwrap(str(reply["job_key"]), session)
        except ValueError:
            raise UntrustedStore(f"rendezvous: the store at {self._where} does not know "
                                 f"this job's secret ({SECRET_ENV}): not our rank 0") from None
        self._line.session = Session(session, "rank")
        return reply

    def request(self, req: dict[str, Any], wait: float,
                margin: float = _MARGIN) -> dict[str, Any]:
        """Send one request; `wait` is how long the server may hold it, `margin` how much
        longer the answer may take before the store counts as lost."""
        return self._exchange(req, time.monotonic() + wait + margin, MAX_REPLY)

    def _exchange(self, req: dict[str, Any], deadline: float, limit: int) -> dict[str, Any]:
        """Send `req`; its answer (at most `limit` bytes) by `deadline`."""
        try:
            self._line.write_line(json.dumps(req).encode(), deadline)
            line = self._line.read_line(limit, deadline)
        except OSError as exc:
            raise RendezvousError(f"rendezvous: lost the store at {self._where}: {exc}") from exc
        if not line:
            raise RendezvousError(f"rendezvous: the store at {self._where} closed the connection")
        try:
            return decode_request(line)
        except BadRequest as exc:
            raise RendezvousError(f"rendezvous: a bad answer from the store at {self._where}: "
                                  f"{exc}") from None

    def interrupt(self) -> None:
        """Make a request in progress (in another thread) fail at once."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
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
        self.job_key = b""     # once joined: the job's key, alike on every rank and known to
        #                        no one outside the job (store_protocol.job_key)

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
        what `port_exchange(None)` returns. Without, MASTER_PORT and NR_JOB_SECRET (rank 0)
        or this rank's key (NR_RANK_KEY, or derived from NR_JOB_SECRET)."""
        if self.rank == 0:
            if port_exchange is not None and not self.config.secret:
                self.config = replace(self.config, secret=new_secret().encode())
            if len(self.config.secret) < MIN_SECRET:
                raise RendezvousError(f"rendezvous: rank 0: no job secret: {SECRET_ENV} is "
                                      "not set: rank 0 serves the store and needs it (netreduce "
                                      "launch sets it; under torchrun, export the same random "
                                      f"value of at least {MIN_SECRET} characters on every rank)")
            self._server = StoreServer(0 if port_exchange else self.config.master_port,
                                       self.world_size, self.config.master_addr,
                                       self.config.secret)
        try:
            if port_exchange is not None:
                port, secret = port_exchange(
                    (self._server.port, self.config.secret.decode()) if self._server else None)
                self.config = replace(self.config, master_port=port, secret=secret.encode(),
                                      key=b"")
            self._client = StoreClient.connect(self.config)
            self.job_key = self._client.job_key
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

    def peers_alive(self) -> bool:
        """False from the moment this rank learned of a failure (as `check_peers`)."""
        return not self._failed.is_set()

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
