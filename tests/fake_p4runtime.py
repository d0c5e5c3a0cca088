"""A fake P4Runtime session (the name says it): what switch.control's BMv2 targets write,
recorded as a P4Runtime server would accept it (a duplicate entry fails), counters settable;
no switch behind it. The unit tests of the BMv2, spine and ToR targets share it."""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from switch.control.bmv2 import McGroup, TableEntry


class FakeSession:
    """Records writes like a P4Runtime server would accept them; counters are settable."""

    def __init__(self) -> None:
        self.entries: dict[tuple, TableEntry] = {}
        self.groups: dict[int, McGroup] = {}
        self.log: list[tuple[str, str]] = []
        self.values: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
        self.fail_table: Optional[str] = None
        self.closed = False

    def insert(self, entry: TableEntry) -> None:
        key = (entry.table, entry.match)
        assert key not in self.entries, f"ALREADY_EXISTS {key}"
        if entry.table == self.fail_table:
            raise RuntimeError("INTERNAL: table full")
        self.entries[key] = entry
        self.log.append(("insert", entry.table))

    def delete(self, entry: TableEntry) -> None:
        del self.entries[entry.table, entry.match]
        self.log.append(("delete", entry.table))

    def insert_group(self, group: McGroup) -> None:
        assert group.group_id not in self.groups
        self.groups[group.group_id] = group
        self.log.append(("insert", f"group {group.group_id}"))

    def delete_group(self, group_id: int) -> None:
        del self.groups[group_id]
        self.log.append(("delete", f"group {group_id}"))

    def read_counter(self, name: str) -> dict[int, tuple[int, int]]:
        return dict(self.values[name])

    def close(self) -> None:
        self.closed = True
