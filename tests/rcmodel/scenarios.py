"""The RC model's property scenarios (tests/test_rc_properties.py, and with the native
pipeline beside the Python one, tests/test_native_rc_model.py): whatever is lost,
duplicated, reordered or delayed, in any direction, a run of a few allreduce calls gives
every rank the exact sum or fails with the documented error (docs/rcmodel.md, "Outcomes");
never a wrong result, never a hang.

Documented errors (fail fast, rcmodel.outcomes): the rank whose own stream gives up raises
`StallError` (no completion for `collective_timeout`: the loss outran recovery); a
"transport retry counter exceeded" (retry_cnt < 7 ran out) is a transport fault, settled
and its call redone (netreduce/transport_fault.py), which ends as `TransportFault` on
every rank once the same call faulted too often, or, when it broke the host ring a switch
fallback was summing wire words over, as a `CommunicatorError` on that rank; every other
rank still calling raises `PeerFailure` naming only ranks that did fail so; and every
later call on a failed rank a CommunicatorError ("unusable after an earlier error"). A
hang is `SimulationLimit` (bounded simulated time and events).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from flowctl import CompletionError, FlowConfig, StallError
from netreduce.comm import CommunicatorError
from netreduce.errors import TransportFault
from netreduce.routing import SwitchUnavailable
from nr_contract.spec import PSN_MASK, required_slots
from tests.rcmodel.fabric import KINDS, FaultRates, Faults
from tests.rcmodel.outcomes import check_fail_fast
from tests.rcmodel.rxe import RETRY_FOREVER, QPAttr
from tests.rcmodel.world import World

#: (mtu, msg_size, window): 4-packet messages; 64-packet messages (AckReq only on the
#: last); 256-packet messages (AckReq every 66th, 129 PSNs in flight, N = 512).
CONFIGS = [(256, 1024, 4), (256, 64 * 256, 2), (256, 256 * 256, 1), (512, 2048, 3)]

rates = st.builds(FaultRates, loss=st.floats(0, 0.25), duplicate=st.floats(0, 0.2),
                  delay=st.floats(0, 0.5), delay_s=st.sampled_from([50e-6, 2e-3, 0.1]))


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A run: 2-4 ranks, a flow configuration, fault rates of every kind of frame, retries
    forever or 2, rxe's ACK timeout, PSNs near their wrap or not, 1-3 calls."""
    n = draw(st.integers(2, 4))
    mtu, msg_size, window = draw(st.sampled_from(CONFIGS))
    return {
        "n": n,
        "config": FlowConfig(mtu=mtu, msg_size=msg_size, window=window, recv_depth=32,
                             collective_timeout=draw(st.sampled_from([0.5, 5.0]))),
        "faults": Faults({kind: draw(rates) for kind in KINDS}, seed=draw(st.integers(0, 2**32))),
        "retry_cnt": draw(st.sampled_from([RETRY_FOREVER, RETRY_FOREVER, 2])),
        "timeout": draw(st.sampled_from([8, 14])),            # 1 ms or 67 ms
        "near_wrap": draw(st.booleans()),
        "calls": draw(st.lists(st.tuples(st.sampled_from(["switch", "ring"]),
                                         st.integers(1, 9000)), min_size=1, max_size=3)),
    }


def data(rank: int, call: int, count: int) -> np.ndarray:
    """Rank `rank`'s int32 input of call `call`, seeded."""
    return np.random.default_rng([rank, call, count]).integers(-2**20, 2**20, count,
                                                                dtype=np.int32)


def own_failure(exc: BaseException, retry_cnt: int) -> bool:
    """A documented way for a rank's own stream to give up."""
    if isinstance(exc, StallError):
        return True
    return retry_cnt != RETRY_FOREVER and isinstance(exc, CommunicatorError) and (
        isinstance(exc, TransportFault) or "a transport fault while settling" in str(exc)) \
        and "transport retry counter exceeded" in str(exc)


def check_run(s: dict[str, Any], controller: bool = False) -> str:
    """Run scenario `s`: every call's result is the exact sum on every rank ("exact"), or
    the first error of each failed rank is documented (fail fast: `check_fail_fast`), its
    later calls refused as unusable ("failed"); never a wrong sum, never a hang.
    `controller`: rank 0 holds one (World), so an "inc" fault rebuilds "inc" at once."""
    n, config, calls = s["n"], s["config"], s["calls"]
    psn0s = ({(r, ring): PSN_MASK - 40 * r for r in range(n) for ring in ("ring", "inc")}
             if s["near_wrap"] else None)
    spec_slots = required_slots(World(n, config, switch=False).spec)
    world = World(n, config, faults=s["faults"], slots=max(256, spec_slots),
                  attr=QPAttr(mtu=config.mtu, timeout=s["timeout"], retry_cnt=s["retry_cnt"]),
                  psn0s=psn0s, max_time=200.0, max_events=400_000, controller=controller)

    def body(comm: Any) -> list[Any]:
        out: list[Any] = []
        for i, (algo, count) in enumerate(calls):
            try:
                out.append(comm.allreduce(data(comm.rank, i, count), algo=algo))
            except SwitchUnavailable:   # refused alike: the switch went away (a fault on
                out.append(None)        # "inc"); the communicator stays usable
            except (StallError, CompletionError, CommunicatorError) as exc:
                out.append(exc)
        comm.close()    # a model rank has no progress thread: it settles a notice here
        return out

    results = world.run(body)
    first_errors: dict[int, BaseException] = {}
    for rank, got in enumerate(results):
        assert isinstance(got, list), f"rank {rank} raised {got!r}"
        for i, ((algo, count), res) in enumerate(zip(calls, got)):
            if res is None:
                assert algo == "switch", f"rank {rank} call {i} ({algo}) refused"
                continue
            if isinstance(res, BaseException):
                if rank not in first_errors:
                    first_errors[rank] = res
                else:
                    assert isinstance(res, CommunicatorError) and \
                        "unusable after an earlier error" in str(res), \
                        f"rank {rank} call {i}: {res!r}"
                continue
            assert rank not in first_errors, f"rank {rank} call {i} ran after its failure"
            want = np.sum([data(r, i, count) for r in range(n)], axis=0, dtype=np.int32)
            assert np.array_equal(res, want), f"rank {rank} call {i} ({algo}): wrong sum"
    if first_errors:
        check_fail_fast(first_errors, lambda exc: own_failure(exc, s["retry_cnt"]))
    stats = world.switch_counters()["counters"]
    assert stats["drop_overrun"] == stats["drop_mismatch"] == stats["drop_bad_length"] == 0
    return "failed" if first_errors else "exact"
