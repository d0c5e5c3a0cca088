"""Hostile clients of the rendezvous store (ring_setup/store_server.py): without a rank's
key a connection changes and learns nothing; with it, a rank writes only its own keys and
speaks only for itself, and each of its lines carries a MAC; every malformed request is
refused by name and changes nothing; lines, JSON depth, waits and stored bytes are
bounded; a store without the secret is not believed. (Connections: test_store_flood.py.)"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Any

import pytest

import ring_setup.store_server as store_server
from ring_setup.rendezvous import Rendezvous, RendezvousConfig, StoreClient
from ring_setup.store_protocol import MAX_LINE, RendezvousError
from ring_setup.store_server import StoreServer
from tests.rawstore import SECRET, WORLD, Raw, cfg, hkdf, in_ranks, values
from tests.rawstore import store  # noqa: F401 - the fixture, used by name


def test_the_store_listens_on_the_job_address_only(store: StoreServer) -> None:
    assert store._listener.getsockname()[0] == "127.0.0.1"


def test_without_the_secret_nothing_is_set_nor_read(store: StoreServer) -> None:
    stray = Raw(store)
    assert stray.ask({"op": "set", "key": "endpoint/1", "value": "evil"}) == {
        "ok": False, "error": "the first request must be hello"}
    assert stray.ask({"op": "get", "keys": ["endpoint/0"], "timeout": 0}) is None   # closed
    wrong = Raw(store)
    reply = wrong.hello(1, secret=b"not-the-secret-of-this-job")
    assert reply is not None and reply["ok"] is False and "NR_JOB_SECRET" in reply["error"]
    assert wrong.ask({"op": "set", "key": "endpoint/1", "value": "evil"}) is None
    assert values(store) == {} and store._aborted == {}
    assert store.refused_connections == 2


def test_a_stray_client_cannot_redirect_rank_0(store: StoreServer) -> None:
    """The attack of the issue: set endpoint/1 before rank 1 does."""
    stray = Raw(store)
    stray.ask({"op": "set", "key": "endpoint/1", "value": {"qpn": 666}})

    def rank(r: int) -> Any:
        me = Rendezvous(cfg(store, r))
        me._client = StoreClient.connect(me.config)
        try:
            return me.all_gather("endpoint", {"qpn": 100 + r})
        finally:
            me.close(timeout=5)   # leave as ranks do (a bare disconnect fails a slower peer)
    assert in_ranks(rank) == {0: [{"qpn": 100}, {"qpn": 101}], 1: [{"qpn": 100}, {"qpn": 101}]}


def test_out_of_range_ranks_and_their_disconnects_fail_nobody(store: StoreServer) -> None:
    for bad, error in ((-1, "is not in 0..1"), (WORLD, "is not in 0..1"),
                       (10**9, "is not in 0..1"), ("1", "hello needs"), (None, "hello needs"),
                       (True, "hello needs")):
        c = Raw(store)
        reply = c.hello(bad)
        assert reply is not None and reply["ok"] is False and error in reply["error"], reply
        c.close()
    time.sleep(0.2)
    assert store._aborted == {}


def test_a_rank_writes_only_its_own_keys_and_speaks_only_for_itself(store: StoreServer) -> None:
    c = Raw(store)
    assert c.hello(1)["ok"] is True  # type: ignore[index]
    for key in ("endpoint/0", "endpoint/2", "endpoint", "a/b/1", "x" * 200 + "/1", 7):
        reply = c.ask({"op": "set", "key": key, "value": 1})
        assert reply and reply["ok"] is False and "may set only its own keys NAME/1" in reply["error"]
    for op in ("abort", "watch", "leave"):
        reply = c.ask({"op": op, "rank": 0, "reason": "x", "timeout": 0})
        assert reply == {"ok": False, "error": "rank 1's connection cannot speak for rank 0"}
    assert c.ask({"op": "set", "key": "endpoint/1", "value": 5}) == {"ok": True}
    assert values(store) == {"endpoint/1": 5} and store._aborted == {} and store._left == set()


@pytest.mark.parametrize("request_, error", [
    ({"op": "get", "keys": ["k/0"], "timeout": None}, "timeout must be a number of seconds"),
    ({"op": "get", "keys": ["k/0"], "timeout": 1e9}, "timeout must be a number of seconds"),
    ({"op": "get", "keys": ["k/0"], "timeout": -1}, "timeout must be a number of seconds"),
    ({"op": "get", "keys": ["k/0"], "timeout": True}, "timeout must be a number of seconds"),
    ({"op": "get", "keys": "k/0", "timeout": 0}, "get needs keys"),
    ({"op": "get", "keys": [], "timeout": 0}, "get needs keys"),
    ({"op": "watch", "timeout": "soon"}, "timeout must be a number of seconds"),
    ({"op": "leave"}, "timeout must be a number of seconds"),
    ({"op": "drop_tables"}, "unknown request 'drop_tables'"),
    ({}, "unknown request 'None'"),
    (b"[1, 2, 3]", "a request is a JSON object"),
    (b'"hello"', "a request is a JSON object"),
    (b"{not json", "not JSON"),
])
def test_malformed_requests_are_refused_by_name(store: StoreServer, request_: Any,
                                                error: str) -> None:
    c = Raw(store)
    assert c.hello(0)["ok"] is True  # type: ignore[index]
    reply = c.ask(request_)
    assert reply is not None and reply["ok"] is False and error in reply["error"], reply
    assert c.ask({"op": "set", "key": "still/0", "value": 1}) == {"ok": True}   # still served
    assert values(store) == {"still/0": 1} and store._left == set() and store._aborted == {}


def test_an_endless_line_closes_the_connection(store: StoreServer) -> None:
    c = Raw(store)
    assert c.hello(0)["ok"] is True  # type: ignore[index]
    assert c.ask(b"{" + b" " * MAX_LINE + b"}") is None   # hung up (an end or a reset)
    assert values(store) == {}


def test_a_rank_without_the_secret_is_told_what_to_set() -> None:
    me = Rendezvous(RendezvousConfig(0, 2, "127.0.0.1", 0, 1.0, b""))
    with pytest.raises(RendezvousError, match="NR_JOB_SECRET is not set"):
        me.join()


def test_a_store_that_does_not_know_the_secret_is_not_believed(store: StoreServer) -> None:
    with pytest.raises(RendezvousError, match="refused it: not rank 0's key"):
        StoreClient.connect(cfg(store, 0, secret=b"another-job-secret-0123456"))


def test_a_fake_store_is_detected_by_the_rank() -> None:
    """Someone else listening on the port and accepting any hello: its reply cannot carry
    the store's proof."""
    fake = socket.socket()
    fake.bind(("127.0.0.1", 0))
    fake.listen(1)
    port = fake.getsockname()[1]

    def serve() -> None:
        conn, _ = fake.accept()
        with conn, conn.makefile("rb") as r:
            conn.sendall(b'{"challenge": "c"}\n')
            r.readline()
            conn.sendall(b'{"ok": true, "mac": "00"}\n')
            time.sleep(0.5)
    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(RendezvousError, match="does not know this job's secret"):
        StoreClient.connect(RendezvousConfig(1, 2, "127.0.0.1", port, 3.0, SECRET))
    t.join(5)
    fake.close()


