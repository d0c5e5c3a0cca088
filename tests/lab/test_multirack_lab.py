"""In-network allreduce over the lab's two-tier fabric (docs/multirack.md): 2 racks, one ToR
process per rack, a spine process, the fabric's controller on the job's address; the hosts
run the unchanged user program (netreduce.init + allreduce, allreduce_worker.py).

The lab boots once for all lab tests: this module restarts the lab's switch as the fabric
("racks:2", "racks:2:1" for 1% loss on the ToR-spine links; tests/lab/labswitch.py) and
back to the single switch at the end. Which fabrics it tests follows the boot's hosts: the
CI boot (4 hosts) runs 2 racks x 2; a boot of 6 hosts (`scripts/lab.sh --hosts 6 --racks 2`)
runs 2 racks x 3 and 5 hosts (3 + 2, uneven).
Sums are checked against numpy by every rank (allreduce_worker.py); the fabric's counters
show that each ToR's partials crossed its spine link (one per slot, a few more under loss).
"""
from __future__ import annotations

import json
from typing import Iterator

import pytest

from conftest import UNDER_CI
from flowctl.plan import FlowConfig
from netreduce.tools.launch import LaunchResult
from tests.lab.labhosts import HOSTS, python_in_host, switch_counters
from tests.lab.labswitch import available_switches, current_switch, restart_switch, use_switch
from tests.lab.test_allreduce import lines, run_worker
from tests.lab.test_bmv2_allreduce import inc_config
from tests.lab.test_switch_allreduce import (CONFIG, STRUCTURAL_DROPS, expected_packets,
                                             host_loss)
from labswitches.fabric_lab import FABRIC_ACK_TIMEOUT

pytestmark = pytest.mark.lab

RACKS = 2
WORLDS = [4] if HOSTS < 6 else [6, 5]      # ranks of each run (hosts 0..n-1)


def rack_sizes(n: int) -> list[int]:
    """What scripts/lab.sh --racks does with the boot's hosts, cut to ranks 0..n-1."""
    sizes = [HOSTS // RACKS + (j < HOSTS % RACKS) for j in range(RACKS)]
    first = sizes[0]
    return [min(first, n), max(0, n - first)]


@pytest.fixture(scope="module")
def fabric() -> Iterator[None]:
    """The software fabric (a boot of `scripts/lab.sh --racks 2` has it already)."""
    before = current_switch()
    use_switch(f"racks:{RACKS}")
    try:
        yield
    finally:
        use_switch(before)


def test_the_fabric_publishes_its_pace(fabric: None) -> None:
    """The job's one controller address answers Ping with the fabric's limits: rings of
    up to 32 ranks per ToR, and the fabric's ACK timeout (labswitches/fabric_lab.py)."""
    p = python_in_host(0, "-m", "switch.ctl", "ping")
    limits = json.loads(p.stdout)["limits"]
    assert limits["ack_timeout"] == FABRIC_ACK_TIMEOUT == 16, limits
    assert limits["max_ranks"] == 32 * RACKS and 4096 in limits["path_mtus"], limits


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
    test_switch_allreduce.check_switch_run says), no structural drop; every software ToR
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


