"""Files of a switch process that hold secrets: token files, TLS keys, and the counters of
`--stats-file` (every ring's RETH: its R_Key and virtual address, enough to forge a WRITE
into that job's memory).

Invariants: such a file is mode 0600 from its first byte and never written through a link;
`write_private` replaces its path atomically (a reader sees the old file or the new one,
whole) through a temporary file of a random name it creates itself (O_CREAT | O_EXCL |
O_NOFOLLOW) in the same directory, renamed over the path (a rename replaces a link there,
never follows it); `create_private` makes a new file the same way and never replaces one;
both write only into a directory `check_directory` accepts: owned by this user or root,
and writable by nobody else unless sticky (as /tmp is: nobody else may then rename or remove
what is ours).
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


class PrivateFileError(ValueError):
    """A directory or file that would let another user read or swap a secret; the message
    names it and says what to do."""


def check_directory(directory: Path) -> None:
    """PrivateFileError unless another user can neither write `directory` nor swap its
    files (module doc)."""
    try:
        st = os.stat(directory)
    except OSError as e:
        raise PrivateFileError(f"directory {directory}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PrivateFileError(f"{directory} is not a directory")
    if st.st_uid not in (os.geteuid(), 0):
        raise PrivateFileError(f"directory {directory} belongs to uid {st.st_uid}, not to "
                               f"this user ({os.geteuid()}) or root: it could swap our files")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise PrivateFileError(f"directory {directory}: mode {stat.S_IMODE(st.st_mode):04o} "
                               "lets its group or others rename our files (chmod go-w, or "
                               "a sticky directory)")


def _write_new(path: Path, data: bytes) -> None:
    """Create `path` (0600, exclusively, not through a link) holding `data`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` by a 0600 file holding `data` (module doc)."""
    directory = path.parent
    check_directory(directory)
    tmp = directory / f".{path.name}.{secrets.token_hex(8)}.tmp"
    _write_new(tmp, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_private(path: Path, data: bytes) -> None:
    """Create `path` as a 0600 file holding `data`; FileExistsError if anything (a link
    included) is there already."""
    check_directory(path.parent)
    _write_new(path, data)


def private_directory(directory: Path) -> Path:
    """`directory`, made mode 0700 with its parents if missing, and checked
    (`check_directory`, and not readable by others: it holds keys)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_directory(directory)
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if mode & 0o077:
        raise PrivateFileError(f"directory {directory}: mode {mode:04o} lets its group or "
                               f"others in: chmod 700 {directory}")
    return directory
