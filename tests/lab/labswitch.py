"""Which switch the lab runs, asked from the hosts' side: `use_switch`, `restart_switch`,
`restart_tor` (one ToR of the fabric).

scripts/lab.sh runs the switch outside the hosts (in namespace nrlab, on the machine) and a
supervisor beside it that restarts it on request: this module writes "ID KIND" to
$NR_LAB_DIR/switch.request and waits for "ID ok KIND PID" / "ID error WHY" in
$NR_LAB_DIR/switch.reply (the directory is shared with the VM). A restart keeps the ports
and the controller's address and starts from fresh state: no ring registered, counters at
zero, the software switch's MAC table empty.

Invariant: `restart_switch` returns only once the new switch's controller answers Ping from
host h0 over the lab network (through the switch itself), and within `timeout` seconds;
anything else is a `LabSwitchError` saying what was asked, what happened and where to look.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.lab.labhosts import CONTROLLER, python_in_host

KINDS = ("soft", "native", "bmv2", "racks")   # racks: "racks:R[:PCT]", the fabric (--racks)
RESTART_TIMEOUT = 180.0      # s: stop, (first bmv2 start: compile switch/p4), start, Ping
POLL = 0.2
READ_RETRY = 5.0             # s: lab.sh replaces its files by a rename; a read over 9p that
                             # races the rename fails (ENODATA) and is retried this long


class LabSwitchError(RuntimeError):
    """The lab's switch could not be restarted as asked."""


@dataclass(frozen=True)
class LabSwitch:
    kind: str            # "soft", "native", "bmv2" or "racks:R[:PCT]"
    pid: int             # the switch process on the machine (its own process group)
    target: str          # what its controller's Ping says ("software", "native", "bmv2" or
                         # "fabric")
    seconds: float       # how long the restart took, Ping included


def lab_dir() -> Path:
    d = os.environ.get("NR_LAB_DIR")
    if not d:
        raise LabSwitchError("NR_LAB_DIR is not set: switch restarts work only inside "
                             "scripts/lab.sh")
    return Path(d)


def available_switches() -> tuple[str, ...]:
    """The kinds scripts/lab.sh can start here (bmv2 only where p4c and BMv2 are installed)."""
    return tuple(os.environ.get("NR_LAB_SWITCHES", "soft").split())


def lab_switch() -> str:
    """The single switch's kind scripts/lab.sh started the lab with ("soft" or "native":
    NR_LAB_SWITCH), which tests that visit another kind come back to."""
    kind = os.environ.get("NR_LAB_SWITCH", "native")
    return kind if kind in ("soft", "native") else "native"


def current_switch() -> str:
    """The kind of switch running now ("soft", "native", "bmv2", "racks:R:PCT" or "bridge")."""
    path = lab_dir() / "switch.kind"
    deadline = time.monotonic() + READ_RETRY
    while True:
        try:
            return path.read_text().strip()
        except OSError as e:
            if isinstance(e, FileNotFoundError) or time.monotonic() > deadline:
                raise LabSwitchError(f"cannot read {path} (written by scripts/lab.sh): "
                                     f"{e}") from None
        time.sleep(POLL)


def restart_switch(kind: str | None = None, timeout: float = RESTART_TIMEOUT) -> LabSwitch:
    """Stop the lab's switch and start `kind` (None: the kind running now) on the same
    ports, with the same controller address and fresh state; return once it answers."""
    kind = kind or current_switch()
    family = kind.split(":")[0]
    if family not in KINDS:
        raise LabSwitchError(f"restart_switch({kind!r}): the lab's switch is one of {KINDS}")
    if family not in available_switches():
        raise LabSwitchError(f"restart_switch({kind!r}): scripts/lab.sh can start only "
                             f"{available_switches()} here (bmv2 needs p4c and "
                             f"simple_switch_grpc on its PATH: scripts/install.sh)")
    t0 = time.monotonic()
    status, _, rest = _ask("switch", kind, t0 + timeout).partition(" ")
    if status != "ok":
        raise LabSwitchError(f"restart_switch({kind!r}): scripts/lab.sh says: {rest}")
    _, _, pid = rest.partition(" ")
    target = _ping(kind, t0 + timeout)
    return LabSwitch(kind, int(pid), target, time.monotonic() - t0)


