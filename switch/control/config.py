"""The controller's configuration (what the switch's command line sets) and its checks.

Invariant: a `ControllerConfig` that constructs is one the controller can serve: its limits
in range, its admins principals of its token file, and secure by default (the class doc).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from nr_contract.spec import DEFAULT_SLOTS, MAX_ACK_TIMEOUT, RXE_MAX_INFLIGHT
from nr_contract.tokens import HostsPolicy, read_hosts_policy, read_token_file
from switch.control import validate

MAX_RINGS_CEILING = 1024           # Counters without detail stays < 300 KiB at this many rings
DEFAULT_MAX_RINGS = 64
DEFAULT_MAX_SLOT_MEMORY = 256 << 20
DEFAULT_LEASE_MS = 15_000
DEFAULT_CALLS_PER_SECOND = 50.0    # per principal (bursts of twice that)
DEFAULT_TARGET_CALLS = 2           # per principal: its calls at the target at once


@dataclass(frozen=True)
class ControllerConfig:
    """What the switch's command line configures about its controller.

    Invariant (secure by default): without `insecure`, a config has credentials (`tokens`)
    and, when they name two principals or more, a hosts policy that binds each principal to
    its hosts (nobody's hosts are first come, first served); `insecure` is the one way to
    a controller that asks for no credentials (every caller is ANONYMOUS)."""

    tokens: Optional[dict[str, str]] = None      # secret -> principal; None: only if insecure
    # principals that see every ring in Counters; any other sees its own rings only
    admins: frozenset[str] = frozenset()
    # principal -> the host addresses its rings may use (None: one principal, any address)
    hosts_policy: Optional[HostsPolicy] = None
    insecure: bool = False        # no credentials asked, clear text anywhere: said in so many words
    max_rings: int = DEFAULT_MAX_RINGS
    max_slot_memory: int = DEFAULT_MAX_SLOT_MEMORY   # bytes; 0: no limit
    default_lease_ms: int = DEFAULT_LEASE_MS
    default_slots: int = DEFAULT_SLOTS
    max_in_flight: int = 0        # the target's pace (TargetLimits); 0: no requirement
    ack_timeout: int = 0
    capacity: int = 0             # this aggregator's share of a sharded call (TargetLimits)
    calls_per_second: float = DEFAULT_CALLS_PER_SECOND    # per principal; 0: no limit
    target_calls: int = DEFAULT_TARGET_CALLS     # per principal, at the target at once

    def __post_init__(self) -> None:
        if self.target_calls < 1:
            raise ValueError(f"target_calls {self.target_calls} is not at least 1")
        if not 0 <= self.calls_per_second <= 1e6:
            raise ValueError(f"calls_per_second {self.calls_per_second} is not in 0..1e6")
        if not 1 <= self.max_rings <= MAX_RINGS_CEILING:
            raise ValueError(f"max_rings {self.max_rings} is not in 1..{MAX_RINGS_CEILING} "
                             "(Counters must stay under the 4 MiB message limit)")
        if self.max_slot_memory < 0:
            raise ValueError(f"max_slot_memory {self.max_slot_memory} is negative")
        if not 0 <= self.max_in_flight <= RXE_MAX_INFLIGHT:
            raise ValueError(f"max_in_flight {self.max_in_flight} is not in "
                             f"0..{RXE_MAX_INFLIGHT}")
        if not 0 <= self.capacity < 2**32:
            raise ValueError(f"capacity {self.capacity} is not in 0..2^32-1")
        if not 0 <= self.ack_timeout <= MAX_ACK_TIMEOUT:
            raise ValueError(f"ack_timeout {self.ack_timeout} is not in 0..{MAX_ACK_TIMEOUT}")
        unknown = self.admins - set((self.tokens or {}).values())
        if unknown:
            raise ValueError(f"admin principal(s) {', '.join(sorted(unknown))} not in the "
                             "token file")
        if not validate.MIN_LEASE_MS <= self.default_lease_ms <= validate.MAX_LEASE_MS:
            raise ValueError(f"default lease {self.default_lease_ms} ms is not in "
                             f"{validate.MIN_LEASE_MS}..{validate.MAX_LEASE_MS}")
        self._check_credentials()

    def _check_credentials(self) -> None:
        """The invariant of the class doc; ValueError says what is missing."""
        if self.tokens is None and not self.insecure:
            raise ValueError("no credentials: give the controller a token file (or run it "
                             "insecure, in so many words)")
        principals = set((self.tokens or {}).values())
        if len(principals) > 1 and self.hosts_policy is None and not self.insecure:
            raise ValueError(f"{len(principals)} principals but no hosts policy: each "
                             "principal's hosts must be named (--hosts-policy FILE, lines "
                             "'PRINCIPAL NET [NET ...]'), else any of them could take "
                             "another's hosts first")
        strangers = set(self.hosts_policy or {}) - principals
        if self.tokens is not None and strangers:
            raise ValueError(f"hosts policy: principal(s) {', '.join(sorted(strangers))} not "
                             "in the token file")

    @classmethod
    def with_token_file(cls, token_file: Optional[str | Path],
                        hosts_policy: Optional[str | Path] = None,
                        **kw: Any) -> "ControllerConfig":
        tokens = None
        if token_file is not None:
            tokens = {secret: who for who, secret in read_token_file(token_file)}
        policy = read_hosts_policy(hosts_policy) if hosts_policy is not None else None
        return cls(tokens=tokens, hosts_policy=policy, **kw)
