"""Helpers for tests that run inside the lab (scripts/lab.sh): hosts, rxe counters, the switch.

Host I is network namespace hI, address 10.77.0.(I+1), rxe device rxeI; the switch's
controller answers at $NR_CONTROLLER from the hosts' namespaces (docs/pipeline.md).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CONTROLLER = os.environ.get("NR_CONTROLLER", "10.77.0.254:50051")
HOSTS = int(os.environ.get("NR_LAB_HOSTS", "0"))
ROOT = Path(__file__).resolve().parents[2]


def host_ip(i: int) -> str:
    return f"10.77.0.{i + 1}"


def in_host(i: int, *cmd: str) -> list[str]:
    """argv running `cmd` in host hI's namespace."""
    return ["ip", "netns", "exec", f"h{i}", *cmd]


def run_in_host(i: int, *cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(in_host(i, *cmd), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"h{i}: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def rxe_counter(i: int, name: str) -> int:
    return int(Path(f"/sys/class/infiniband/rxe{i}/ports/1/hw_counters/{name}").read_text())


def switch_counters() -> dict:
    """The switch's counters, asked from h0 over the lab network through the switch itself."""
    p = run_in_host(0, sys.executable, "-m", "switch.ctl", "--addr", CONTROLLER, "counters")
    return json.loads(p.stdout)


def port_counter(counters: dict, port: int, name: str) -> int:
    return int(counters["ports"][str(port)][name])


def wait_for(pred, timeout: float, what: str, interval: float = 0.2) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
