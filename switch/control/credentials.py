"""The controller's own credentials when the operator gives none: a token file and a
self-signed TLS certificate, made once in a private directory, kept for the next start, and
said in the log with what a client must be given.

`python -m switch --controller ADDR` without `--token-file` takes `DIR/controller.token`
(principal "default"), and on an address other hosts reach without `--tls-cert`, the
certificate `DIR/controller-HOST.pem` and its key (HOST: the address's host), DIR being
`--credentials-dir` (default `default_directory()`). Invariants: DIR is mode 0700 and ours
(`switch.control.private.private_directory`); the token file and the key are created 0600,
exclusively, never through a link, and a file found there is used only after the same
checks (the token file: `read_token_file`'s); the certificate names the address's host,
localhost and 127.0.0.1 (subjectAltName), so a client that dials the address, or the
machine's loopback, verifies it with the certificate itself as its CA.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from nr_contract.tokens import CA_ENV, TOKEN_ENV, read_token_file
from switch.control.private import PrivateFileError, create_private, private_directory

log = logging.getLogger(__name__)

CERT_DAYS = 825                  # what clients accept of a server certificate at most
_HOST_NAME = re.compile(r"[A-Za-z0-9.-]{1,64}")


def default_directory() -> Path:
    """$XDG_STATE_HOME/netreduce-switch, else ~/.local/state/netreduce-switch."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "netreduce-switch"


def token_file(directory: Path) -> Path:
    """DIR/controller.token: made (one principal, "default", a 128-bit secret) unless there,
    then checked; its path."""
    path = private_directory(directory) / "controller.token"
    try:
        create_private(path, f"default {secrets.token_hex(16)}\n".encode())
        log.warning("controller: no --token-file: made %s (principal 'default'); a client "
                    "needs %s=%s", path, TOKEN_ENV, path)
    except FileExistsError:
        log.warning("controller: no --token-file: using %s (principal 'default'); a client "
                    "needs %s=%s", path, TOKEN_ENV, path)
    read_token_file(path)
    return path


def _host(addr: str) -> str:
    return addr[1:].split("]", 1)[0] if addr.startswith("[") else addr.rsplit(":", 1)[0]


def _ip(host: str) -> Optional[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _subject_alt_names(host: str) -> str:
    """The names a certificate for `host` carries: it, localhost, 127.0.0.1 (for a
    wildcard address, this machine's name instead of it)."""
    ip = _ip(host)
    name = (f"DNS:{host}" if ip is None else
            f"DNS:{socket.gethostname()}" if ip.is_unspecified else f"IP:{ip}")
    return ",".join(dict.fromkeys(["DNS:localhost", "IP:127.0.0.1", name]))


def tls_files(directory: Path, addr: str) -> tuple[Path, Path]:
    """(certificate, key) for a controller at `addr`, made with openssl unless there.
    PrivateFileError says why they cannot be made."""
    host = _host(addr)
    if not _HOST_NAME.fullmatch(host.replace(":", "-")):
        raise PrivateFileError(f"controller address {addr}: no certificate can be made for "
                               "it here: give --tls-cert and --tls-key")
    directory = private_directory(directory)
    stem = f"controller-{host.replace(':', '-')}"
    cert, key = directory / f"{stem}.pem", directory / f"{stem}.key"
    if not (cert.exists() and key.exists()):
        _make_certificate(directory, cert, key, _subject_alt_names(host))
        log.warning("controller: no --tls-cert: made the self-signed certificate %s (and its "
                    "key, mode 0600) for %s; a client needs %s=%s", cert, addr, CA_ENV, cert)
    else:
        log.warning("controller: no --tls-cert: serving %s; a client needs %s=%s", cert,
                    CA_ENV, cert)
    if key.is_symlink() or os.stat(key).st_mode & 0o077:
        raise PrivateFileError(f"TLS key {key}: others may read it, or it is a link: "
                               f"remove it (a new one is made) or chmod 600 {key}")
    ip = _ip(host)
    if ip is not None and ip.is_unspecified:
        log.warning("controller on %s (every address): its certificate names %s; clients "
                    "must dial that name (or give --tls-cert for the names they use)", addr,
                    socket.gethostname())
    return cert, key


def _make_certificate(directory: Path, cert: Path, key: Path, names: str) -> None:
    """A P-256 key and a self-signed certificate naming `names`, written in a 0700
    scratch directory inside `directory`, then renamed into place (key first)."""
    if shutil.which("openssl") is None:
        raise PrivateFileError("no --tls-cert given and no openssl to make a certificate: "
                               "give --tls-cert and --tls-key")
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        new_key, new_cert = Path(scratch) / "key", Path(scratch) / "cert"
        done = subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:P-256", "-nodes", "-days", str(CERT_DAYS),
             "-subj", "/CN=netreduce-switch controller", "-addext", f"subjectAltName={names}",
             "-keyout", str(new_key), "-out", str(new_cert)],
            capture_output=True, text=True, umask=0o077)
        if done.returncode != 0:
            raise PrivateFileError(f"openssl could not make a certificate: "
                                   f"{done.stderr.strip()[-300:]}")
        os.chmod(new_key, 0o600)
        os.chmod(new_cert, 0o644)
        os.replace(new_key, key)
        os.replace(new_cert, cert)
