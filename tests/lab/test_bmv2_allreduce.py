"""In-network allreduce through BMv2 running switch/p4, in the same lab boot as the other lab
tests: the module switches the lab's switch to BMv2 (tests/lab/labswitch.py) and back to the
software switch afterwards. The user program is unchanged (allreduce_worker.py calls
`netreduce.init()` with defaults): init asks the controller for BMv2's limits and fits the
"inc" ring to path MTU 256 (4 KiB messages, a 537 ms ACK timeout) by itself. The ring's switch counters prove BMv2 summed.
A transport fault through BMv2 costs one call (issue 40).

Inside the lab (any --switch; needs p4c and BMv2 on the machine):
    scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_bmv2_allreduce.py
"""
from __future__ import annotations

import json
import time
from typing import Iterator

import pytest

from flowctl.plan import FlowConfig
from tests.conftest import IN_LAB, UNDER_CI
from tests.lab.labhosts import host_loss, python_in_host, switch_counters
from tests.lab.labswitch import (LabSwitch, available_switches, current_switch, restart_switch,
                                 use_switch)
from tests.lab.switchruns import (RECUT_CALLS, check_recut_run, check_retransmissions_seen,
                                  check_switch_run, inc_config, run_recut, show_run)
from tests.lab.test_transport_faults import qp_killed
from tests.lab.workers import run_worker

pytestmark = pytest.mark.lab

BMV2_PATH_MTU = 256                      # switch/p4/limits.p4: 64 int32 per packet
# Element counts, each run as int32 (exact) and float32 (within the bound), at 0% and at
# 1% loss. BMv2 costs ~0.7 ms of CPU per contribution (switch/p4/README.md, "Cost per
# packet"), on the machine's cores that the lab's VM needs too. 64 Ki elements (1025
# packets per rank with the seal: four times the 256-slot pool, 32 in flight per
# connection) proves slot reuse through BMv2, and at 1% loss (~40 frames lost over both
# dtypes) go-back-N through it; 1 MiB proved nothing more for four times CI's time.
BIG = 1 << 16                            # int32[64 Ki] = 256 KiB
SIZES = {"0%": [1, 1000, 16385, BIG],    # 1 element .. 256 KiB
         "1%": [1, 16385, BIG + 1]}      # odd: in place


@pytest.fixture(scope="module")
def bmv2() -> Iterator[LabSwitch | None]:
    """BMv2 as the lab's switch for this module (fresh), the lab's own kind afterwards.
    Outside the lab it does nothing (conftest's guard then skips, or fails under CI)."""
    if not IN_LAB:
        yield None
        return
    if "bmv2" not in available_switches():
        why = ("BMv2 lab tests: scripts/lab.sh found no p4c / simple_switch_grpc on its PATH "
               "(scripts/install.sh --p4 ...)")
        if UNDER_CI:
            pytest.fail(why)
        pytest.skip(why)
    before = current_switch()
    restarted = use_switch("bmv2") or restart_switch("bmv2")
    try:
        yield restarted
    finally:
        use_switch(before)


def test_the_lab_switch_is_bmv2_and_publishes_its_limits(bmv2: LabSwitch) -> None:
    """The restarted switch is BMv2, fresh (no ring) and its Ping carries limits.p4's."""
    assert (bmv2.kind, bmv2.target) == ("bmv2", "bmv2")
    p = python_in_host(0, "-m", "switch.ctl", "ping")
    limits = json.loads(p.stdout)["limits"]
    assert limits["path_mtus"] == [BMV2_PATH_MTU] and limits["max_slots"] == 256, limits
    assert limits["free_rings"] == limits["max_rings"] == 4, limits
    assert (limits["max_in_flight"], limits["ack_timeout"]) == (32, 17), limits
    assert switch_counters()["rings"] == {}
    print(f"\n[bmv2] restart to bmv2 took {bmv2.seconds:.1f} s")


@pytest.mark.parametrize("loss", ["0%", "1%"])
def test_allreduce_through_bmv2_with_init_defaults(bmv2: LabSwitch, loss: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """4 ranks, int32 exact and float32 within the bound (checked by every rank), each
    size of SIZES[loss]; init's defaults fitted to BMv2 and said so; BMv2's ring counters
    show n contributions per packet, every slot emitted, no structural drop (under loss:
    retransmissions seen and served)."""
    run_through_bmv2(capsys, loss, SIZES[loss], ("int32", "float32"))


def run_through_bmv2(capsys: pytest.CaptureFixture[str], loss: str, sizes: list[int],
                     dtypes: tuple[str, ...]) -> None:
    t0 = time.monotonic()
    with host_loss(loss):
        result = run_worker(4, "switch", "--sizes", ",".join(map(str, sizes)),
                            "--dtypes", ",".join(dtypes), "--timed", str(sizes[-1]),
                            timeout=1500)
    seconds = time.monotonic() - t0
    inc = inc_config(result)
    # BMv2's pace (labswitches/bmv2_lab.py): 32 packets in flight per connection, a 537 ms timer
    assert inc == FlowConfig(mtu=BMV2_PATH_MTU, msg_size=16 * BMV2_PATH_MTU,
                             ack_timeout=17), inc
    registered = [line for line in result.ranks[0].output if "registered with the switch" in line]
    assert registered and "bmv2 target: path MTU 256 (the largest it aggregates; 4096 by " \
        "default), message 4096 B (it takes 32 packets in flight per connection; 262144 by " \
        "default), ACK timeout 537 ms (its pace; 67 ms by default)" in registered[0], \
        result.ranks[0].output
    # under loss BMv2's egress queues (64 frames each by default) may overflow during a
    # go-back-N storm: a result replica lost there is never counted, and the ranks' own
    # retransmission brings it (once in 140 k results at 4 MiB and 1% loss)
    counters = check_switch_run(result, 4, sizes, inc, dtypes, queue_drops=loss != "0%")
    if loss != "0%":
        check_retransmissions_seen(counters)
    show_run(capsys, f"bmv2 allreduce, {loss} loss, {seconds:.0f} s", result, counters)


def test_bmv2_follows_a_re_cut_stream(bmv2: LabSwitch, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    """As test_switch_allreduce's test_a_re_cut_stream_is_followed, through switch/p4 on
    BMv2 (rule 7a in P4: conn_recut, results at psn0 + shift + k)."""
    ring = check_recut_run(run_recut(4, 1, timeout=900), 4, 1)
    with capsys.disabled():
        print(f"\n[recut] bmv2: {RECUT_CALLS - 1} re-cuts of rank 1's stream followed, "
              f"{RECUT_CALLS} calls exact; ring {ring}")


def test_a_qp_moved_to_error_through_bmv2_costs_one_call(
        bmv2: LabSwitch, capsys: pytest.CaptureFixture[str]) -> None:
    """test_transport_faults' QP to ERROR on "inc" while BMv2 aggregates (int32[16 Ki]: 256
    packets per rank and call at BMv2's path MTU): every call exact, the fault recovered
    ("inc" rebuilt at once and registered with BMv2 again, the call redone through it) and
    named in rank 0's log, where the registration names BMv2."""
    out = qp_killed("inc", 1 << 14, capsys)
    assert any("registered with the switch" in line and "bmv2 target" in line
               for line in out), out[-40:]
