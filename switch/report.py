"""What a switch process prints and writes about its counters (SIGUSR1 and exit)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

from switch.dataplane.ports import format_port_table


def report(counters: dict[str, Any], stats_file: Optional[Path]) -> None:
    """The port table to stderr; every counter as JSON to `stats_file`, replaced atomically
    (a reader never sees a half-written file)."""
    print(format_port_table(counters["ports"]), file=sys.stderr, flush=True)
    if stats_file:
        tmp = stats_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(counters, indent=1))
        os.replace(tmp, stats_file)
