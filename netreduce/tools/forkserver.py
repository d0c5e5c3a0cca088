"""Warm starts for launched ranks: one fork server per lab host, rank processes forked from it.

    python -m netreduce.tools.forkserver SOCKET [--preload MOD,MOD,...] [--also MOD,...]
                                         [--enter-netns]

Under the lab's emulated CPUs a rank spends ~12 s importing numpy, pyverbs and grpc before
its first line runs (docs/lab.md); a launch of 4 ranks ~45 s. A fork server imports those
modules once, in the host's network namespace, then serves requests on a Unix socket: each
request names a command (`PYTHON SCRIPT ARGS...` or `PYTHON -m MODULE ARGS...` with the
server's own interpreter, or a script whose `#!` names it, as console scripts do), its environment, working directory and the three standard file
descriptors (passed over the socket). The server forks; the child becomes the leader of a
new session (so `killpg(pid)` stops it and what it started, as with
`subprocess.Popen(start_new_session=True)`), takes those descriptors, environment,
directory and `sys.argv`, and runs the script or module as `__main__` the way `python` does
(normal interpreter exit: atexit handlers, non-daemon threads joined, SystemExit codes).
The server answers the child's pid at once and its exit status when it ends.

Invariants:
- A forked rank differs from a cold-started one only in what was imported before its
  environment was set: modules that read the environment at import time see the server's
  (the preloaded ones do not). The request's PYTHONPATH is on `sys.path`, right after the
  script's directory, as a cold start puts it. The `random` module and numpy's global generator are
  reseeded in every child, so no two ranks share a random stream.
- Only the server's own user may use it: the socket is created mode 0600 and every
  connection's peer credentials (SO_PEERCRED) are checked; a request is at most
  `MAX_REQUEST` bytes and must arrive within `REQUEST_TIMEOUT` s, else it is refused.
  Likewise a client (`WarmProcess`) speaks only to a server of its own user: before it sends
  anything (a request carries the rank's environment, the job's secret with it) it checks
  the listening process's uid (SO_PEERCRED) and refuses another's (`PermissionError`: the
  launcher then starts the rank cold).
- A request may name the network namespace its command must run in (/run/netns/NAME). A
  server in another one refuses it; a server started with `--enter-netns` (one server
  for every host of a launch: a costly preload, e.g. torch, paid once instead of once per
  host) forks a child that enters it as `ip netns exec` does: the namespace, and a /sys of
  its own that shows that namespace's devices (libibverbs finds the host's rxe there).
- A command the server cannot run warm (another interpreter, interpreter options) is
  refused with the reason; the caller (netreduce.tools.launch) then starts it cold, logs
  why, and counts it. Nothing falls back silently.
"""
from __future__ import annotations

import argparse
import array
import ctypes
import gc
import importlib
import json
import logging
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Mapping

log = logging.getLogger(__name__)

MAX_REQUEST = 1 << 20          # bytes of one request's JSON
REQUEST_TIMEOUT = 5.0          # s for a client to send its whole request
DEFAULT_PRELOAD = ("numpy", "netreduce", "netreduce.tools.reference", "ring_setup.verbs.host",
                   "nr_contract.client", "switch.ctl")
NETNS_DIR = "/run/netns"       # where `ip netns` names namespaces
_HEADER = struct.Struct("!I")
_FDS = 3                       # stdin, stdout, stderr


class Refused(Exception):
    """The server will not run this request warm (the reason is the message)."""


def warm_target(argv: list[str], python: str) -> tuple[str, str, list[str]]:
    """("path" | "module", target, args) for `argv` run by the interpreter `python`, or
    `Refused`: argv[0] must resolve to that interpreter and be followed by a script path
    or `-m MODULE` (no other interpreter option)."""
    if not argv:
        raise Refused("no command")
    exe = shutil.which(argv[0]) or argv[0]
    if _interpreter(exe) != _interpreter(python):
        named = _shebang(exe)
        if named and _interpreter(named) == _interpreter(python):
            return "path", os.path.abspath(exe), argv[1:]      # e.g. a console script
        raise Refused(f"{argv[0]} is not the fork server's interpreter {python} "
                      "nor a script of it")
    if len(argv) >= 3 and argv[1] == "-m":
        return "module", argv[2], argv[3:]
    if len(argv) >= 2 and not argv[1].startswith("-"):
        return "path", argv[1], argv[2:]
    raise Refused(f"interpreter options {argv[1:2]} are not run warm (only SCRIPT or -m MODULE)")


