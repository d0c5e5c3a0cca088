"""Calls in flight (issue 41): an asynchronous caller's next call has its metadata records
travel on "inc" right behind the running switch call's data, so that its agreement arrives
with that call's sums and its data can follow at once (netreduce/comm.py, `_behind`).

Invariants (docs/reliability.md, "Switch restarts"):
- the wire order on "inc" -- a call's data, then the next call's records -- is the same
  whenever a rank posts them, so each rank decides alone whether its records go ahead;
  the switch's slots are taken in that one order, so no call waits for a slot a later
  call holds, and the records go ahead only where they fit the window with the data;
- `in_flight` is alike on every rank (each record says so: meta.IN_FLIGHT; a mismatch is
  `AllreduceMismatch`): with in_flight > 1 call seq works in workspace `slot(seq)`, so
  the next call's workspace is not the running call's;
- records that went early (meta.AHEAD) prove only that every rank posted the previous
  call's data, not that it completed it: the switch-away protocol keeps the last two
  switch calls' wire words, and a call ending without data on "inc" exchanges its records
  once more (comm.py `_confirm`), so settle positions stay k* or k*+1;
- any settle voids the records ahead (its "inc" QPs go to ERROR): their call starts afresh.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from flowctl.plan import FlowConfig, MessagePlan
from netreduce.algorithms.switch import wire_bytes
from netreduce.meta import RECORD_STRIDE, CallMeta
from netreduce.workspace import RegisteredMemory

IN_FLIGHT_ENV = "NR_IN_FLIGHT"
DEFAULT_IN_FLIGHT = 1     # asynchronous calls in flight (docs/reliability.md, "Switch restarts")


def in_flight_setting(in_flight: int | None) -> int:
    """`in_flight`, else $NR_IN_FLIGHT, else DEFAULT_IN_FLIGHT; ValueError unless >= 1."""
    raw: object = in_flight if in_flight is not None else \
        os.environ.get(IN_FLIGHT_ENV, DEFAULT_IN_FLIGHT)
    try:
        value = int(raw)      # type: ignore[call-overload]
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"netreduce: in_flight (${IN_FLIGHT_ENV}) must be an integer >= 1, "
                         f"not {raw!r}")
    return value


def slot(seq: int, in_flight: int) -> int:
    """The workspace of call `seq`: calls in flight alternate two."""
    return seq % 2 if in_flight > 1 else 0


def fits_window(count: int, world_size: int, config: FlowConfig) -> bool:
    """Do a switch call's data (`count` int32 wire words and the seal) and the next call's
    records fit the "inc" window together? Else the records would wait for its credits
    (the RC model measured 3 % slower than after the data, at 256 KiB)."""
    return len(MessagePlan(wire_bytes(count, world_size), config.msg_size)) + \
        len(MessagePlan(world_size * RECORD_STRIDE, config.msg_size)) <= config.window


@dataclass(frozen=True)
class Ahead:
    """The records of the next call, posted behind the running call's data: the next
    attempt of that call (`call`, a comm._Call) only receives their bank, unless a settle
    voided them first."""

    call: Any
    record: CallMeta
    workspace: RegisteredMemory
