"""What a switch process prints and writes about its counters (SIGUSR1 and exit)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from switch.dataplane.ports import format_port_table
from switch.control.private import write_private


def report(counters: dict[str, Any], stats_file: Optional[Path]) -> None:
    """The port table to stderr; every counter as JSON to `stats_file`, replaced atomically
    (a reader never sees a half-written file), mode 0600 and never through a link: it holds
    every ring's RETH (`switch.control.private.write_private`)."""
    print(format_port_table(counters["ports"]), file=sys.stderr, flush=True)
    if stats_file:
        write_private(stats_file, json.dumps(counters, indent=1).encode())