def _shebang(path: str) -> str:
    """The interpreter a `#!/path/to/python` script names ("" for anything else)."""
    try:
        with open(path, "rb") as f:
            line = f.readline(256)
    except OSError:
        return ""
    words = line[2:].split() if line.startswith(b"#!") else []
    return words[0].decode(errors="replace") if len(words) == 1 else ""


def _interpreter(exe: str) -> tuple[str, str | None]:
    """An interpreter's identity: its binary and its virtual environment (a venv's python
    is a symlink to the system's, with other site-packages)."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(exe)))
    return (os.path.realpath(exe),
            venv if os.path.exists(os.path.join(venv, "pyvenv.cfg")) else None)


@dataclass
class Job:
    """What a forked child runs as `__main__` once it has its descriptors and environment."""
    kind: str                  # "path" or "module"
    target: str
    args: list[str]

    def run(self) -> None:
        sys.argv = [self.target, *self.args]    # -m: runpy puts the module's path in [0]
        # [0] first, then the request's PYTHONPATH after it, as a cold start orders them (the
        # server's own [0], e.g. its working directory, may be one of those entries)
        sys.path[0] = (os.getcwd() if self.kind == "module"
                       else os.path.dirname(os.path.abspath(self.target)))
        pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[1:1] = [p for p in pythonpath if p not in sys.path]
        if self.kind == "module":
            sys.modules.pop(self.target, None)         # preloaded: runs afresh, as cold
            runpy.run_module(self.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(self.target, run_name="__main__")


# ---- the server -------------------------------------------------------------------------

def _send(conn: socket.socket, message: Mapping[str, object]) -> None:
    data = json.dumps(message).encode()
    try:
        conn.sendall(_HEADER.pack(len(data)) + data)
    except OSError:            # the client went away: its child runs on, reaped by us
        pass


def _peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    return pid, uid, gid


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request's JSON and its descriptors; `Refused` on anything malformed."""
    conn.settimeout(REQUEST_TIMEOUT)
    fds = array.array("i")
    msg, anc, _flags, _addr = conn.recvmsg(_HEADER.size, socket.CMSG_LEN(_FDS * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    try:
        if len(msg) != _HEADER.size or len(fds) != _FDS:
            raise Refused(f"a request is a {_HEADER.size}-byte length and {_FDS} descriptors")
        (size,) = _HEADER.unpack(msg)
        if size > MAX_REQUEST:
            raise Refused(f"request of {size} bytes (at most {MAX_REQUEST})")
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise Refused("the request ended early")
            data += chunk
        request = json.loads(data)
        if not (isinstance(request, dict)
                and isinstance(request.get("argv"), list)
                and all(isinstance(a, str) for a in request["argv"])
                and isinstance(request.get("env"), dict)
                and all(isinstance(k, str) and isinstance(v, str) and "=" not in k and k
                        for k, v in request["env"].items())
                and isinstance(request.get("cwd"), str)
                and isinstance(request.get("netns"), (str, type(None)))):
            raise Refused("a request is {argv: [str], env: {str: str}, cwd: str, "
                          "netns: str | null}")
    except (Refused, ValueError, OSError) as exc:
        for fd in fds:
            os.close(fd)
        raise Refused(str(exc)) from None
    return request, list(fds)


_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_REC, _MS_SLAVE, _MNT_DETACH = 0x4000, 0x80000, 2


def _netns_to_enter(netns: str | None, enter_netns: bool) -> str | None:
    """The network namespace a request's child must enter (None: it stays in the server's),
    or `Refused`: a request names only /run/netns/NAME, and a server without
    --enter-netns must already run in it."""
    if netns is None:
        return None
    path = os.path.abspath(netns)               # no symlinks followed: /proc's are magic
    if os.path.dirname(path) != NETNS_DIR or not os.path.exists(path):
        raise Refused(f"{netns} is not a network namespace under {NETNS_DIR}")
    if enter_netns:
        return path
    ours, theirs = os.stat("/proc/self/ns/net"), os.stat(path)
    if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
        raise Refused(f"the fork server (pid {os.getpid()}) runs in another network namespace "
                      f"than {netns} (was the host set up again since it started?)")
    return None


def _enter_netns(path: str) -> None:
    """Join network namespace `path` the way iproute2's `ip netns exec` does: setns, then a
    mount namespace of our own (mounts slaved, not shared back) with sysfs mounted afresh
    on /sys, so that /sys/class shows this namespace's devices."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"fork server: {what}: {os.strerror(err)}")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(fd, _CLONE_NEWNET), f"setns({path})")
    finally:
        os.close(fd)
    check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None), "mount --make-rslave /")
    libc.umount2(b"/sys", _MNT_DETACH)              # none mounted: nothing to take away
    check(libc.mount(os.path.basename(path).encode(), b"/sys", b"sysfs", 0, None),
          "mount sysfs /sys")


def _child(job: Job, request: dict, fds: list[int], enter: str | None) -> Job:
    """In the forked child: become the command's process (in network namespace `enter`,
    if given), then return `job` to run."""
    if enter is not None:
        _enter_netns(enter)
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False,
                                       encoding="utf-8", errors="backslashreplace")
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False,
                                       encoding="utf-8", errors="backslashreplace")
    if unbuffered:
        sys.stdout.reconfigure(write_through=True)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler
        faulthandler.enable()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()         # `random` reseeds itself at fork
    logging.getLogger().handlers.clear()          # the server's own log lines stay its own
    return job


def serve(path: str, preload: tuple[str, ...] = DEFAULT_PRELOAD,
          ready: IO[str] | None = None, enter_netns: bool = False) -> Job:
    """Import `preload`, listen on `path` and serve until SIGTERM (then exit). Returns only
    in a forked child, with the job that child must run. `enter_netns`: a request's network
    namespace is entered by its child, not required of the server."""
    for name in preload:
        importlib.import_module(name)
    # what the preload made lives as long as the server: out of the cyclic collector's reach,
    # so a child's collections never write to those objects' pages, which stay shared
    # instead of being copied into every child (the gc docs' advice for fork without exec)
    gc.freeze()
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    uid = os.getuid()
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    children: dict[int, tuple[int, socket.socket]] = {}     # pidfd -> (pid, connection)
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True
    signal.signal(signal.SIGTERM, on_term)
    log.info("fork server on %s: preloaded %s", path, ", ".join(preload))
    if ready is not None:
        ready.write(f"{path}\n")
        ready.flush()
    served = 0
    while not stop:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                _pid, peer_uid, _gid = _peer_credentials(conn)
                try:
                    if peer_uid != uid:
                        raise Refused(f"uid {peer_uid} may not use this fork server")
                    request, fds = _recv_request(conn)
                    try:
                        kind, target, args = warm_target(request["argv"], sys.executable)
                        enter = _netns_to_enter(request.get("netns"), enter_netns)
                    except (Refused, OSError) as exc:
                        for fd in fds:
                            os.close(fd)
                        raise Refused(str(exc)) from None
                except Refused as exc:
                    log.warning("fork server: refused a request: %s", exc)
                    _send(conn, {"refused": str(exc)})
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    for pidfd, (_p, c) in children.items():
                        os.close(pidfd)
                        c.close()
                    conn.close()
                    return _child(Job(kind, target, args), request, fds, enter)
                for fd in fds:
                    os.close(fd)
                served += 1
                _send(conn, {"pid": pid})
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ)
            else:
                pidfd = key.fd
                pid, conn = children.pop(pidfd)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                # subprocess's convention: the exit code, or -N for a death by signal N
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()
    log.info("fork server on %s: stopped after %d children", path, served)
    listener.close()
    os.unlink(path)
    sys.exit(0)


# ---- the client -------------------------------------------------------------------------

class WarmProcess:
    """A command forked by a fork server, with `subprocess.Popen`'s surface that
    netreduce.tools.launch uses: pid (its session and process group), stdout (a pipe
    carrying its stdout, and its stderr unless another descriptor is given), poll(), wait(),
    returncode."""

    def __init__(self, socket_path: str, argv: list[str], env: Mapping[str, str],
                 cwd: str | None = None, netns: str | None = None,
                 connect_timeout: float = 10.0, stderr: int | None = None) -> None:
        """`netns`: the named network namespace (its /run/netns/NAME) the command must run in:
        a server in any other one (e.g. one started before the host was set up again)
        refuses, one started with --enter-netns forks a child that enters it. `stderr`: a
        descriptor for the command's stderr (None: the `stdout` pipe carries both)."""
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.settimeout(connect_timeout)
        r, w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            self._conn.connect(socket_path)
            _, uid, _ = _peer_credentials(self._conn)
            if uid != os.geteuid():
                raise PermissionError(f"the fork server at {socket_path} runs as uid {uid}, "
                                      f"not as this user ({os.geteuid()}): not asked")
            data = json.dumps({"argv": list(argv), "env": dict(env),
                               "cwd": cwd or os.getcwd(), "netns": netns}).encode()
            self._conn.sendmsg([_HEADER.pack(len(data))],
                               [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                 array.array("i", [devnull, w, w if stderr is None else stderr]))])
            self._conn.sendall(data)
            answer = self._read()
        except BaseException:
            os.close(r)
            self._conn.close()
            raise
        finally:
            os.close(w)
            os.close(devnull)
        if "refused" in answer:
            os.close(r)
            self._conn.close()
            raise Refused(str(answer["refused"]))
        self.pid = int(answer["pid"])
        self.stdout = os.fdopen(r, "rb")

    def _read(self) -> dict:
        head = self._conn.recv(_HEADER.size, socket.MSG_WAITALL)
        if len(head) != _HEADER.size:
            raise ConnectionError("the fork server closed the connection")
        (size,) = _HEADER.unpack(head)
        return json.loads(self._conn.recv(size, socket.MSG_WAITALL))

    def poll(self) -> int | None:
        if self.returncode is None:
            self._conn.setblocking(False)
            try:
                self.returncode = int(self._read()["exit"])
            except BlockingIOError:
                return None
            except (ConnectionError, ValueError, KeyError):   # the server died: the child too?
                self.returncode = _FORK_SERVER_LOST
            finally:
                self._conn.setblocking(True)
            self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


_FORK_SERVER_LOST = 125        # exit code reported when the fork server vanished mid-run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m netreduce.tools.forkserver",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("socket", help="Unix socket path to serve on (created mode 0600)")
    parser.add_argument("--preload", default=",".join(DEFAULT_PRELOAD),
                        help="modules imported once, before serving (comma-separated; "
                             "default: %(default)s)")
    parser.add_argument("--also", default="",
                        help="more modules imported after --preload's (comma-separated), "
                             "e.g. torch for a suite whose every launch imports it")
    parser.add_argument("--enter-netns", action="store_true",
                        help="serve requests for any network namespace under /run/netns: "
                             "each child enters its request's (as `ip netns exec` does), so "
                             "one server, and one preload, serves every host of a launch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    modules = f"{args.preload},{args.also}".split(",")
    job = serve(args.socket, tuple(m for m in modules if m), ready=sys.stdout,
                enter_netns=args.enter_netns)
    job.run()                  # in a forked child: the command, as __main__
    return 0


if __name__ == "__main__":
    sys.exit(main())
