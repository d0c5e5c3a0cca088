"""Warm starts (netreduce.tools.forkserver) through the launcher, with --local ranks: what a
forked rank sees must be what a cold one sees; a hostile or malformed request is refused
and the server serves on; a command it cannot run warm starts cold, logged and counted."""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from netreduce.tools import forkserver as F
from netreduce.tools import launch as L
from tests.hostile.netns import WORKER as NETNS_WORKER, require_netns
from tests.processes import stop_process

PY = sys.executable


@contextmanager
def forkserver(tmp: Path, *args: str, netns: str | None = None,
               **popen: object) -> Iterator[Path]:
    """A fork server for --local ranks in `tmp` (local.sock), `args` on its command line and
    `popen` (cwd, env) for its process, in named network namespace `netns` if given; it
    must stop cleanly on SIGTERM, its socket gone."""
    where = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen([*where, PY, "-m", "netreduce.tools.forkserver",
                             str(tmp / "local.sock"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            **popen)  # type: ignore[call-overload]
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == str(tmp / "local.sock")
        yield tmp
    finally:
        stopped = stop_process(proc)
    assert stopped.returncode == 0, stopped.stderr
    assert not (tmp / "local.sock").exists()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Path]:
    """A fork server for --local ranks in tmp_path (local.sock), numpy preloaded."""
    with forkserver(tmp_path, "--preload", "numpy") as tmp:
        yield tmp


def warm(tmp: Path, cmd: list[str], hosts: int, **kw: object) -> tuple[L.LaunchResult, str]:
    out = io.StringIO()
    result = L.launch(cmd, hosts, local=True, out=out, port=29997, forkservers=str(tmp),
                      **kw)  # type: ignore[arg-type]
    return result, out.getvalue()


WORKER = """\
import os, random, sys
import numpy as np
print(os.environ["RANK"], os.environ["WORLD_SIZE"], sys.argv[1:], os.getcwd(),
      sys.path[0] == os.path.dirname(os.path.abspath(__file__)),
      os.getpgid(0) == os.getpid() == os.getsid(0), __name__)
print("streams", random.getrandbits(64), int(np.random.randint(1 << 62)))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ["RANK"]) + 3)
"""


def test_a_forked_rank_sees_what_a_cold_one_sees(servers: Path, tmp_path: Path) -> None:
    """argv, environment, directory, sys.path[0], its own session, __main__, stderr merged,
    exit codes; no two ranks share a random stream (random and numpy reseeded)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    result, text = warm(servers, [PY, str(script), "a", "b"], 3, grace=5.0)
    assert result.cold == 0 and "started cold" not in text
    assert [r.returncode for r in result.ranks] == [3, 4, 5]
    streams = set()
    for r in result.ranks:
        assert r.output[0] == f"{r.rank} 3 ['a', 'b'] {os.getcwd()} True True __main__"
        assert r.output[2] == "to stderr"
        streams.add(tuple(r.output[1].split()[1:]))
    assert len(streams) == 3


def test_a_forked_rank_imports_from_the_pythonpath_its_launch_gave(servers: Path,
                                                                   tmp_path: Path) -> None:
    """The server started without it; the rank's PYTHONPATH is searched as a cold start
    searches it (the lab's torch worker imports tests.lab.labswitch this way)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "nr_probe_module.py").write_text("WHERE = __file__\n")
    script = tmp_path / "imports.py"
    script.write_text("import sys, nr_probe_module\n"
                      "print(nr_probe_module.WHERE, sys.path.index(sys.argv[1]))\n")
    env = {**os.environ, "PYTHONPATH": str(lib)}
    result, text = warm(servers, [PY, str(script), str(lib)], 2, grace=5.0, env=env)
    assert result.cold == 0 and "started cold" not in text
    for r in result.ranks:
        assert r.returncode == 0, r.output
        assert r.output == [f"{lib / 'nr_probe_module.py'} 1"]
    # a server started in `lib` (python -m: its sys.path[0] is lib) and lib on the rank's
    # PYTHONPATH: lib must stay on the path once the script's directory takes [0] (the
    # lab's torch worker failed so: its server ran in the repository, on its PYTHONPATH)
    here = tmp_path / "in-lib"
    here.mkdir()
    with forkserver(here, cwd=lib,
                    env={**os.environ, "PYTHONPATH": str(Path(F.__file__).parents[2])}):
        result, _ = warm(here, [PY, str(script), str(lib)], 2, grace=5.0, env=env)
    for r in result.ranks:
        assert (r.returncode, r.output) == (0, [f"{lib / 'nr_probe_module.py'} 1"]), r.output


def test_modules_run_as_main_and_stop_with_their_process_group(servers: Path) -> None:
    """`-m MODULE` runs the module afresh as __main__ (even a preloaded one); the launcher
    stops a warm rank and everything it started through its process group."""
    result, text = warm(servers, [PY, "-m", "json.tool", "--help"], 1)
    assert result.ok and result.cold == 0 and "usage: python -m json.tool" in text
    assert "RuntimeWarning" not in text
    code = ("import subprocess, sys, time; subprocess.Popen(['sleep', '60']); "
            "print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    result, text = warm(servers, [PY, "-c", code], 1, timeout=1.0)
    assert result.cold == 1                # -c is not run warm: counted, and still stopped
    assert result.timed_out and time.monotonic() - t0 < 15
    sleeper = (servers / "sleeper.py")
    sleeper.write_text(code)
    result, _ = warm(servers, [PY, str(sleeper)], 1, timeout=3.0)
    assert result.timed_out and result.cold == 0 and result.ranks[0].returncode == -signal.SIGTERM
    time.sleep(0.5)
    leftovers = subprocess.run(["pgrep", "-f", "^sleep 60$"], capture_output=True, text=True)
    assert leftovers.stdout == ""          # the grandchild went with the group


def test_a_warm_command_may_keep_its_stderr_apart(servers: Path, tmp_path: Path) -> None:
    """Given a descriptor for stderr, the stdout pipe carries stdout alone (what a caller
    parses, e.g. switch.ctl's JSON) and stderr lands where it was sent."""
    err = tmp_path / "err"
    with open(err, "wb") as f:
        p = F.WarmProcess(str(servers / "local.sock"),
                          [PY, "-m", "json.tool", "--no-such-flag"],
                          dict(os.environ), stderr=f.fileno())
    out = p.stdout.read()
    assert p.wait(timeout=30) == 2
    assert out == b"" and b"unrecognized arguments: --no-such-flag" in err.read_bytes()
    with open(err, "wb") as f:
        script = tmp_path / "both.py"
        script.write_text("import sys; print('{\"a\": 1}'); print('noise', file=sys.stderr)")
        p = F.WarmProcess(str(servers / "local.sock"), [PY, str(script)], dict(os.environ),
                          stderr=f.fileno())
    assert json.loads(p.stdout.read()) == {"a": 1} and p.wait(timeout=30) == 0
    assert err.read_bytes() == b"noise\n"


def test_what_cannot_run_warm_starts_cold_logged_and_counted(
        servers: Path, caplog: pytest.LogCaptureFixture) -> None:
    result, text = warm(servers, ["/bin/echo", "hi"], 2)
    assert result.ok and result.cold == 2 and "[rank 1] hi" in text
    assert "2 rank(s) started cold, not by the fork servers" in text
    assert "is not the fork server's interpreter" in caplog.text
    result, text = warm(servers.parent, [PY, "-c", "print(7)"], 1)     # no server there
    assert result.ok and result.cold == 1 and "no fork server at" in caplog.text
    with pytest.raises(F.Refused, match="interpreter options"):
        F.warm_target([PY, "-X", "dev", "x.py"], PY)


def _raw(path: Path, payload: bytes, fds: list[int]) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
        s.sendmsg([payload[:4]], anc)
        try:
            s.sendall(payload[4:])
        except (BrokenPipeError, ConnectionResetError):
            pass                           # refused from the header on: the answer waits
        head = s.recv(4, socket.MSG_WAITALL)
        return json.loads(s.recv(struct.unpack("!I", head)[0], socket.MSG_WAITALL))


def test_malformed_requests_are_refused_and_the_server_serves_on(servers: Path) -> None:
    sock = servers / "local.sock"
    assert oct(sock.stat().st_mode & 0o777) == "0o600"
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        body = json.dumps({"argv": [PY, "x.py"], "env": {}, "cwd": "/"}).encode()
        assert "descriptors" in _raw(sock, struct.pack("!I", len(body)) + body, [fd])["refused"]
        assert "at most" in _raw(sock, struct.pack("!I", F.MAX_REQUEST + 1), [fd] * 3)["refused"]
        bad = json.dumps({"argv": "rm -rf /", "env": {}, "cwd": "/"}).encode()
        assert "argv: [str]" in _raw(sock, struct.pack("!I", len(bad)) + bad, [fd] * 3)["refused"]
        junk = b"\xff" * 10
        assert "refused" in _raw(sock, struct.pack("!I", len(junk)) + junk, [fd] * 3)
    finally:
        os.close(fd)
    result, text = warm(servers, [PY, "-m", "json.tool", "--help"], 1)
    assert result.ok and result.cold == 0


def test_only_the_servers_own_interpreter_and_environment_runs_warm() -> None:
    assert F.warm_target([PY, "-m", "mod", "x"], PY) == ("module", "mod", ["x"])
    console = os.path.join(os.path.dirname(PY), "netreduce")     # pip's console script
    assert F.warm_target([console, "demo"], PY) == ("path", console, ["demo"])
    system = os.path.realpath(PY)        # the venv's python links to it: another site-packages
    if system != PY and os.path.exists(os.path.join(sys.prefix, "pyvenv.cfg")):
        with pytest.raises(F.Refused, match="not the fork server's interpreter"):
            F.warm_target([system, "x.py"], PY)


@pytest.fixture
def two_netns() -> Iterator[tuple[str, str]]:
    """Two empty named network namespaces (/run/netns/NAME), this xdist worker's own."""
    require_netns()
    names = (f"nrxfa{NETNS_WORKER}", f"nrxfb{NETNS_WORKER}")
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


NETNS_CHECK = """\
import os
print("netns", os.stat("/proc/self/ns/net").st_ino, sorted(os.listdir("/sys/class/net")))
"""


def test_a_server_in_another_network_namespace_is_refused(tmp_path: Path,
                                                         two_netns: tuple[str, str]) -> None:
    """A lab host set up again is a new namespace under the same name: a server started in
    the old one must not run that host's ranks; only namespaces under /run/netns are named."""
    mine, other = two_netns
    with forkserver(tmp_path, "--preload", "json", netns=mine) as tmp:
        proc = F.WarmProcess(str(tmp / "local.sock"), [PY, "-m", "json.tool", "--help"], {},
                             netns=f"/run/netns/{mine}")
        assert proc.wait(timeout=30) == 0
        with pytest.raises(F.Refused, match="another network namespace than"):
            F.WarmProcess(str(tmp / "local.sock"), [PY, "x.py"], {}, netns=f"/run/netns/{other}")
        with pytest.raises(F.Refused, match="not a network namespace under /run/netns"):
            F.WarmProcess(str(tmp / "local.sock"), [PY, "x.py"], {}, netns="/proc/self/ns/net")


def test_one_server_with_enter_netns_runs_each_rank_in_its_namespace(
        tmp_path: Path, two_netns: tuple[str, str]) -> None:
    """--enter-netns: one server (one preload) serves every host; each child is in its
    request's namespace, with a /sys that lists that namespace's interfaces (only lo here,
    not the machine's), as under `ip netns exec`; the server's own namespace is unchanged."""
    script = tmp_path / "where.py"
    script.write_text(NETNS_CHECK)
    with forkserver(tmp_path, "--preload", "json", "--enter-netns") as tmp:
        for name in two_netns:
            proc = F.WarmProcess(str(tmp / "local.sock"), [PY, str(script)], {},
                                 netns=f"/run/netns/{name}")
            assert proc.stdout is not None
            out = proc.stdout.read().decode()
            assert proc.wait(timeout=30) == 0, out
            assert out.split()[:2] == ["netns", str(os.stat(f"/run/netns/{name}").st_ino)], out
            assert out.rstrip().endswith("['lo']"), out
        with pytest.raises(F.Refused, match="not a network namespace under /run/netns"):
            F.WarmProcess(str(tmp / "local.sock"), [PY, str(script)], {},
                          netns="/proc/1/ns/net")
    assert sorted(os.listdir("/sys/class/net")) != ["lo"]   # ours was left alone


TORCH_WORKER = """\
import os, sys
print("preloaded", "torch" in sys.modules, flush=True)
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29981",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
t = torch.arange(4, dtype=torch.float32) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", t.tolist(), torch.get_num_threads() >= 1)
dist.destroy_process_group()
"""


def test_ranks_forked_from_a_server_that_imported_torch_run_gloo(tmp_path: Path) -> None:
    """`--also torch,...` (lab.sh --preload): a rank forked after the server imported torch
    runs gloo like a cold one (torch starts no thread at import that a fork would lose)."""
    pytest.importorskip("torch")
    sock = tmp_path / "local.sock"
    proc = subprocess.Popen([PY, "-m", "netreduce.tools.forkserver", str(sock), "--preload",
                             "numpy", "--also", "torch,torch.distributed"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == str(sock)
        script = tmp_path / "torch_worker.py"
        script.write_text(TORCH_WORKER)
        result, text = warm(tmp_path, [PY, str(script)], 2, timeout=120.0)
        assert result.ok and result.cold == 0, text
        for r in result.ranks:
            assert r.output[0] == "preloaded True"
            assert r.output[-1] == "sum [0.0, 3.0, 6.0, 9.0] True"
    finally:
        stop_process(proc)


FOREIGN_SERVER = """\
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
os.setuid(65534)                  # listens as nobody: SO_PEERCRED names the listener's uid
s.listen(1)
print("listening", flush=True)
conn, _ = s.accept()
conn.settimeout(3)
got = b""
try:
    while chunk := conn.recv(65536):
        got += chunk
except OSError:
    pass
print("received", len(got), b"hunter2-job-secret" in got, flush=True)
"""


def test_a_client_asks_only_a_fork_server_of_its_own_user(tmp_path: Path) -> None:
    """Issue 39: a client sent its request, the rank's environment and the job's secret
    with it, to whatever listened at the socket path; another user's process there got them."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a server of another uid)")
    sock = tmp_path / "local.sock"
    server = subprocess.Popen([PY, "-c", FOREIGN_SERVER, str(sock)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        with pytest.raises(PermissionError, match="runs as uid 65534, not as this user"):
            F.WarmProcess(str(sock), [PY, "-c", "pass"], {"NR_JOB_SECRET": "hunter2-job-secret"},
                          connect_timeout=5)
        assert server.stdout.readline().split() == ["received", "0", "False"]
    finally:
        stop_process(server)
