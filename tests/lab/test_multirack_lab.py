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

from labswitches.fabric_lab import FABRIC_ACK_TIMEOUT
from tests.conftest import UNDER_CI
from tests.lab.fabricruns import RACKS, check_fabric_run, rack_sizes, spine_link_packets
from tests.lab.labhosts import HOSTS, host_loss, python_in_host
from tests.lab.labswitch import available_switches, current_switch, restart_switch, use_switch
from tests.lab.switchruns import inc_config
from tests.lab.workers import lines, run_worker

pytestmark = pytest.mark.lab

WORLDS = [4] if HOSTS < 6 else [6, 5]      # ranks of each run (hosts 0..n-1)


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