def canonical(kind: str) -> str:
    """`kind` with a fabric's defaults spelt out ("racks:2" and "racks:2:0" are
    "racks:2:0:soft:soft"): two names of one switch compare equal."""
    family, _, rest = kind.partition(":")
    if family != "racks" or not rest:
        return kind
    parts = rest.split(":")
    r, loss, spine, tors = (parts + ["0", "soft", "soft"][len(parts) - 1:])[:4]
    try:
        loss = f"{float(loss):g}"
    except ValueError:
        return kind                     # restart_switch names what is wrong with it
    return f"racks:{r}:{loss}:{spine}:{tors}"


def restart_tor(j: int, timeout: float = RESTART_TIMEOUT) -> float:
    """Restart ToR `j` of the lab's fabric (the switch kind "racks:..."), fresh state, same
    ports (labswitches/fabric_lab.py serves it: fabric.request / fabric.reply in $NR_LAB_DIR);
    returns the seconds it took, once the fabric's controller answers Ping from h0."""
    kind = current_switch()
    if not kind.startswith("racks:"):
        raise LabSwitchError(f"restart_tor({j}): the lab runs a {kind!r} switch, not a fabric")
    t0 = time.monotonic()
    status, _, rest = _ask("fabric", f"tor {j}", t0 + timeout).partition(" ")
    if status != "ok":
        raise LabSwitchError(f"restart_tor({j}): labswitches/fabric_lab.py says: {rest}")
    _ping(kind, t0 + timeout)
    return time.monotonic() - t0


def restart_aggregator(j: int, timeout: float = RESTART_TIMEOUT) -> float:
    """Restart one-armed aggregator `j` of a lab run with --aggregators (fresh state, same
    address: scripts/lab_aggregators.sh); the seconds it took, once its controller (entry
    `j` of $NR_CONTROLLER's list) answers Ping from h0."""
    t0 = time.monotonic()
    status, _, rest = _ask("switch", f"agg:{j}", t0 + timeout).partition(" ")
    if status != "ok":
        raise LabSwitchError(f"restart_aggregator({j}): scripts/lab.sh says: {rest}")
    _ping(f"agg:{j}", t0 + timeout, os.environ["NR_CONTROLLER"].split(",")[j])
    return time.monotonic() - t0


def use_switch(kind: str, timeout: float = RESTART_TIMEOUT) -> LabSwitch | None:
    """Make `kind` the lab's switch: restarted only when another kind runs (None then)."""
    if canonical(current_switch()) == canonical(kind):
        return None
    return restart_switch(kind, timeout)


def _ask(who: str, what: str, deadline: float) -> str:
    """Put "ID `what`" in $NR_LAB_DIR/`who`.request (by a rename) and return the text
    after "ID " of the answer in `who`.reply."""
    d = lab_dir()
    rid = uuid.uuid4().hex[:12]
    tmp = d / f"{who}.request.{rid}"
    tmp.write_text(f"{rid} {what}\n")
    tmp.rename(d / f"{who}.request")
    return _wait_reply(d / f"{who}.reply", rid, what, deadline)


def _wait_reply(path: Path, rid: str, kind: str, deadline: float) -> str:
    """The text after "ID " of the supervisor's answer to request `rid`."""
    while time.monotonic() < deadline:
        try:
            line = path.read_text().strip()
        except OSError:      # absent yet, or replaced while read (9p: ENODATA): poll on
            line = ""
        if line.startswith(rid + " "):
            return line[len(rid) + 1:]
        time.sleep(POLL)
    if (path.parent / "switch.request").exists():
        why = "the request was never picked up: is the supervisor running?"
    else:
        why = "the request was taken, no answer yet"
    raise LabSwitchError(f"restart_switch({kind!r}): no answer from scripts/lab.sh's switch "
                         f"supervisor in time ({why}; the switch's log is "
                         f"{path.parent / 'switch.log'})")


def _ping(kind: str, deadline: float, controller: str = CONTROLLER) -> str:
    """The target name the restarted controller's Ping gives, asked from h0."""
    last = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LabSwitchError(f"restart_switch({kind!r}): the {kind} switch is up but its "
                                 f"controller at {controller} does not answer Ping from h0: "
                                 f"{last}")
        try:
            # forked by h0's fork server (its imports paid); the whole time left: a cold
            # `python -m switch.ctl` took 10-17 s in an idle lab, and beside 4 busy torch
            # ranks none of six 30 s attempts finished (the RPC itself gives up after 5 s)
            p = python_in_host(0, "-m", "switch.ctl", "--addr", controller, "--timeout", "5",
                               "ping", timeout=left, check=False)
        except subprocess.TimeoutExpired:
            last = "switch.ctl ping did not return in time"
            continue
        if p.returncode == 0:
            return json.loads(p.stdout)["target"]
        last = (p.stderr or p.stdout).strip()
        time.sleep(POLL)