def test_overwrites_count_against_the_size_cap(store: StoreServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: a key counted only when created, its overwrites free (95 MiB held while
    566 B counted)."""
    monkeypatch.setattr(store_server, "MAX_STORED", 64 << 10)
    c = Raw(store)
    assert c.hello(1)["ok"] is True  # type: ignore[index]
    assert c.ask({"op": "set", "key": "a/1", "value": "x"}) == {"ok": True}
    assert c.ask({"op": "set", "key": "b/1", "value": "x"}) == {"ok": True}
    big = "y" * (40 << 10)
    assert c.ask({"op": "set", "key": "a/1", "value": big}) == {"ok": True}
    assert c.ask({"op": "set", "key": "b/1", "value": big}) == {
        "ok": False, "error": f"the store is full ({64 << 10} bytes)"}
    assert values(store) == {"a/1": big, "b/1": "x"}
    assert c.ask({"op": "set", "key": "a/1", "value": "z"}) == {"ok": True}   # frees it
    assert c.ask({"op": "set", "key": "b/1", "value": big}) == {"ok": True}


def test_notices_count_against_the_size_cap(store: StoreServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_server, "MAX_STORED", 64 << 10)
    c = Raw(store)
    assert c.hello(1)["ok"] is True  # type: ignore[index]
    replies = [c.ask({"op": "notice", "rank": 1, "epoch": e, "reason": "r" * 1000})
               for e in range(1, 101)]
    kept = [e for e, r in enumerate(replies, 1) if r and r["ok"]]
    # each notice holds at least its 1,000-character reason: at most 64 of them fit
    assert 0 < len(kept) <= 64 and kept == list(range(1, len(kept) + 1)), kept
    assert replies[-1] == {"ok": False, "error": f"the store is full ({64 << 10} bytes)"}
    assert sorted(store._notices) == kept


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Exceptions that escape any thread (the store's included) while the test runs."""
    seen: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def test_deep_json_before_the_hello_is_refused_by_name(store: StoreServer,
                                                       thread_errors: list[BaseException]) -> None:
    c = Raw(store)
    assert c.ask(b'{"op": "hello", "nonce": ' + b"[" * 40 + b"]" * 40 + b"}") == {
        "ok": False, "error": "JSON nested deeper than 32 levels"}
    c = Raw(store)            # (this one raised RecursionError in the store's thread)
    assert c.ask(b"[" * 1000 + b"]" * 1000) == {"ok": False, "error": "a line over 1024 bytes"}
    time.sleep(0.2)
    assert thread_errors == [] and store.refused_connections == 2


def test_deep_json_after_the_hello_is_refused_and_the_connection_served(
        store: StoreServer, thread_errors: list[BaseException]) -> None:
    c = Raw(store)
    assert c.hello(1)["ok"] is True  # type: ignore[index]
    line = b'{"op": "set", "key": "k/1", "value": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert c.ask(line) == {"ok": False, "error": "JSON nested deeper than 32 levels"}
    assert c.ask({"op": "set", "key": "k/1", "value": [[["fine"]]]}) == {"ok": True}
    assert thread_errors == [] and values(store) == {"k/1": [[["fine"]]]}


def test_a_long_line_before_the_hello_is_cut_at_its_bound(store: StoreServer) -> None:
    """An unproven peer may send a hello, not a megabyte."""
    c = Raw(store)
    reply = c.ask(b'{"op": "hello", "pad": "' + b"x" * 4096 + b'"}')
    assert reply == {"ok": False, "error": "a line over 1024 bytes"}, reply


@pytest.mark.parametrize("challenge, error", [
    (b"[" * 100000, "no challenge from .*: a line over 1024 bytes"),
    (b'{"challenge": ' + b"[" * 40 + b"]" * 40 + b"}", "sent no challenge"),
])
def test_a_fake_store_sending_deep_json_gets_a_clear_error(
        challenge: bytes, error: str, thread_errors: list[BaseException]) -> None:
    fake = socket.socket()
    fake.bind(("127.0.0.1", 0))
    fake.listen(8)
    fake.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                conn, _ = fake.accept()
                with conn:
                    conn.sendall(challenge + b"\n")
    t = threading.Thread(target=serve)
    t.start()
    try:
        with pytest.raises(RendezvousError, match=error):
            StoreClient.connect(RendezvousConfig(1, 2, "127.0.0.1", fake.getsockname()[1], 0.5,
                                                 SECRET))
    finally:
        done.set()
        t.join(5)
        fake.close()
    assert thread_errors == []


def test_a_rank_key_proves_its_own_rank_only(store: StoreServer) -> None:
    """Per-rank credentials (issue 39): rank 1's key, all `netreduce launch` hands rank 1,
    cannot claim rank 0."""
    key1 = hkdf(SECRET, "rank 1")
    c = Raw(store)
    reply = c.hello(0, key=key1)
    assert reply is not None and reply["ok"] is False and "not rank 0's key" in reply["error"]
    assert c.ask({"op": "set", "key": "endpoint/0", "value": "evil"}) is None    # closed
    mine = Raw(store)
    assert mine.hello(1, key=key1)["ok"] is True  # type: ignore[index]
    assert mine.ask({"op": "set", "key": "endpoint/1", "value": 1}) == {"ok": True}
    assert values(store) == {"endpoint/1": 1}


def test_ranks_holding_only_their_keys_join_and_agree_on_the_job_key(store: StoreServer) -> None:
    """What `netreduce launch` hands out: rank 0 the job's secret (it serves the store),
    every other rank only its own key; the job key (the inc ring's id tag) reaches all."""
    envs = [{"NR_JOB_SECRET": SECRET.decode()}] + [
        {"NR_RANK_KEY": hkdf(SECRET, f"rank {r}").hex()} for r in range(1, WORLD)]

    def rank(r: int) -> Any:
        config = RendezvousConfig.resolve(r, WORLD, "127.0.0.1", store.port, 5.0, env=envs[r])
        me = Rendezvous(config)
        me._client = StoreClient.connect(config)
        try:
            return me.all_gather("x", r), me._client.job_key
        finally:
            me.close(timeout=5)
    got = in_ranks(rank)
    assert got == {r: ([0, 1], hkdf(SECRET, "job key")) for r in range(WORLD)}, got


def test_a_request_without_its_mac_is_refused_and_changes_nothing(store: StoreServer) -> None:
    """Issue 39: only the hello was authenticated; a line injected into a rank's
    connection (here: sent without its MAC) was served as the rank's."""
    c = Raw(store)
    assert c.hello(1)["ok"] is True  # type: ignore[index]
    assert c.ask({"op": "set", "key": "endpoint/1", "value": "evil"}, sealed=False) is None
    time.sleep(0.2)
    assert values(store) == {}
    assert "failed its MAC" in store._aborted[1]


def test_a_replayed_request_is_refused(store: StoreServer) -> None:
    c = Raw(store)
    assert c.hello(1)["ok"] is True  # type: ignore[index]
    first = c.seal(json.dumps({"op": "set", "key": "k/1", "value": 1}).encode())
    c.sock.sendall(first + b"\n")
    c.reader.readline()
    c.received += 1
    assert c.ask({"op": "set", "key": "k/1", "value": 2}) == {"ok": True}
    c.sock.sendall(first + b"\n")                       # the first line again
    assert c.reader.readline() == b""                    # closed, not served
    other = Raw(store)                                   # nor on another connection
    assert other.hello(1)["ok"] is True  # type: ignore[index]
    other.sock.sendall(first + b"\n")
    assert other.reader.readline() == b""
    assert values(store) == {"k/1": 2}


class Tamperer:
    """A man in the middle between a rank and the store that changes one byte of the
    store's `nth` line (0: the challenge) and forwards the rest unchanged."""

    def __init__(self, server: StoreServer, nth: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.store_port, self.nth = server.port, nth
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        rank, _ = self.listener.accept()
        store = socket.create_connection(("127.0.0.1", self.store_port))
        threading.Thread(target=self._pipe, args=(rank, store, None), daemon=True).start()
        self._pipe(store, rank, self.nth)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, nth: int | None) -> None:
        with contextlib.suppress(OSError), src.makefile("rb") as lines:
            for i, line in enumerate(lines):
                if i == nth:
                    line = line.replace(b'"ok": true', b'"ok": 1')   # same length, other bytes
                dst.sendall(line)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def test_an_answer_altered_on_the_way_is_not_believed(store: StoreServer) -> None:
    mitm = Tamperer(store, nth=2)              # the answer to the first request
    client = StoreClient.connect(RendezvousConfig(1, WORLD, "127.0.0.1", mitm.port, 5.0, SECRET))
    with pytest.raises(RendezvousError, match="failed its MAC"):
        client.request({"op": "set", "key": "k/1", "value": 1}, wait=0)
    client.close()


def test_bad_or_misplaced_credentials_are_told_by_name() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    for bad in ("zz", "ab" * 31, "ab" * 33):
        with pytest.raises(RendezvousError, match="NR_RANK_KEY must be 64 hex digits"):
            RendezvousConfig.resolve(env={**env, "NR_RANK_KEY": bad})
    only_a_key = RendezvousConfig(0, 2, "127.0.0.1", 0, 1.0, key=hkdf(SECRET, "rank 0"))
    with pytest.raises(RendezvousError, match="NR_JOB_SECRET is not set: rank 0 serves the store"):
        Rendezvous(only_a_key).join()
    with pytest.raises(RendezvousError, match="NR_JOB_SECRET is not set, nor NR_RANK_KEY"):
        StoreClient.connect(RendezvousConfig(1, 2, "127.0.0.1", 1, 1.0))
