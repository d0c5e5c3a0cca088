"""Connections to the rendezvous store (ring_setup/store_server.py `Admission`) under a
flood: the whole hello has a deadline, connections waiting to prove a key are bounded per
address and in all (a newcomer pushes out the oldest of its address), proven ones per rank;
a client without the secret holding connections open (issue 39's slow loris) keeps neither
the ranks from joining nor their aborts and notices from reaching the store."""
from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import Any

import pytest

import ring_setup.rendezvous as rendezvous
import ring_setup.store_server as store_server
from ring_setup.rendezvous import Rendezvous, StoreClient
from ring_setup.store_server import StoreServer
from tests.rawstore import WORLD, Raw, cfg, in_ranks
from tests.rawstore import store  # noqa: F401 - the fixture, used by name


def test_a_silent_connection_is_told_and_cut(store: StoreServer,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_server, "HELLO_TIMEOUT", 0.3)
    silent = socket.create_connection(("127.0.0.1", store.port), timeout=5)
    silent.recv(200)                                  # the challenge
    time.sleep(0.6)
    assert silent.recv(200) == b'{"ok": false, "error": "no hello within 0.3s"}\n'
    assert silent.recv(200) == b""                    # and closed
    assert store.refused_connections == 1


def test_surplus_connections_of_one_address_push_out_its_oldest(store: StoreServer) -> None:
    def connect() -> socket.socket:
        s = socket.socket()
        s.bind(("127.0.0.3", 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", store.port))
        assert s.recv(200).startswith(b'{"challenge": ')
        return s
    idle = [connect() for _ in range(store_server.PENDING_PER_PEER)]
    newest = connect()
    assert idle[0].recv(200) == b""                   # the oldest is cut
    assert store.refused_connections == 1
    for s in idle[1:]:                                 # the others still wait
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(200)
    for s in idle + [newest]:
        s.close()


def test_a_rank_holds_a_bounded_number_of_connections(store: StoreServer) -> None:
    mine = [Raw(store) for _ in range(store_server.RANK_CONNECTIONS + 1)]
    for c in mine[:-1]:
        assert c.hello(1)["ok"] is True  # type: ignore[index]
    assert mine[-1].hello(1) == {"ok": False, "error": f"rank 1 has "
                                 f"{store_server.RANK_CONNECTIONS} connections open already"}
    other = Raw(store)
    assert other.hello(0)["ok"] is True  # type: ignore[index]
    mine[0].close()
    time.sleep(0.2)
    again = Raw(store)
    assert again.hello(1)["ok"] is True  # type: ignore[index]


def dribble(sock: socket.socket, within: float, every: float = 0.1) -> float | None:
    """Send a hello one byte per `every` s (never its end) for up to `within` s: the time
    after which the store hung up, or None if it still listened."""
    t0 = time.monotonic()
    payload = b'{"op": "hello", "rank": 0, "world_size": 2, "nonce": "n1", "mac": "' + b"0" * 4096
    for byte in payload:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return time.monotonic() - t0
        readable, _, _ = select.select([sock], [], [], every)
        if readable:                    # an answer (an error), the end or a reset
            return time.monotonic() - t0
        if time.monotonic() - t0 > within:
            return None
    return None


def test_a_hello_dribbled_a_byte_at_a_time_is_cut_at_its_deadline(
        store: StoreServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The slow loris of issue 39: one byte before each per-recv timeout kept a connection
    (and its slot) forever; the deadline is for the whole hello."""
    monkeypatch.setattr(store_server, "HELLO_TIMEOUT", 0.5)
    sock = socket.create_connection(("127.0.0.1", store.port), timeout=5)
    sock.recv(200)                                            # the challenge
    took = dribble(sock, within=3.0)
    sock.close()
    assert took is not None and 0.3 < took < 1.5, took


class Flooder:
    """A client without the secret that keeps `count` connections to the store open from
    `source` (an address of its own), dribbling a hello into each (one byte per 0.2 s) and
    opening a new one whenever the store cuts one: what one host of an attacker can do."""

    def __init__(self, server: StoreServer, source: str, count: int) -> None:
        self.port, self.source, self.count = server.port, source, count
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Flooder":
        self._thread.start()
        deadline = time.monotonic() + 5
        while self.opened < self.count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)                 # the store has taken them all in
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _open(self) -> socket.socket | None:
        try:
            s = socket.socket()
            s.bind((self.source, 0))
            s.settimeout(1)
            s.connect(("127.0.0.1", self.port))
            s.setblocking(False)
            self.opened += 1
            return s
        except OSError:
            return None

    def _run(self) -> None:
        socks: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                while len(socks) < self.count and not self._stop.is_set():
                    s = self._open()
                    if s is None:
                        break
                    socks.append(s)
                for s in list(socks):
                    try:
                        if s.recv(4096) == b"":          # (the challenge is drained)
                            raise OSError("closed")
                    except BlockingIOError:
                        pass
                    except OSError:
                        socks.remove(s)
                        s.close()
                        continue
                    with contextlib.suppress(OSError):
                        s.send(b" ")
                self._stop.wait(0.2)
        finally:
            for s in socks:
                s.close()


@pytest.mark.parametrize("source", ["127.0.0.2", "127.0.0.1"])
def test_a_flooder_cannot_keep_the_ranks_from_joining(store: StoreServer, source: str) -> None:
    """Issue 39: 4n+8 dribbling connections held every slot and a real rank got
    RendezvousTimeout. Now a flood from another address takes only that address's slots,
    and one from a rank's own address is the oldest there, the first cut for a newcomer."""
    def rank(r: int) -> Any:
        me = Rendezvous(cfg(store, r, timeout=3.0))
        try:
            me._client = StoreClient.connect(me.config)
            return me.all_gather("endpoint", r)
        finally:
            me.close(timeout=3)
    with Flooder(store, source, 40):
        got = in_ranks(rank)
    assert got == {0: [0, 1], 1: [0, 1]}, got


def test_a_flooder_cannot_keep_an_abort_or_a_notice_from_the_ranks(
        store: StoreServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mid-job, the ranks' abort and notice open connections of their own: a flood that
    started after they joined must not refuse them."""
    monkeypatch.setattr(rendezvous, "SILENCE_TIMEOUT", 3.0)     # how long a notice tries
    ranks = [Rendezvous(cfg(store, r)) for r in range(WORLD)]
    for me in ranks:
        me._client = StoreClient.connect(me.config)
        me.watch()
    try:
        with Flooder(store, "127.0.0.2", 40):
            ranks[1].notice(1, "the switch went away")
            deadline = time.monotonic() + 5
            while ranks[0].notice_epoch < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ranks[0].notices == {1: "the switch went away"}
            ranks[1].abort("CompletionError: RETRY_EXC_ERR")
            while ranks[0].peers_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert store._aborted == {1: "CompletionError: RETRY_EXC_ERR"}
            assert not ranks[0].peers_alive()
    finally:
        for me in ranks:
            threading.Thread(target=me.close, args=(1,)).start()


def test_the_bound_on_all_waiting_connections_cuts_the_busiest_address_first() -> None:
    """Many addresses at once (Admission alone: connections are plain tokens here)."""
    adm = store_server.Admission(world_size=2)
    assert (adm.per_peer, adm.in_all) == (16, 4 * 16 + 2 * 2)
    conns = [object() for _ in range(68)]
    for i, c in enumerate(conns):                  # 14, 14, 14, 13, 13 from 5 addresses
        assert adm.arrive(c, f"10.0.{i % 5}.1") is None  # type: ignore[arg-type]
    assert adm.arrive(object(), "10.9.9.9") is conns[0]  # type: ignore[arg-type]
    assert adm.refused == 1
    lone = store_server.Admission(world_size=0)    # 64 addresses with one each
    first = [object() for _ in range(64)]
    for i, c in enumerate(first):
        lone.arrive(c, f"10.1.0.{i}")  # type: ignore[arg-type]
    newcomer = object()
    assert lone.arrive(newcomer, "10.1.0.0") is first[0]  # type: ignore[arg-type]
    assert lone.admit(newcomer, 0) is None  # type: ignore[arg-type]
