"""Helpers of the rendezvous store's hostile tests: a store fixture, and `Raw`, a client
driven by hand that speaks the wire format docs/security.md states (HKDF keys, the hello,
a MAC per line), written apart from `ring_setup.store_protocol` so that it checks it."""
from __future__ import annotations

import hashlib
import hmac
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import pytest

from ring_setup.rendezvous import RendezvousConfig
from ring_setup.store_server import StoreServer

SECRET = b"secret-of-the-hostile-store-tests"
WORLD = 2


@pytest.fixture
def store() -> Iterator[StoreServer]:
    """A store of WORLD ranks on 127.0.0.1 (a test module imports this fixture by name)."""
    server = StoreServer(0, WORLD, "127.0.0.1", SECRET)
    yield server
    server.stop(grace=0.5)


def cfg(server: StoreServer, rank: int, secret: bytes = SECRET, world: int = WORLD,
        timeout: float = 5.0) -> RendezvousConfig:
    return RendezvousConfig(rank, world, "127.0.0.1", server.port, timeout, secret)


def hkdf(secret: bytes, info: str) -> bytes:
    """The test's own HKDF-SHA256 (RFC 5869, one 32-byte block) with the store's salt: the
    derivation docs/security.md states, written apart from the code under test."""
    prk = hmac.new(b"netreduce rendezvous store", secret, hashlib.sha256).digest()
    return hmac.new(prk, info.encode() + b"\x01", hashlib.sha256).digest()


def hexmac(key: bytes, *parts: object) -> str:
    return hmac.new(key, "|".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


class Raw:
    """A hand-driven connection speaking the wire format of docs/security.md, written apart
    from the code under test: a JSON line each way, each after the hello behind its MAC
    under the session's key, numbered per direction from 0."""

    def __init__(self, server: StoreServer) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        self.reader = self.sock.makefile("rb")
        self.challenge = json.loads(self.reader.readline())["challenge"]
        self.session: bytes | None = None
        self.sent = self.received = 0

    def seal(self, body: bytes) -> bytes:
        """`body` behind the MAC of the next line this rank sends."""
        assert self.session is not None
        tag = hmac.new(self.session, f"rank|{self.sent}|".encode() + body, hashlib.sha256)
        self.sent += 1
        return tag.hexdigest().encode() + b" " + body

    def send(self, obj: Any, sealed: bool = True) -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.sock.sendall((self.seal(body) if self.session and sealed else body) + b"\n")

    def ask(self, obj: Any, sealed: bool = True) -> dict[str, Any] | None:
        """The store's answer (its MAC checked), or None when it hung up (a request sent
        after its close may meet a reset rather than an end of stream: both mean the same)."""
        try:
            self.send(obj, sealed)
            line = self.reader.readline()
        except (ConnectionResetError, BrokenPipeError):
            return None
        if line and self.session is not None:
            tag, body = line.rstrip(b"\n").split(b" ", 1)
            want = hmac.new(self.session, f"store|{self.received}|".encode() + body,
                            hashlib.sha256).hexdigest().encode()
            assert tag == want, "the store's answer failed its MAC"
            self.received += 1
            line = body
        return json.loads(line) if line else None

    def hello(self, rank: Any, secret: bytes = SECRET, world: int = WORLD,
              key: bytes | None = None) -> dict[str, Any] | None:
        """Prove `rank` with `key` (default: the rank's key derived from `secret`)."""
        key = hkdf(secret, f"rank {rank}") if key is None else key
        reply = self.ask({"op": "hello", "rank": rank, "world_size": world, "nonce": "n1",
                          "mac": hexmac(key, "hello", self.challenge, "n1", rank, world)})
        if reply and reply.get("ok"):
            assert reply["mac"] == hexmac(key, "store", "n1", self.challenge, reply["job_key"])
            self.session = hmac.new(key, f"session|{self.challenge}|n1".encode(),
                                    hashlib.sha256).digest()
        return reply

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def in_ranks(body: Callable[[int], Any], world: int = WORLD) -> dict[int, Any]:
    """`body(rank)` for every rank at once (threads): rank -> its result or exception."""
    with ThreadPoolExecutor(world) as pool:
        futures = {r: pool.submit(body, r) for r in range(world)}
    return {r: f.exception() or f.result() for r, f in futures.items()}


def values(server: StoreServer) -> dict[str, Any]:
    return dict(server._data)