@pytest.mark.parametrize("n", WORLDS)
def test_fabric_allreduce_matches_numpy(fabric: None, n: int,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """int32 and float32 of 1 element, 1000 elements and, at the largest world, 1 MiB (CI's
    time budget: 16 MiB, 64 times the slot pool, proves nothing 1 MiB's 4 pools do not, and
    costs ~2 min; docs/multirack.md has a 16 MiB run)."""
    sizes = [1, 1000] + ([2**18] if n == max(WORLDS) else [])
    before = spine_link_packets()
    result = run_worker(n, "switch", "--sizes", ",".join(map(str, sizes)), "--timed", "0",
                        timeout=900)
    counters = check_fabric_run(result, n, sizes, before, lossy=False)
    with capsys.disabled():
        print(f"\n[fabric {rack_sizes(n)}, no loss] counters {counters}")


@pytest.mark.parametrize("where", ["hosts", "spine-links"])
def test_fabric_allreduce_survives_one_percent_loss(fabric: None, where: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """256 KiB + 4 B, int32 and float32, with 1% loss on every host link (netem in the
    hosts) or on every ToR-spine link (both ways: the switches' --tx-loss)."""
    n = max(WORLDS)
    sizes = [2**16 + 1]
    if where == "spine-links":
        restart_switch(f"racks:{RACKS}:1")
    try:
        before = spine_link_packets()
        with host_loss("1%" if where == "hosts" else "0%"):
            result = run_worker(n, "switch", "--sizes", str(sizes[0]), "--timed", "0",
                                timeout=900)
        counters = check_fabric_run(result, n, sizes, before, lossy=True)
        lost = sum(c["tx_lost"] for c in spine_link_packets().values())
        assert (lost > 0) == (where == "spine-links"), lost
    finally:
        if where == "spine-links":
            restart_switch(f"racks:{RACKS}")
    with capsys.disabled():
        print(f"\n[fabric {rack_sizes(n)}, 1% loss on {where}] counters {counters}; "
              f"uplink frames lost {lost}")


def test_ring_algorithm_on_the_fabric(fabric: None) -> None:
    """algo="ring" through the same fabric: the switches only forward, sums exact."""
    n = max(WORLDS)
    result = run_worker(n, "correctness", "--algo", "ring", "--sizes", "1,1000,65536",
                        "--timed", "0", timeout=900)
    assert result.ok, f"exit {result.exit_code}"
    for r in range(n):
        assert lines(result, r, "OK correctness"), result.ranks[r].output


def test_fabric_with_a_bmv2_spine(fabric: None, capsys: pytest.CaptureFixture[str]) -> None:
    """The spine as spine.p4 on BMv2 under the software ToRs (kind "racks:2:0:bmv2"): the
    fabric publishes what all its switches take (path MTU 256 only) and BMv2's pace, and
    the unchanged user program sums exactly through it, int32 and float32, without loss
    and with 1% loss on every host link. Sizes are small: BMv2 spends ~1.5 ms of CPU per
    partial (switch/p4/README.md)."""
    if "bmv2" not in available_switches():
        why = "no p4c / simple_switch_grpc on lab.sh's PATH: no BMv2 spine"
        if UNDER_CI:
            pytest.fail(why)
        pytest.skip(why)
    n = min(WORLDS)          # 2 + 2 in the CI boot, the uneven 3 + 2 in a boot of 6 hosts
    restart_switch(f"racks:{RACKS}:0:bmv2")
    try:
        limits = json.loads(python_in_host(0, "-m", "switch.ctl", "ping").stdout
                            )["limits"]
        assert limits["path_mtus"] == [256], limits
        assert (limits["max_in_flight"], limits["ack_timeout"]) == (32, 18), limits
        sizes = [1, 1000, 2**14 + 1]
        before = spine_link_packets()
        result = run_worker(n, "switch", "--sizes", ",".join(map(str, sizes)), "--timed", "0",
                            timeout=900)
        inc = inc_config(result)          # fitted to the BMv2 spine: path MTU 256, its pace
        assert (inc.mtu, inc.ack_timeout) == (256, 18), inc
        clean = check_fabric_run(result, n, sizes, before, lossy=False, config=inc)
        before = spine_link_packets()
        with host_loss("1%"):
            result = run_worker(n, "switch", "--sizes", str(2**14 + 3), "--timed", "0",
                                timeout=900)
        lossy = check_fabric_run(result, n, [2**14 + 3], before, lossy=True, config=inc)
    finally:
        restart_switch(f"racks:{RACKS}")
    with capsys.disabled():
        print(f"\n[fabric {rack_sizes(n)}, BMv2 spine] counters {clean}; 1% host loss {lossy}")
