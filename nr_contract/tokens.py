"""Token files: the shared secrets of the controller's principals (control.proto header).

A token file holds lines `PRINCIPAL SECRET`; a line with one word is the secret of the
principal "default"; blank lines and `#` comments are ignored. The switch accepts every
entry; a client sends the secret of the first. Invariant: a parsed file has at least one
entry, no secret twice, and every secret is usable as gRPC metadata (printable ASCII, no
spaces, at least MIN_SECRET characters); a file that its group or others may read or write
is refused (as ssh refuses such a key), before any secret is read from it.
"""
from __future__ import annotations

import ipaddress
import os
import re
import stat
from pathlib import Path

TOKEN_ENV = "NR_CONTROLLER_TOKEN"     # path of the client's token file
CA_ENV = "NR_CONTROLLER_CA"           # path of the CA file a client verifies the switch with
INSECURE_ENV = "NR_CONTROLLER_INSECURE"   # "1": a client may speak clear text to a remote switch
ADDR_ENV = "NR_CONTROLLER"            # HOST:PORT of the controller (netreduce.init, netreduce-ctl)
DEFAULT_PRINCIPAL = "default"
MIN_SECRET = 16
_PRINCIPAL = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_SECRET = re.compile(r"[\x21-\x7e]+")


class TokenFileError(ValueError):
    """A token file that cannot be used; the message names the file and line."""


HostsPolicy = dict[str, tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]]


def read_hosts_policy(path: str | Path) -> HostsPolicy:
    """A hosts policy file: lines `PRINCIPAL NET [NET ...]` (NET: an address or a CIDR
    prefix; `#` comments): the host addresses each principal may register rings over.
    TokenFileError names the file and line of anything else."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TokenFileError(f"hosts policy {path}: cannot read it: {e}") from None
    policy: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) < 2 or not _PRINCIPAL.fullmatch(words[0]):
            raise TokenFileError(f"hosts policy {path} line {n}: expected 'PRINCIPAL NET "
                                 "[NET ...]'")
        try:
            nets = [ipaddress.ip_network(w, strict=False) for w in words[1:]]
        except ValueError as e:
            raise TokenFileError(f"hosts policy {path} line {n}: {e}") from None
        policy.setdefault(words[0], []).extend(nets)
    return {who: tuple(nets) for who, nets in policy.items()}


def read_token_file(path: str | Path) -> list[tuple[str, str]]:
    """The file's (principal, secret) entries in order (see the module doc)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            raise TokenFileError(f"token file {path}: mode {mode:04o} lets its group or others "
                                 f"read or write it: chmod 600 {path}")
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TokenFileError(f"token file {path}: cannot read it: {e}") from None
    entries: list[tuple[str, str]] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise TokenFileError(f"token file {path} line {n}: expected 'PRINCIPAL SECRET' "
                                 f"or 'SECRET', got {len(words)} words")
        principal, secret = words if len(words) == 2 else (DEFAULT_PRINCIPAL, words[0])
        if not _PRINCIPAL.fullmatch(principal):
            raise TokenFileError(f"token file {path} line {n}: principal {principal!r} is not "
                                 "1..64 of A-Z a-z 0-9 _ . @ -")
        if len(secret) < MIN_SECRET or not _SECRET.fullmatch(secret):
            raise TokenFileError(f"token file {path} line {n}: the secret of {principal!r} "
                                 f"must be at least {MIN_SECRET} printable ASCII characters")
        if secret in seen:
            raise TokenFileError(f"token file {path} line {n}: the secret of {principal!r} "
                                 "is already another entry's")
        seen.add(secret)
        entries.append((principal, secret))
    if not entries:
        raise TokenFileError(f"token file {path}: no 'PRINCIPAL SECRET' line")
    return entries
