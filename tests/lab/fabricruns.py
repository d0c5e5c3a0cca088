"""What a lab job through the two-tier fabric (docs/multirack.md) must show: the ring's
counters per tier (every contribution counted once at its ToR, one partial per slot from
each ToR counted once at the spine, every slot totalled once) and the traffic of each
ToR-spine link, read from the port counters of both its ends."""
from __future__ import annotations

import json

from flowctl.plan import FlowConfig
from netreduce.tools.launch import LaunchResult
from tests.lab.labhosts import HOSTS, switch_counters
from tests.lab.switchruns import CONFIG, STRUCTURAL_DROPS, expected_packets
from tests.lab.workers import lines

RACKS = 2                              # the lab's fabric: scripts/lab.sh --racks 2


def rack_sizes(n: int) -> list[int]:
    """What scripts/lab.sh --racks does with the boot's hosts, cut to ranks 0..n-1."""
    sizes = [HOSTS // RACKS + (j < HOSTS % RACKS) for j in range(RACKS)]
    first = sizes[0]
    return [min(first, n), max(0, n - first)]


def spine_link_packets() -> dict[str, dict[str, int]]:
    """The port counters of both ends of every ToR-spine link, by fabric port name: each
    ToR's uplink ("tor0:uplink") and the spine's ToR ports ("spine:1" .. "spine:R")."""
    ports = switch_counters()["ports"]
    ends = {f"spine:{j + 1}" for j in range(RACKS)}
    return {p["ifname"]: {k: int(v) for k, v in p.items() if k != "ifname"}
            for p in ports.values() if p["ifname"].endswith(":uplink") or p["ifname"] in ends}


def check_tiers(counters: dict[str, int], racks: list[int], p: int) -> None:
    """Each contribution counted once per tier (the fabric's dotted counters,
    switch/control/fabric.py `tier_counters`), `racks`: the ring's ranks per ToR, `p` its
    packets per connection (= slots): ToR j aggregated racks[j] x p contributions, sent one
    partial per slot; the spine took one partial per slot from each ToR and totalled each
    slot once. Rank 0 reads them after its last result, which needed every slot's total:
    exact under loss too (a duplicate is a drop or a resend, never counted again)."""
    tors = [j for j, local in enumerate(racks) if local]
    for j in tors:
        assert counters[f"tor{j}.aggregated"] == racks[j] * p, (j, p, counters)
        assert counters[f"tor{j}.partials_sent"] == p, (j, p, counters)
        assert counters[f"spine.per_tor.{j}.partials"] == p, (j, p, counters)
    assert counters["spine.completed"] == p, (p, counters)
    for drop in ("drop_mismatch", "drop_wrong_port"):
        assert counters[f"spine.{drop}"] == 0, counters
    for j in tors:
        for drop in ("drop_total_length", "drop_total_headers", "drop_total_misdirected"):
            assert counters[f"tor{j}.{drop}"] == 0, (j, counters)


def check_fabric_run(result: LaunchResult, n: int, sizes: list[int],
                     before: dict[str, dict[str, int]], lossy: bool,
                     config: FlowConfig = CONFIG, racks: list[int] | None = None,
                     queue_drops: bool = False) -> dict[str, int]:
    """Every rank passed (exact sums); the fabric's ring counters: every contribution
    exactly once per tier (`check_tiers`; `racks`: the ring's ranks per ToR, by default
    `rack_sizes(n)`), every connection's result sent (`queue_drops`: BMv2 ToRs, whose
    egress queues may lose a result replica under a go-back-N storm before counting it, as
    switchruns.check_switch_run says), no structural drop; every software ToR
    received at least one total per slot of every call (a BMv2 switch does not count
    inter-switch packets at its ports)."""
    assert result.ok, f"exit {result.exit_code}"
    for r in range(n):
        assert lines(result, r, "OK switch"), result.ranks[r].output
    (raw,) = lines(result, 0, "SWITCH_RING ")
    counters = json.loads(raw)
    p = expected_packets(sizes, n, config)
    assert counters["aggregated"] == n * p, (counters, p)
    check_tiers(counters, racks or rack_sizes(n), p)
    if queue_drops:
        assert counters["results_sent"] <= n * p \
            <= counters["results_sent"] + counters["retransmits_served"], (counters, p)
    else:
        assert counters["results_sent"] >= n * p, (counters, p)
    if not lossy and not queue_drops:
        assert counters["results_sent"] == n * p, (counters, p)
    for drop in STRUCTURAL_DROPS:
        assert counters[drop] == 0, counters
    after = spine_link_packets()
    assert len(after) == 2 * RACKS, after
    for link, c in after.items():       # a ToR receives totals, the spine partials
        if "interswitch_packets" not in c:          # a BMv2 switch does not count them
            continue
        totals = c["interswitch_packets"] - before.get(link, {}).get("interswitch_packets", 0)
        assert totals >= p - 2 * 64, (link, totals, p)     # the last totals may still come
    return counters
