"""The rendezvous store's wire protocol: framing, message schema, keys, MACs, bounds, errors.

Shared by the store (`ring_setup.store_server`, served by rank 0) and its clients
(`ring_setup.rendezvous`, every rank). One JSON object per line each way (at most MAX_DEPTH
levels deep; MAX_LINE bytes, MAX_HELLO before the hello), one request at a time per
connection:
  (store)                            -> challenge {nonce}
  hello {rank, world_size, nonce, mac} -> ok + mac + job_key | error, then closed (not the
                                        rank's key, rank out of range, world size
                                        disagreement)
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

Keys (HKDF-SHA256 of the job's secret, RFC 5869, salt "netreduce rendezvous store"): rank
r's key K_r (info "rank r") is all a rank needs and proves that rank only; the job key
(info "job key") reaches every rank through the hello. mac(K, a, b, ..) is HMAC-SHA256
under K of "a|b|..", in hex. The hello, for store nonce c and rank nonce m:
  rank  -> mac = mac(K_r, "hello", c, m, r, world_size)
  store -> mac = mac(K_r, "store", m, c, job_key), job_key = the job key XOR
           HMAC(S, "wrap"), in hex, where S = HMAC(K_r, "session|c|m") is the session key.
After it, every line each way is "<hex MAC> <JSON>" with MAC = HMAC-SHA256(S, "<sender>|
<number>|" + JSON), sender "rank" or "store", lines numbered from 0 per direction
(`Session`): a line altered, injected, replayed or reordered fails and the connection is
closed. Values travel in clear: their integrity is protected, not their secrecy.
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
RANK_KEY_ENV = "NR_RANK_KEY"   # a rank's own key, in hex (what launch hands ranks 1..n-1)
MIN_SECRET = 16          # characters of NR_JOB_SECRET
HELLO_TIMEOUT = 10.0     # s a new connection has to prove the secret
MAX_LINE = 1 << 20       # bytes of one request line (and of a reply to an unproven peer)
MAX_HELLO = 1024         # bytes of a line from a peer that has not proven the secret
MAX_DEPTH = 32           # nesting of arrays and objects in any line
_SALT = b"netreduce rendezvous store"    # HKDF's salt for the keys of the job's secret
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


def _hkdf(secret: bytes, info: str) -> bytes:
    """32 bytes of HKDF-SHA256 (RFC 5869: extract with the store's salt, one expand block)
    of the job's secret for `info`."""
    prk = hmac.new(_SALT, secret, hashlib.sha256).digest()
    return hmac.new(prk, info.encode() + b"\x01", hashlib.sha256).digest()


def rank_key(secret: bytes, rank: int) -> bytes:
    """Rank `rank`'s key: what it proves itself with; it proves no other rank."""
    return _hkdf(secret, f"rank {rank}")


def job_key(secret: bytes) -> bytes:
    """A key every rank of the job learns from the store (`StoreClient.job_key`): for
    values the ranks agree on and others must not predict (the inc ring's id)."""
    return _hkdf(secret, "job key")


def session_key(key: bytes, challenge: str, nonce: str) -> bytes:
    """The MAC key of one connection of the rank holding `key`, from both nonces."""
    return hmac.new(key, f"session|{challenge}|{nonce}".encode(), hashlib.sha256).digest()


def wrap(secret: bytes, session: bytes) -> str:
    """`secret` (32 bytes) for the one peer holding `session`, in hex (a one-time pad from
    the session key); `wrap(wrap(..))` undoes it."""
    pad = hmac.new(session, b"wrap", hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(secret, pad, strict=True)).hex()


def unwrap(wrapped: str, session: bytes) -> bytes:
    """The secret `wrap` sent; ValueError if `wrapped` is not 32 bytes in hex."""
    return bytes.fromhex(wrap(bytes.fromhex(wrapped), session))


class Forged(OSError):
    """A line whose MAC does not verify: altered, injected, replayed, reordered or sent
    back. The stream cannot be trusted any more: it is closed."""


class Session:
    """The MACs of one proven connection, for the side `me` ("rank" or "store"). Invariant:
    each direction's lines are numbered from 0 and a line verifies only under its own
    direction and number, so a line replayed, reordered, dropped, reflected or carried to
    another connection fails."""

    def __init__(self, key: bytes, me: str) -> None:
        self._key = key
        self._me, self._peer = me, {"rank": "store", "store": "rank"}[me]
        self._sent = self._received = 0

    def seal(self, body: bytes) -> bytes:
        """`body` behind the MAC of the next line sent: "<hex MAC> <body>"."""
        tag = self._tag(self._me, self._sent, body)
        self._sent += 1
        return tag + b" " + body

    def open(self, line: bytes) -> bytes:
        """The body of the next line received; Forged if its MAC does not verify."""
        tag, _, body = line.rstrip(b"\n").partition(b" ")
        if not hmac.compare_digest(tag, self._tag(self._peer, self._received, body)):
            raise Forged(f"line {self._received} from the {self._peer} failed its MAC "
                         "(altered, injected or replayed on the way)")
        self._received += 1
        return body

    def _tag(self, sender: str, number: int, body: bytes) -> bytes:
        data = f"{sender}|{number}|".encode() + body
        return hmac.new(self._key, data, hashlib.sha256).hexdigest().encode()


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
        self.session: Session | None = None     # once proven: every line behind its MAC

    def read_line(self, limit: int, deadline: float | None = None) -> bytes:
        """The next line (b"" at the end of the stream, a partial line included), read by
        `deadline` (time.monotonic(); None: no limit)."""
        with self._reading:
            line = self._read_line(limit, deadline)
            return self.session.open(line) if self.session is not None and line else line

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
            if self.session is not None:
                data = self.session.seal(data)
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
