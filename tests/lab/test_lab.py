"""The lab itself: real rxe hosts reach each other through the switch process."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lab.labhosts import (HOSTS, ROOT, host_ip, in_host, port_counter, python_in_host,
                                run_in_host, rxe_counter, switch_counters)
from tests.processes import stop_process

pytestmark = pytest.mark.lab


def test_lab_has_hosts_with_rxe() -> None:
    assert HOSTS >= 2
    for i in range(HOSTS):
        out = run_in_host(i, "rdma", "link", "show", f"rxe{i}/1").stdout
        assert "state ACTIVE" in out and "netdev nr0" in out, out


def test_ib_write_bw_crosses_the_switch() -> None:
    """perftest's RC RDMA WRITE from h0 to h1: completes, and the RoCE packets crossed the switch."""
    iters, size = 300, 65536
    before = switch_counters()
    rcvd = rxe_counter(1, "rcvd_pkts")
    args = ["ib_write_bw", "-x", "1", "-s", str(size), "-n", str(iters), "-F", "--report_gbits"]
    server = subprocess.Popen(in_host(1, *args, "-d", "rxe1"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(2)
        client = subprocess.run(in_host(0, *args, "-d", "rxe0", host_ip(1)), capture_output=True,
                                text=True, timeout=300)
        s_out, _ = server.communicate(timeout=60)
    finally:
        stop_process(server)
    assert client.returncode == 0, client.stdout + client.stderr
    assert server.returncode == 0, s_out
    m = re.search(rf"^\s*{size}\s+{iters}\s+([\d.]+)\s+([\d.]+)", client.stdout, re.M)
    assert m, client.stdout
    gbps = float(m.group(2))
    assert gbps > 0
    after = switch_counters()
    packets = iters * size // 4096                      # path MTU 4096 (netdev MTU 9000)
    roce_in = port_counter(after, 1, "roce_packets") - port_counter(before, 1, "roce_packets")
    out_h1 = port_counter(after, 2, "tx_packets") - port_counter(before, 2, "tx_packets")
    assert roce_in >= packets, (roce_in, packets)
    assert out_h1 >= packets, (out_h1, packets)
    assert rxe_counter(1, "rcvd_pkts") - rcvd >= packets
    print(f"ib_write_bw h0->h1 through the switch: {gbps} Gbit/s; {roce_in} RoCE packets crossed port 1")


SERVER = """
import hashlib, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7411)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
c.sendall(f"{n} {h.hexdigest()}".encode()); c.close()
"""

CLIENT = """
import socket, sys
data = bytes(range(256)) * 4096 * 4
c = socket.create_connection((sys.argv[1], 7411), timeout=60)
c.sendall(data); c.shutdown(socket.SHUT_WR)
print(c.recv(200).decode())
"""


def test_tcp_crosses_the_switch() -> None:
    """4 MiB over TCP from h0 to h1 arrive intact (checksums valid after the raw forwarder)."""
    server = subprocess.Popen(in_host(1, sys.executable, "-c", SERVER), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        out = run_in_host(0, sys.executable, "-c", CLIENT, host_ip(1), timeout=120).stdout.split()
    finally:
        stop_process(server)
    data = bytes(range(256)) * 4096 * 4
    assert out == [str(len(data)), hashlib.sha256(data).hexdigest()]


TLS_CHECK = """
import json, os
from nr_contract.client import ControllerClient, ControllerError
with ControllerClient(timeout=3) as tls:
    answer = tls.ping()["auth_required"]
os.environ.pop("NR_CONTROLLER_CA")
refusals = []
for insecure in (False, True):
    try:
        with ControllerClient(timeout=3, insecure=insecure) as clear:
            clear.ping()
        refusals.append(None)
    except ControllerError as e:
        refusals.append(str(e))
print(json.dumps([answer, *refusals]))
"""


def test_the_controller_takes_the_token_only_over_tls() -> None:
    """The lab's controller serves TLS (scripts/lab_tls.sh): a host trusting this run's CA
    ($NR_CONTROLLER_CA) is answered; a client without it refuses clear text to the
    controller's address on its own, and one told to speak it anyway is not answered."""
    assert Path(os.environ["NR_CONTROLLER_CA"]).is_file()
    answer, refusal, insisting = json.loads(run_in_host(0, sys.executable, "-c", TLS_CHECK).stdout)
    assert answer is True
    assert refusal.startswith("UNAVAILABLE") and "no CA file to speak TLS with" in refusal, refusal
    assert insisting.startswith("DEADLINE_EXCEEDED") and "NR_CONTROLLER_CA" in insisting, insisting


def test_setup_rxe_is_idempotent_and_reports_status() -> None:
    """up twice changes nothing; down + up restores the same hosts; status lists them all.
    down stops what ran in the hosts' namespaces (a process left in h0, which would keep the
    old namespace and its NIC alive); the lab's fork server, outside the hosts' namespaces
    (scripts/lab_forkservers.sh), serves the new ones without a restart."""
    setup = str(ROOT / "scripts" / "setup_rxe.sh")
    nics = [a for i in range(HOSTS) for a in ("--nic", f"{i}=02:4e:52:00:00:{i + 1:02x}")]
    status0 = subprocess.run([setup, "status"], capture_output=True, text=True, check=True).stdout
    for i in range(HOSTS):
        assert re.search(rf"^h{i}\s+nr0\s+{re.escape(host_ip(i))}/24\s+02:4e:52:00:00:{i + 1:02x}\s+9000\s+rxe{i}\s+"
                         rf"0000:0000:0000:0000:0000:ffff:0a4d:00{i + 1:02x}\s", status0, re.M), status0
    up = [setup, "up", "--hosts", str(HOSTS), *nics]
    again = subprocess.run(up, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout == status0
    left = subprocess.Popen(in_host(0, "sleep", "600"))
    try:
        down = subprocess.run([setup, "down"], capture_output=True, text=True)
        assert down.returncode == 0, down.stderr
        stopped = re.search(r"stopping the processes left in h0: (.*)", down.stderr)
        assert stopped and str(left.pid) in stopped[1].split(), down.stderr
        assert left.wait(timeout=30) == -signal.SIGTERM
    finally:
        stop_process(left)
    assert subprocess.run([setup, "status"], capture_output=True, text=True).stdout.strip() \
        .endswith("(no lab hosts)")
    back = subprocess.run(up, capture_output=True, text=True)
    assert back.returncode == 0, back.stderr
    assert back.stdout == status0
    run_in_host(0, "ping", "-c", "1", "-W", "5", host_ip(1))
    # forked into the new h0 by the server that served the old one: the controller answers
    assert json.loads(python_in_host(0, "-m", "switch.ctl", "ping").stdout)["target"]
