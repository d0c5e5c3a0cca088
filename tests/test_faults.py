"""Faults on the in-process fabric (ranks are threads, the rendezvous is real TCP): dead,
failing and slow peers, leases, the seal; and the pyverbs guard (a switch that restarts:
tests/test_switch_away.py)."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowctl import FlowConfig
from netreduce import Communicator, CommunicatorError, PeerFailure
from netreduce.registration import PROBE_TIMEOUT, LeaseKeeper, SwitchStatus
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.ranks import run_ranks

CFG = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=20.0)


def die(comm: Communicator) -> None:
    """What SIGKILL does to a rank, as far as its peers can tell: its store connections
    close, its QPs stop answering."""
    rdzv = comm._rendezvous
    for client in (rdzv._client, rdzv._watch_client):
        assert client is not None
        client.interrupt()
    rdzv._closing.set()


def test_a_dead_rank_is_named_by_every_other_within_seconds_and_breaks_the_communicator() -> None:
    call_0_done = threading.Barrier(4)      # rank 2 dies between calls, not during call #0

    def body(comm: Communicator, host: FakeHost) -> Any:
        comm.allreduce(np.ones(100, dtype=np.int32))
        call_0_done.wait(timeout=30)
        if comm.rank == 2:
            die(comm)
            return "died"
        t0 = time.monotonic()
        with pytest.raises(PeerFailure) as failure:
            comm.allreduce(np.ones(100, dtype=np.int32))
        took = time.monotonic() - t0
        with pytest.raises(CommunicatorError) as again:
            comm.allreduce(np.ones(100, dtype=np.int32))
        return failure.value, took, again.value

    out = run_ranks(4, body, cfg=CFG)
    assert out[2] == "died"
    for r in (0, 1, 3):
        assert isinstance(out[r], tuple), (r, out)
        exc, took, again = out[r]
        assert exc.ranks == [2] and took < 3, (exc, took)
        assert (f"netreduce: rank {r}: allreduce call #1 (int32[100] op=sum algo=auto) failed: "
                f"rank 2: its process died") in str(exc)
        assert "the communicator is unusable" in str(exc)
        assert "unusable after an earlier error" in str(again)


def test_a_completion_error_on_fake_qps_is_a_transport_fault_every_rank_recovers() -> None:
    """A completion error on some ranks' QPs (the fabric fails one message index) was
    the end of the job; it is a transport fault now (netreduce/transport_fault.py): the
    ranks rebuild the host ring and redo the call, exact on every rank."""
    fabric = FakeFabric()

    def body(comm: Communicator, host: FakeHost) -> Any:
        comm.allreduce(np.ones(10, dtype=np.int32))
        fabric.fail_index = comm._streams["ring"].next_send_index + 1
        x = np.full(10, comm.rank, dtype=np.int32)
        comm.allreduce(x)
        fabric.fail_index = None
        return x.tolist(), comm.stats()["transport"]["faults"]

    out = run_ranks(4, body, cfg=CFG, fabric=fabric)
    assert [y for y, _ in out] == [[6] * 10] * 4, out
    assert {faults for _, faults in out} == {out[0][1]} and out[0][1] >= 1, out


def test_a_live_rank_that_is_late_is_waited_for() -> None:
    cfg = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=4.0)

    def body(comm: Communicator, host: FakeHost) -> Any:
        if comm.rank == 1:
            time.sleep(2.5)                    # alive (watching), just late
        x = np.full(10, comm.rank + 1, dtype=np.int32)
        comm.allreduce(x)
        return x.tolist()

    assert run_ranks(3, body, cfg=cfg) == [[6] * 10] * 3


def test_rank_0_renews_the_lease_while_the_communicator_lives_then_unregisters() -> None:
    fabric = FakeFabric()
    controller = FakeController(fabric, lease_ms=300)

    def body(comm: Communicator, host: FakeHost) -> Any:
        x = np.ones(10, dtype=np.int32)
        comm.allreduce(x)
        time.sleep(1.0)
        comm.allreduce(x)
        return x.tolist()

    assert run_ranks(2, body, cfg=CFG, fabric=fabric, controller=controller) == [[4] * 10] * 2
    (spec,) = controller.registered
    assert len(controller.renewed) >= 5 and set(controller.renewed) == {spec.ring_id}
    assert controller.unregistered == [spec.ring_id]


def test_the_seal_catches_a_fake_switch_that_stopped_aggregating_mid_call() -> None:
    """The data came back but the seal is the predecessor's alone (what a restarted switch
    forwards): SwitchNotAggregating, and the output is left untouched."""
    from netreduce.algorithms.base import CallContext
    from netreduce.algorithms.switch import SWITCH, wire_bytes
    from netreduce.meta import SwitchNotAggregating
    from netreduce.workspace import Workspace

    fabric = FakeFabric()
    host = FakeHost(fabric, 1)
    count, n = 5, 3
    workspace = Workspace(host.register).ensure(SWITCH.workspace_bytes(count, 4, n))

    class RawStream:
        def transfer(self, send: Any, recv_nbytes: int, then: Any = None) -> None:
            got = workspace.view()[SWITCH_RECV(count, n):].view("<i4")
            got[:count] = 7
            got[count:count + n] = [1, 0, 0]       # rank 0's seal only

    def SWITCH_RECV(c: int, k: int) -> int:
        from netreduce.algorithms.switch import recv_offset
        return recv_offset(wire_bytes(c, k))

    call = CallContext(rank=1, world_size=n, seq=4, count=count, dtype=np.dtype(np.int32), divisor=1,
                       op=np.add, ranges=((0, 1),) * n, workspace=workspace,
                       peer_workspace=workspace.remote(), streams={"inc": RawStream()})
    out = np.zeros(count, dtype=np.int32)
    with pytest.raises(SwitchNotAggregating, match=r"call #4: rank 1: the seal that came back "
                                                   r"is \[1, 0, 0\], not 3 ones"):
        SWITCH.run(call, np.ones(count, dtype=np.int32), out)
    assert not out.any()


def test_a_device_closed_raises_instead_of_crashing() -> None:
    from ring_setup.verbs.host import DeviceClosed, DeviceLife

    life = DeviceLife("rxe3")
    life.check("polling")
    life.closed = True
    with pytest.raises(DeviceClosed, match="polling send completions: device rxe3 is closed"):
        life.check("polling send completions")


def test_sigterm_exits_through_the_atexit_finalize() -> None:
    code = ("import atexit, logging, os, signal, time\n"
            "import netreduce.api as api\n"
            "logging.basicConfig()\n"          # the program's logging (netreduce: NullHandler)
            "atexit.register(lambda: print('FINALIZED', flush=True))\n"
            "api._exit_on_sigterm()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(10)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 143, (p.stdout, p.stderr)
    assert "FINALIZED" in p.stdout and "netreduce: SIGTERM: finalizing" in p.stderr


@pytest.mark.parametrize("exit_on_sigterm", [True, False])
def test_init_installs_the_sigterm_handler_only_when_asked(exit_on_sigterm: bool) -> None:
    """init(exit_on_sigterm=False) leaves SIGTERM at its default action (the process dies
    with -15, no finalize); the default turns it into SystemExit(143) through finalize."""
    code = ("import os, signal, time\n"
            "import netreduce.api as api\n"
            "class FakeComm:\n"
            "    def close(self): print('FINALIZED', flush=True)\n"
            "import netreduce.shards as shards\n"
            "shards.create = lambda *a, **k: FakeComm()\n"
            f"api.init(exit_on_sigterm={exit_on_sigterm})\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(10)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    if exit_on_sigterm:
        assert (p.returncode, p.stdout.strip()) == (143, "FINALIZED"), (p.stdout, p.stderr)
    else:
        assert (p.returncode, p.stdout) == (-signal.SIGTERM, ""), (p.stdout, p.stderr)


def test_a_lease_that_cannot_be_renewed_for_a_whole_lease_is_reported_lost() -> None:
    class Unreachable:
        addr = "10.0.0.9:50051"

        def renew_lease(self, ring_id: str) -> dict:
            raise RuntimeError("UNAVAILABLE: connection refused")

    lost: list[str] = []
    status = SwitchStatus(controller="10.0.0.9:50051", ring_id="r1", slots=256, lease_ms=300)
    keeper = LeaseKeeper(Unreachable(), status, lost.append)   # type: ignore[arg-type]
    time.sleep(1.0)
    keeper.stop()
    assert lost == ["the switch at 10.0.0.9:50051 no longer aggregates ring r1 (restarted, or "
                    "its lease lapsed): RenewLease: UNAVAILABLE: connection refused"]


def test_a_probe_that_finds_no_controller_is_the_rings_loss_a_renewal_is_not() -> None:
    """A backup keeper (no silence judged) whose controller refuses connections: its
    periodic renewals report nothing; a probe (asked while "inc" stalls) reports the loss
    at once, with the probe's timeout, not the client's."""
    class Refusing:
        addr = "10.0.0.9:50051"
        timeouts: list = []

        def renew_lease(self, ring_id: str, timeout: float | None = None) -> dict:
            Refusing.timeouts.append(timeout)
            raise RuntimeError("UNAVAILABLE: connection refused")

    lost: list[str] = []
    status = SwitchStatus(controller="10.0.0.9:50051", ring_id="r1", slots=256, lease_ms=150)
    keeper = LeaseKeeper(Refusing(), status, lost.append,  # type: ignore[arg-type]
                         judge_silence=False)
    time.sleep(0.4)                             # ~7 renewals, each refused: not judged
    assert lost == [] and len(Refusing.timeouts) >= 3 and set(Refusing.timeouts) == {None}
    t0 = time.monotonic()
    keeper.probe()
    while not lost and time.monotonic() - t0 < 2:
        time.sleep(0.005)
    keeper.stop()
    assert time.monotonic() - t0 < 0.2 and Refusing.timeouts[-1] == PROBE_TIMEOUT
    assert lost == ["the switch at 10.0.0.9:50051 no longer aggregates ring r1 (its "
                    "controller is unreachable while the ring stalls): RenewLease: "
                    "UNAVAILABLE: connection refused"]


def test_a_lease_is_left_to_lapse_once_a_rank_of_the_job_failed() -> None:
    """Every keeper (rank 1's backup too) stops renewing once the job lost a rank: the ring
    can never sum again, and the switch must free it when its lease runs out."""
    class Counting:
        addr = "10.0.0.9:50051"
        renewed = 0

        def renew_lease(self, ring_id: str) -> dict:
            Counting.renewed += 1
            return {"ring_id": ring_id, "lease_ms": 150}

    alive = threading.Event()
    alive.set()
    lost: list[str] = []
    status = SwitchStatus(controller="10.0.0.9:50051", ring_id="r1", slots=256, lease_ms=150)
    keeper = LeaseKeeper(Counting(), status, lost.append, judge_silence=False,  # type: ignore[arg-type]
                         job_alive=alive.is_set)
    time.sleep(0.5)
    before = Counting.renewed
    alive.clear()                              # the watch learned of a dead rank
    time.sleep(0.5)
    after = Counting.renewed
    time.sleep(0.5)
    keeper.stop()
    assert before >= 2 and Counting.renewed == after <= before + 1 and lost == []
