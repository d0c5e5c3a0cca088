"""The rendezvous store on localhost: ranks are threads, the store is real TCP."""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import pytest

import ring_setup.store_server as store_server
from ring_setup.rendezvous import Rendezvous, RendezvousConfig, StoreClient
from ring_setup.store_protocol import WATCH_INTERVAL, PeerFailed, RendezvousError, RendezvousTimeout
from tests.processes import free_port


SECRET = b"secret-of-the-rendezvous-tests"


def config(rank: int, world: int, port: int, timeout: float = 5.0,
           secret: bytes = SECRET) -> RendezvousConfig:
    return RendezvousConfig(rank, world, "127.0.0.1", port, timeout, secret)


def run_ranks(ranks: list[int], world: int, port: int, body: Callable[[Rendezvous], Any],
              timeout: float = 5.0) -> dict[int, Any]:
    """Run `body` on a joined rendezvous per rank (threads); return result or exception."""
    out: dict[int, Any] = {}

    def worker(rank: int) -> None:
        rdzv = Rendezvous(config(rank, world, port, timeout))
        try:
            rdzv.join()
            out[rank] = body(rdzv)
        except Exception as exc:          # noqa: BLE001 - the test inspects it
            out[rank] = exc
        finally:
            rdzv.close(timeout=1.0)

    threads = [threading.Thread(target=worker, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return out


def test_all_gather_returns_every_rank_value_by_rank() -> None:
    port = free_port()
    out = run_ranks([2, 0, 1], 3, port, lambda r: r.all_gather("x", {"me": r.rank}))
    assert all(out[r] == [{"me": 0}, {"me": 1}, {"me": 2}] for r in range(3)), out


def test_a_rank_that_never_joins_is_named() -> None:
    port = free_port()
    t0 = time.monotonic()
    out = run_ranks([0, 1], 3, port, lambda r: r.all_gather("endpoint", r.rank), timeout=1.0)
    assert time.monotonic() - t0 < 10
    for r in (0, 1):
        assert isinstance(out[r], RendezvousTimeout)
        assert str(out[r]) == (f"rendezvous: rank 2 never joined within 1s "
                               f"(waiting at 127.0.0.1:{port})")


def test_a_rank_that_gives_up_first_is_not_blamed_for_the_missing_one() -> None:
    """Rank 1 stops waiting for rank 2 (and leaves) before rank 0 does: rank 0 still names
    rank 2, not rank 1 (CI saw "rank 1 ... finalized and left" on rank 0 instead)."""
    port = free_port()
    out: dict[int, Any] = {}

    def rank(r: int, timeout: float) -> None:
        rdzv = Rendezvous(config(r, 3, port, timeout))
        try:
            rdzv.join()
            rdzv.all_gather("endpoint", r)
        except Exception as exc:          # noqa: BLE001 - the test inspects it
            out[r] = exc
        finally:
            rdzv.close(timeout=0.2)
    threads = [threading.Thread(target=rank, args=(0, 2.0)),
               threading.Thread(target=rank, args=(1, 0.5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for r, t in ((0, "2"), (1, "0.5")):
        assert isinstance(out[r], RendezvousTimeout), out[r]
        assert str(out[r]).startswith(f"rendezvous: rank 2 never joined within {t}s"), out[r]


def test_several_missing_ranks_are_all_named() -> None:
    port = free_port()
    out = run_ranks([0], 4, port, lambda r: r.all_gather("endpoint", 0), timeout=0.5)
    assert "ranks 1, 2, 3 never joined within 0.5s" in str(out[0])


def test_missing_rank_0_means_no_store() -> None:
    port = free_port()
    rdzv = Rendezvous(config(1, 2, port, timeout=0.6))
    with pytest.raises(RendezvousTimeout,
                       match=rf"rank 0 never joined within 0.6s \(no store at 127.0.0.1:{port}"):
        rdzv.join()


def test_world_size_disagreement_is_refused() -> None:
    port = free_port()
    server = Rendezvous(config(0, 2, port)).join()
    try:
        with pytest.raises(RendezvousError, match="rank 1 has world size 3 but rank 0 has 2"):
            Rendezvous(config(1, 3, port)).join()
    finally:
        server.close(timeout=0.1)


def test_two_processes_claiming_one_rank_are_refused() -> None:
    port = free_port()
    first = Rendezvous(config(0, 2, port, timeout=1.0)).join()
    second = Rendezvous(config(0, 2, port, timeout=1.0))
    second._client = StoreClient.connect(second.config)   # a second "rank 0", as a client only
    try:
        def first_waits() -> None:
            with contextlib.suppress(RendezvousError):   # rank 1 never comes; "rank 0" leaves
                first.all_gather("endpoint", "a")
        threading.Thread(target=first_waits, daemon=True).start()
        time.sleep(0.2)
        with pytest.raises(RendezvousError, match="'endpoint/0' was published twice"):
            second.all_gather("endpoint", "b")
    finally:
        second.close(timeout=0.1)
        first.close(timeout=0.1)


def test_a_failing_rank_tells_the_others() -> None:
    port = free_port()

    def body(r: Rendezvous) -> Any:
        if r.rank == 1:
            r.abort("DeviceError: no RoCEv2 GID for 10.77.0.2")
            return "aborted"
        return r.all_gather("endpoint", r.rank)

    out = run_ranks([0, 1, 2], 3, port, body)
    for r in (0, 2):
        assert isinstance(out[r], RendezvousError) and not isinstance(out[r], RendezvousTimeout)
        assert "rank 1 failed during setup: DeviceError: no RoCEv2 GID" in str(out[r])


def test_barrier_names_the_straggler() -> None:
    port = free_port()

    def body(r: Rendezvous) -> Any:
        r.all_gather("endpoint", r.rank)
        if r.rank == 1:
            return None
        r.barrier("ready")

    out = run_ranks([0, 1], 2, port, body, timeout=0.5)
    assert "rank 1 never reached 'ready' within 0.5s" in str(out[0])


def test_the_port_serves_a_new_store_after_everyone_left() -> None:
    port = free_port()
    for round_ in range(3):
        out = run_ranks([0, 1, 2], 3, port, lambda r: r.all_gather("x", round_))
        assert all(out[r] == [round_] * 3 for r in range(3)), out


def test_config_from_environment_and_arguments() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.77.0.1"}
    cfg = RendezvousConfig.resolve(env=env)
    assert (cfg.rank, cfg.world_size, cfg.master_addr, cfg.master_port) == (1, 4, "10.77.0.1", 29500)
    assert RendezvousConfig.resolve(rank=3, master_port=1234, env=env).rank == 3
    with pytest.raises(RendezvousError, match="WORLD_SIZE is not set"):
        RendezvousConfig.resolve(env={"RANK": "0"})
    with pytest.raises(RendezvousError, match="rank 4 outside world size 4"):
        RendezvousConfig.resolve(rank=4, env=env)
    with pytest.raises(RendezvousError, match="bad setting"):
        RendezvousConfig.resolve(env={**env, "MASTER_PORT": "http"})


def joined_and_watching(world: int, port: int) -> list[Rendezvous]:
    """`world` ranks (threads) joined to one store, each watching the others."""
    ranks = [Rendezvous(config(r, world, port)) for r in range(world)]
    ranks[0].join()
    for r in ranks[1:]:
        r.join()
    for r in ranks:
        r.watch()
    return ranks


def first_failure(rdzv: Rendezvous, within: float) -> tuple[PeerFailed, float]:
    """Poll `check_peers` like a waiting stream does; the failure and how long it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        try:
            rdzv.check_peers()
        except PeerFailed as exc:
            return exc, time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"rank {rdzv.rank} learned of no failure within {within}s")


def kill(rdzv: Rendezvous) -> None:
    """What the kernel does to a SIGKILLed rank: its sockets close, nothing is said."""
    for client in (rdzv._client, rdzv._watch_client):
        assert client is not None
        client.interrupt()
    rdzv._closing.set()


def test_a_rank_whose_process_dies_is_named_by_every_other_within_a_second() -> None:
    ranks = joined_and_watching(4, free_port())
    try:
        kill(ranks[2])
        for r in (0, 1, 3):
            exc, took = first_failure(ranks[r], within=5)
            assert exc.ranks == [2] and took < 2.0, (exc, took)
            assert "rank 2: its process died or closed its connection to the store" in str(exc)
    finally:
        for r in ranks:
            r.close(timeout=0.1)


def test_an_abort_reaches_every_rank_with_its_reason() -> None:
    ranks = joined_and_watching(3, free_port())
    try:
        ranks[1].abort("allreduce call #4: CompletionError: RETRY_EXC_ERR")
        for r in range(3):
            exc, _ = first_failure(ranks[r], within=5)
            assert exc.failures == {1: "allreduce call #4: CompletionError: RETRY_EXC_ERR"}
    finally:
        for r in ranks:
            r.close(timeout=0.1)


def test_rank_0_gone_means_the_store_is_gone() -> None:
    ranks = joined_and_watching(3, free_port())
    try:
        assert ranks[0]._server is not None
        ranks[0]._server.stop(grace=0)
        for r in (1, 2):
            exc, _ = first_failure(ranks[r], within=5)
            assert exc.ranks == [0] and "the store it serves at 127.0.0.1" in str(exc), exc
    finally:
        for r in ranks:
            r.close(timeout=0.1)


def test_a_silent_rank_is_declared_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_server, "SILENCE_TIMEOUT", 1.0)
    port = free_port()
    ranks = [Rendezvous(config(r, 3, port)) for r in range(2)]
    for r in ranks:
        r.join().watch()
    hung = StoreClient.connect(config(2, 3, port))     # watched once, then never again
    hung.request({"op": "watch", "rank": 2, "timeout": 0}, wait=0)
    try:
        exc, took = first_failure(ranks[0], within=6)
        assert exc.ranks == [2] and "silent for" in str(exc) and took < 4, (exc, took)
    finally:
        hung.close()
        for r in ranks:
            r.close(timeout=0.1)


def test_ranks_that_finalize_together_report_nothing() -> None:
    port = free_port()

    def body(r: Rendezvous) -> Any:
        r.watch()
        r.barrier("work")
        time.sleep(2 * WATCH_INTERVAL)
        r.check_peers()
        return "ok"

    out = run_ranks([0, 1, 2], 3, port, body)
    assert out == {0: "ok", 1: "ok", 2: "ok"}, out
