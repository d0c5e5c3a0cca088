"""Fitting the "inc" ring to the switch's target (netreduce.registration.fit_config and
fit_inc_ring): the path MTU, message size and window the target can aggregate, chosen by
rank 0 before any QP exists and used by every rank; the user's own knobs are never changed."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flowctl.plan import FlowConfig
from netreduce import Communicator, SwitchRegistrationError
from netreduce.registration import fit_config
from tests.fakefabric import SOFTWARE_LIMITS, FakeController, FakeFabric, FakeHost
from tests.ranks import rank_data, run_ranks

BMV2_LIMITS = {"path_mtus": [256], "max_slots": 256, "max_ranks": 32, "max_rings": 4,
               "free_rings": 4, "max_slot_memory": 0, "default_lease_ms": 0,
               "max_in_flight": 0, "ack_timeout": 0}
BMV2_PACE = {**BMV2_LIMITS, "max_in_flight": 32, "ack_timeout": 18}   # labswitches.bmv2_lab's
DEFAULTS = FlowConfig()               # what netreduce.init() asks when given no knobs
NONE: frozenset[str] = frozenset()


def test_defaults_through_bmv2_get_path_mtu_256_and_16k_messages() -> None:
    """256 KiB messages at path MTU 256 would let rxe keep 129 packets unacknowledged:
    2 x 129 rounds up to 512 slots, BMv2 has 256, so the message shrinks to 64 packets."""
    fit = fit_config(DEFAULTS, NONE, 4, "bmv2", BMV2_LIMITS)
    assert (fit.config.mtu, fit.config.msg_size, fit.config.window) == (256, 16384, 2)
    assert fit.choice == ("bmv2 target: path MTU 256 (the largest it aggregates; 4096 by "
                          "default), message 16384 B (its slots hold 128 packets in flight; "
                          "262144 by default)")


def test_a_target_that_takes_the_asked_mtu_changes_nothing() -> None:
    fit = fit_config(DEFAULTS, NONE, 4, "software", SOFTWARE_LIMITS)
    assert fit.config == DEFAULTS and fit.choice == "software target: path MTU 4096"
    # path MTU 256 through the software target: 2 x 129 -> 512 <= its 1024 slots, no change
    assert fit_config(FlowConfig(mtu=256), frozenset({"mtu"}), 4, "software",
                      SOFTWARE_LIMITS).config == FlowConfig(mtu=256)
    between = {**SOFTWARE_LIMITS, "path_mtus": [256, 1024]}
    assert fit_config(FlowConfig(mtu=2048, msg_size=8192), NONE, 2, "t", between).config.mtu \
        == 1024


def test_a_users_mtu_the_target_cannot_take_is_an_error_naming_both() -> None:
    with pytest.raises(ValueError, match=r"^netreduce.init\(mtu=4096\): the bmv2 target "
                                         r"aggregates path MTU 256 only$"):
        fit_config(DEFAULTS, frozenset({"mtu"}), 4, "bmv2", BMV2_LIMITS)
    fit = fit_config(FlowConfig(mtu=256, msg_size=8192), frozenset({"mtu", "msg_size"}), 4,
                     "bmv2", BMV2_LIMITS)
    assert fit.config == FlowConfig(mtu=256, msg_size=8192)
    assert fit.choice == "bmv2 target: path MTU 256"


def test_few_slots_shrink_the_message_then_the_window_unless_the_user_set_them() -> None:
    small = {**BMV2_LIMITS, "max_slots": 32}                  # 16 packets in flight at most
    fit = fit_config(DEFAULTS, NONE, 2, "tiny", small)
    assert (fit.config.mtu, fit.config.msg_size, fit.config.window) == (256, 8 * 256, 2)
    assert "message 2048 B (its slots hold 16 packets in flight; 262144 by default)" \
        in fit.choice
    cfg = FlowConfig(mtu=256, msg_size=256 * 8, window=4)      # 32 packets in flight
    fit = fit_config(cfg, frozenset({"mtu", "msg_size"}), 2, "tiny", small)
    assert (fit.config.msg_size, fit.config.window) == (256 * 8, 2)
    assert fit.choice.endswith("window 2 (its slots hold 16 packets in flight; 4 by default)")
    with pytest.raises(ValueError, match=r"32 packets in flight per connection \(window 4 x "
                                         r"8 packets of 256 B\); the tiny target's 32 slots "
                                         r"hold 16"):
        fit_config(cfg, frozenset({"mtu", "msg_size", "window"}), 2, "tiny", small)


def test_a_slow_targets_pace_shrinks_the_message_and_lengthens_the_ack_timeout() -> None:
    fit = fit_config(DEFAULTS, NONE, 4, "bmv2", BMV2_PACE)
    assert fit.config == FlowConfig(mtu=256, msg_size=16 * 256, window=2, ack_timeout=18)
    assert fit.choice == ("bmv2 target: path MTU 256 (the largest it aggregates; 4096 by "
                          "default), message 4096 B (it takes 32 packets in flight per "
                          "connection; 262144 by default), ACK timeout 1.07 s (its pace; 67 ms "
                          "by default)")
    longer = fit_config(FlowConfig(ack_timeout=20), frozenset({"ack_timeout"}), 4, "bmv2",
                        BMV2_PACE)
    assert longer.config.ack_timeout == 20 and "ACK timeout" not in longer.choice
    with pytest.raises(ValueError, match=r"^netreduce.init\(ack_timeout=14\): the bmv2 target "
                                         r"asks for at least 18 \(1.07 s\)$"):
        fit_config(DEFAULTS, frozenset({"ack_timeout"}), 4, "bmv2", BMV2_PACE)
    with pytest.raises(ValueError, match=r"the bmv2 target takes 32 packets in flight per "
                                         r"connection$"):
        fit_config(FlowConfig(mtu=256, msg_size=64 * 256), frozenset({"mtu", "msg_size",
                                                                     "window"}),
                   4, "bmv2", BMV2_PACE)


def test_more_ranks_than_the_target_takes_is_an_error() -> None:
    with pytest.raises(ValueError, match="^40 ranks; the bmv2 target aggregates at most 32$"):
        fit_config(DEFAULTS, NONE, 40, "bmv2", BMV2_LIMITS)


def test_a_controller_without_limits_gets_the_ring_as_asked() -> None:
    fit = fit_config(DEFAULTS, NONE, 2, "old", None)
    assert fit.config == DEFAULTS and fit.choice == "old publishes no limits: path MTU 4096 as asked"


CFG = FlowConfig(mtu=1024, msg_size=4096, window=2, recv_depth=64, collective_timeout=5.0)


def connect(n: int, controller_args: dict[str, Any], pinned: frozenset[str] = NONE,
            body: Any = None) -> tuple[list[Any], FakeController]:
    fabric = FakeFabric()
    controller = FakeController(fabric, **controller_args)
    return run_ranks(n, body or (lambda comm, host: comm), cfg=CFG, fabric=fabric,
                     controller=controller, pinned=pinned), controller


def test_every_rank_uses_the_fitted_inc_ring_and_the_users_host_ring() -> None:
    """Rank 0 asks once; the registered spec, every rank's "inc" config and QPs use path
    MTU 256; the host ring keeps the asked 1024; allreduce over both is right."""
    count = 3000

    def body(comm: Communicator, host: FakeHost) -> Any:
        sums = {algo: comm.allreduce(rank_data(comm.rank, count, "int32"), algo=algo)
                for algo in ("switch", "ring")}
        return (comm.inc_config, comm.config, host.rings["inc"].config.mtu,
                host.rings["ring"].config.mtu, comm.switch.describe(), sums)

    results, controller = connect(3, {"target": "bmv2", "limits": BMV2_LIMITS}, body=body)
    assert not any(isinstance(r, Exception) for r in results), results
    assert controller.pings == 1
    (spec,) = controller.registered
    assert (spec.mtu, spec.msg_size, spec.window) == (256, 4096, 2)
    want = np.sum([rank_data(r, count, "int32") for r in range(3)], axis=0, dtype=np.int32)
    for inc, ring, inc_mtu, ring_mtu, line, sums in results:
        assert (inc.mtu, ring, inc_mtu, ring_mtu) == (256, CFG, 256, 1024)
        assert line.endswith("(256 slots; bmv2 target: path MTU 256 (the largest it "
                             "aggregates; 1024 by default)): algo='auto' aggregates in the "
                             "network")
        assert all(np.array_equal(s, want) for s in sums.values())


@pytest.mark.parametrize("args, pinned, why", [
    ({"target": "bmv2", "limits": BMV2_LIMITS}, frozenset({"mtu"}),
     "the 'inc' ring cannot go through the switch at fake-controller:1: "
     "netreduce.init(mtu=1024): the bmv2 target aggregates path MTU 256 only"),
    ({"limits": RuntimeError("UNAVAILABLE: connection refused")}, NONE,
     "the switch controller at fake-controller:1 did not say what it aggregates (Ping): "
     "UNAVAILABLE: connection refused"),
])
def test_a_ring_that_cannot_be_fitted_is_the_same_error_on_every_rank(
        args: dict[str, Any], pinned: frozenset[str], why: str) -> None:
    results, controller = connect(3, args, pinned)
    assert all(isinstance(r, SwitchRegistrationError) for r in results), results
    assert {str(r) for r in results} == {f"netreduce: {why}"}
    assert controller.registered == []
