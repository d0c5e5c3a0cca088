"""What the BMv2 targets of a two-tier fabric's roles share (switch/control/bmv2_spine.py's
`Bmv2SpineTarget`, switch/control/bmv2_tor.py's `Bmv2TorTarget`), on top of `Bmv2Device`:
their rings by id, each with its index, epoch, plan (a multicast group and table entries in
install order) and the counter values at registration; the registration's common checks
(idempotent, one ring per 32-bit tag, clashes the role names); the inter-switch drop
counters relative to the target's start; epoch-tagged per-ring registers read over Thrift.

Invariant: a ring is in `_rings` exactly while its group and entries are installed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from nr_contract.spec import PSN_MASK
from switch.control.bmv2 import Bmv2Device, McGroup, RegisterReader, Session, TableEntry
from switch.dataplane.interswitch import ring_tag
from switch.p4.program import Contract

EPOCH_SHIFTS = {"ring_next": 24, "tor_skipped": 32}   # register -> bits below its epoch


@dataclass(frozen=True)
class RolePlan:
    """What one ring installs: its multicast group, then `install_order`."""

    group: McGroup
    install_order: tuple[TableEntry, ...]


@dataclass(frozen=True)
class RoleRing:
    args: tuple[Any, ...]          # the registration's arguments, ring id first
    index: int
    epoch: int
    plan: RolePlan
    baseline: dict[str, Any]       # counter values at registration


class Bmv2RoleDevice(Bmv2Device):
    """A fabric role's program on one simple_switch_grpc, with the role's `config` (a
    SpineConfig, a TorConfig). Subclasses name their program's `ingress` control, `where`
    (for messages), `interswitch_counter` and `interswitch_names` (its inter-switch drops,
    at limits.p4's NR_ISCTR_* indices). `ports`/`macs`: as Bmv2Device; `read_register`: a
    ThriftRegisters, for the registers P4Runtime cannot read."""

    ingress = ""
    where = ""
    interswitch_counter = ""
    interswitch_names: tuple[str, ...] = ()

    def __init__(self, session: Session, config: Any, ports: dict[int, str],
                 macs: dict[str, int], read_register: Optional[RegisterReader] = None,
                 c: Optional[Contract] = None):
        super().__init__(session, ports, macs, read_register, c, ingress=self.ingress)
        self.config = config
        self._rings: dict[str, RoleRing] = {}
        self._baseline = self._interswitch_raw()

    def _register(self, args: tuple[Any, ...], clash: Callable[[RoleRing], Optional[str]],
                  plan: Callable[[int, int], RolePlan],
                  baseline: Callable[[int], dict[str, Any]]) -> None:
        """Install ring args[0] (a no-op if registered with the same `args`): `clash(other)`
        says why it cannot sit beside another ring (None: it can), `plan(index, epoch)` what
        it installs, `baseline(index)` its counters now."""
        ring_id, tag = args[0], ring_tag(args[0])
        with self._lock:
            if ring_id in self._rings:
                if self._rings[ring_id].args == args:
                    return
                raise ValueError(f"ring {ring_id} is already registered differently")
            for other in self._rings.values():
                if ring_tag(other.args[0]) == tag:
                    raise ValueError(f"ring {ring_id}: its 32-bit tag {tag:#x} is ring "
                                     f"{other.args[0]}'s; choose another ring id")
                why = clash(other)
                if why:
                    raise ValueError(f"ring {ring_id}: {why}")
            index, epoch = self._new_index({r.index for r in self._rings.values()}, ring_id)
            ring_plan = plan(index, epoch)
            values = baseline(index)
            self._write(ring_plan.group, ring_plan.install_order)
            self._rings[ring_id] = RoleRing(args, index, epoch, ring_plan, values)

    def unregister_ring(self, ring_id: str) -> None:
        self._unregister(self._rings, ring_id, f" at the {self.where}")

    def _interswitch_raw(self) -> dict[str, int]:
        return self._counts(self.interswitch_counter,
                            {n: self.c.is_counter_ids[n] for n in self.interswitch_names})

    @property
    def interswitch(self) -> dict[str, int]:
        """The pipeline's `interswitch`: drops of messages no ring takes (and spoofs)."""
        now = self._interswitch_raw()
        return {n: now[n] - self._baseline[n] for n in self.interswitch_names}

    def _ring_register(self, name: str, ring: RoleRing) -> Optional[int]:
        """Register `name` (epoch | value, EPOCH_SHIFTS) of ring's index: its value, 0 if
        another epoch wrote it, None without a reader (or when the read fails)."""
        value = self._read_register(name, ring.index) if self._read_register else None
        if value is None:
            return None
        shift = EPOCH_SHIFTS[name]
        return value & ((1 << shift) - 1) if value >> shift == ring.epoch else 0

    def _next(self, ring: RoleRing, completed: int) -> int:
        """The ring_next register (the spine's next_total, a ToR's next_emit), or without a
        reader derived from `completed` (exact while slots complete in order)."""
        value = self._ring_register("ring_next", ring)
        return completed & PSN_MASK if value is None else value

    def port_counters(self) -> dict[int, dict[str, Any]]:
        """Per port (the fabric's port_counters): BMv2's port counters."""
        return {int(p): c for p, c in self._port_view().items()}
