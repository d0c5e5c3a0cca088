"""The rendezvous store's wire protocol: framing, message schema, MACs, bounds and errors.

Shared by the store (`ring_setup.store_server`, served by rank 0) and its clients
(`ring_setup.rendezvous`, every rank). One JSON object per line each way, one request at a
time per connection:
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
The hello's MAC is an HMAC-SHA256 under the job's secret of the store's nonce, the rank's
nonce, the rank and the world size; the store answers with its own over both nonces.
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import re
import secrets
import socket
import threading
import time
from typing import Any, Mapping

DEFAULT_PORT = 29500
DEFAULT_TIMEOUT = 30.0
WATCH_INTERVAL = 1.0     # a watch request returns after this long when nothing failed
# A dead process is seen at once (its connections close); these two only bound how long a
# hung host or store goes unnoticed, so they are generous: in the TCG lab a busy rank's
# store thread can go several seconds without the GIL or a vCPU (a watch timing out at
# 6 s broke slow BMv2 calls).
SILENCE_TIMEOUT = 60.0   # a rank whose watch is silent this long is declared failed
SECRET_ENV = "NR_JOB_SECRET"
MIN_SECRET = 16          # characters of NR_JOB_SECRET
HELLO_TIMEOUT = 10.0     # s a new connection has to prove the secret
MAX_LINE = 1 << 20       # bytes of one request line (and of a reply to an unproven peer)
MAX_HELLO = 1024         # bytes of a line from a peer that has not proven the secret
MAX_DEPTH = 32           # nesting of arrays and objects in any line
MAX_STORED = 64 << 20    # bytes of keys and values the store holds
MAX_REPLY = MAX_STORED + MAX_LINE   # bytes of a reply line (every value of the store)
MAX_WAIT = 7200.0        # s: the longest server-side wait a request may ask for
MAX_KEYS = 4096          # keys of one get
_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,128}/(\d{1,6})")


class RendezvousError(RuntimeError):
    """Setup could not agree with the other ranks."""


class RendezvousTimeout(RendezvousError):
    """Some rank never showed up; the message names it."""


class UntrustedStore(RendezvousError):
    """Whatever answers at MASTER_ADDR:MASTER_PORT could not prove the job's secret."""


class BadRequest(ValueError):
    """A request the store refuses; the message says what is wrong with it."""


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


def mac(secret: bytes, *parts: object) -> str:
    """HMAC-SHA256 under `secret` of `parts` joined by "|", in hex."""
    return hmac.new(secret, "|".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def new_secret() -> str:
    """A fresh job secret (what `netreduce launch` puts in NR_JOB_SECRET)."""
    return secrets.token_hex(16)


class LineTooLong(OSError):
    """A line over its bound: the stream cannot be resynchronised, so it is closed."""


class LineSocket:
    """A socket that carries one line at a time each way. Invariant: `read_line` returns a
    whole line of at most `limit` bytes (its newline included) that arrived before the
    deadline given, else raises (LineTooLong, TimeoutError): a peer cannot stretch a read
    by sending a byte at a time. Threads sharing it read whole lines in turn (and write
    them), as a buffered file would let them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._reading = threading.Lock()
        self._writing = threading.Lock()

    def read_line(self, limit: int, deadline: float | None = None) -> bytes:
        """The next line (b"" at the end of the stream, a partial line included), read by
        `deadline` (time.monotonic(); None: no limit)."""
        with self._reading:
            return self._read_line(limit, deadline)

    def _read_line(self, limit: int, deadline: float | None) -> bytes:
        scanned = 0
        while True:
            end = self._buf.find(b"\n", scanned, limit)
            if end >= 0:
                line = bytes(self._buf[:end + 1])
                del self._buf[:end + 1]
                return line
            if len(self._buf) >= limit:
                raise LineTooLong(f"a line over {limit} bytes")
            scanned = len(self._buf)
            self.sock.settimeout(_left(deadline))
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return b""
            self._buf += chunk

    def write_line(self, data: bytes, deadline: float | None = None) -> None:
        """Send `data` and a newline, by `deadline` (None: no limit)."""
        with self._writing:
            self.sock.settimeout(_left(deadline))
            self.sock.sendall(data + b"\n")


def _left(deadline: float | None) -> float | None:
    """Seconds until `deadline` (None: none); TimeoutError once it passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_NESTING = [{ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}.get(b, 0) for b in range(256)]


def json_depth(line: bytes) -> int:
    """How deep arrays and objects nest in `line` (exact for valid JSON; brackets in
    strings do not count), found without parsing it (the parser recurses)."""
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", line))
    return max(itertools.accumulate(map(_NESTING.__getitem__, brackets)), default=0)


def decode_request(line: bytes) -> dict[str, Any]:
    """A request (or reply) line as a JSON object of at most MAX_DEPTH levels;
    BadRequest("closed") for the end of the stream, BadRequest naming what is wrong for
    anything else."""
    if not line:
        raise BadRequest("closed")
    if json_depth(line) > MAX_DEPTH:
        raise BadRequest(f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        req = json.loads(line)
    except ValueError:
        raise BadRequest("not JSON") from None
    if not isinstance(req, dict):
        raise BadRequest("a request is a JSON object")
    return req


def key_rank(key: object) -> int | None:
    """The rank a store key "NAME/<rank>" belongs to, or None when it is not a key."""
    m = _KEY.fullmatch(key) if isinstance(key, str) else None
    return None if m is None else int(m[1])


def parse_wait(req: dict[str, Any]) -> float:
    """A request's `timeout`: seconds in 0..MAX_WAIT, else BadRequest."""
    timeout = req.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 <= timeout <= MAX_WAIT:
        raise BadRequest(f"timeout must be a number of seconds in 0..{MAX_WAIT:g}, not "
                         f"{timeout!r}")
    return float(timeout)
