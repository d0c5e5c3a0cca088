"""Transport faults in the lab (issue 40, docs/transport-faults.md): a rank's QPs moved to
ERROR mid-call on the switch path ("inc") and on the host ring; a host's link dark for
20 s (tc netem 100 % loss on all it sends: data and ACKs) in the middle of 45 calls of 4 MiB
with the default (finite) retry budget, algo auto, switch and ring; a link that stays dark.
rxe's retry race run past the budget (netem on a host's link, retry_cnt 1). Every call
exact on every rank (the worker exits otherwise); the recovery counted alike and named in
rank 0's log. Figures are printed (docs/transport-faults.md).

    scripts/lab.sh --hosts 4 -- python -m pytest -q -m lab tests/lab/test_transport_faults.py
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

from flowctl.plan import DEFAULT_RETRY_CNT, FlowConfig
from netreduce.tools.launch import LaunchResult, launch
from netreduce.transport_fault import fault_bound
from tests.lab.fault_worker import AFTER_FAULT
from tests.lab.labhosts import netem_links, run_in_host
from tests.lab.survive import Cues
from tests.lab.workers import lines, next_port, tree_env, why

pytestmark = pytest.mark.lab

WORKER = Path(__file__).with_name("fault_worker.py")
N = 4


def figure(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n[transport-faults] {text}")


def run_job(*args: str, out: Cues | None = None, timeout: float = 900,
            retry_cnt: int = DEFAULT_RETRY_CNT) -> LaunchResult:
    """The job at a finite retry budget (the library's default; the lab's own default is
    rxe's forever: scripts/lab.sh)."""
    return launch([sys.executable, str(WORKER), *args], N, port=next_port(),
                  timeout=timeout, grace=60, out=out,
                  env={**tree_env(), "NR_RETRY_CNT": str(retry_cnt)})


def tails(result: LaunchResult, lines_per_rank: int = 25) -> str:
    """The job's exit code and each rank's last lines, for a failed assertion."""
    return f"exit {result.exit_code}\n" + "\n".join(
        f"--- rank {r.rank}:\n" + "\n".join(line[:600] for line in r.output[-lines_per_rank:])
        for r in result.ranks)


def checked(result: LaunchResult, calls: int) -> tuple[list[str], dict, list[str]]:
    """Every rank printed OK after at least `calls` exact calls, the same routes and
    counts; returns the routes, the stats and rank 0's output."""
    assert result.ok, tails(result)
    routes, stats = [], []
    for r in range(N):
        assert lines(result, r, "OK faults"), why(result, r)
        routes.append([c.split()[1] for c in lines(result, r, "CALL ")])
        stats.append(json.loads(lines(result, r, "STATS ")[0]))
    assert len(routes[0]) >= calls and routes == [routes[0]] * N, routes
    counts = [{k: v for k, v in s["transport"].items() if k != "ms_lost"} for s in stats]
    assert counts == [counts[0]] * N, stats
    return routes[0], stats[0], result.ranks[0].output


@pytest.mark.parametrize("ring", ["inc", "ring"])
def test_a_qp_moved_to_error_mid_call_costs_one_call(
        ring: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 2 moves its "inc" QPs (through the switch, algo auto) or its host-ring QPs (no
    switch) to ERROR 0.05 s into call 2 of 12 of 1 MiB: `qp_killed`."""
    qp_killed(ring, 1 << 18, capsys)


def qp_killed(ring: str, size: int, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Rank 2 moves its `ring` QPs to ERROR 0.05 s into call 2 of 12 of int32[size]: every
    call exact; one fault settled, named in rank 0's log; "inc": rebuilt at once, call 2
    redone and every call through the switch, no fallback. Returns rank 0's output."""
    calls = 12
    args = ["--calls", str(calls), "--size", str(size), "--kill", ring, "--at", "2",
            "--delay", "0.05"]
    args += ["--no-switch"] if ring == "ring" else ["--until-switch", "300"]
    t0 = time.monotonic()
    routes, stats, out = checked(run_job(*args), calls)
    took = time.monotonic() - t0
    t = stats["transport"]
    assert t["faults"] == 1 and t["redone"] == 1, stats
    named = [line for line in out if "transport fault on '" + ring + "'" in line]
    assert named, out[-40:]
    if ring == "inc":
        assert stats["switch"]["fallbacks"] == 0 and set(routes) == {"switch"}, stats
        assert t["rebuilds"] == 1 and any("rebuilt at once" in line for line in named), named
    else:
        assert t["rebuilds"] == 1 and set(routes) == {"ring"}, (routes, stats)
    secs = [float(c.split()[2]) for c in lines_of(out, "CALL ")]
    figure(capsys, f"{ring}: QP to ERROR in call 2 of int32[{size}]: routes "
                   f"{''.join(r[0] for r in routes)}, call 2 {secs[2]:.2f} s vs median "
                   f"{sorted(secs)[len(secs) // 2]:.2f} s; transport {t}; job {took:.0f} s")
    return out


@pytest.mark.parametrize("late", [0.8, 3.0])
def test_a_rank_later_than_the_retry_budget_stays_on_the_switch(
        late: float, capsys: pytest.CaptureFixture[str]) -> None:
    """The default retry budget (0.47 s): rank 2 begins call 3 of 8 of 1 MiB `late` s late,
    algo="switch": the others' "inc" QPs fail, "inc" is rebuilt at once and the call redone
    through the switch once rank 2 comes: every call exact and through the switch, none
    refused, a fault and a rebuild for each call redone, alike on every rank, named in rank
    0's log; the
    late call takes about its lateness at least (rank 0 began it with rank 2's sleep)."""
    calls = 8
    result = run_job("--calls", str(calls), "--size", str(1 << 18), "--algo", "switch",
                     "--late", str(late), "--at", "3")
    routes, stats, out = checked(result, calls)
    t = stats["transport"]
    assert set(routes) == {"switch"} and stats["switch"]["fallbacks"] == 0, (routes, stats)
    # at least the late call's fault (a TCG ACK later than the budget under load adds one)
    assert t["faults"] >= 1 and t["rebuilds"] == t["redone"] == t["faults"], stats
    assert not any(lines(result, r, "REFUSED ") for r in range(N))
    named = [line for line in out if "rebuilt at once" in line]
    assert named, out[-40:]
    secs = [float(c.split()[2]) for c in lines_of(out, "CALL ")]
    assert secs[3] >= 0.9 * late, secs
    figure(capsys, f"rank 2 {late:g} s late for call 3 (algo switch): call 3 {secs[3]:.2f} s, "
                   f"the others median {sorted(secs)[len(secs) // 2]:.2f} s; transport {t}; "
                   f"rank 0: {named[0][-300:]}")


def lines_of(output: list[str], prefix: str) -> list[str]:
    return [line[len(prefix):] for line in output if line.startswith(prefix)]


#: host 2's nr0 drops every frame it sends (data and ACKs, the store's traffic too)
DARK = [["tc", "qdisc", "add", "dev", "nr0", "root", "netem", "loss", "100%"]]
#: host 2's nr0 drops every RoCE v2 frame it sends (UDP 4791); the store's TCP goes on
ROCE_DARK = [["tc", "qdisc", "add", "dev", "nr0", "root", "handle", "1:", "prio"],
             ["tc", "filter", "add", "dev", "nr0", "parent", "1:", "protocol", "ip", "u32",
              "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791",
              "0xffff", "action", "drop"]]


def dark_job(seconds: float | None, *args: str, timeout: float = 600,
             dark: list[list[str]] = DARK) -> tuple[LaunchResult, float]:
    """Run the worker with `args`; 0.5 s after rank 0's "AT CALL 10" host 2's link goes
    `dark` for `seconds` (None: until the job ends, at most 300 s); returns the job's
    result and how long the link was dark."""
    out = Cues("AT CALL 10")
    outcome: list[LaunchResult] = []
    job = threading.Thread(target=lambda: outcome.append(run_job(*args, out=out,
                                                                 timeout=timeout)))
    job.start()
    t0 = time.monotonic()
    try:
        assert out.seen["AT CALL 10"].wait(600), out.getvalue()[-3000:]
        time.sleep(0.5)
        for command in dark:
            run_in_host(2, *command)
        t0 = time.monotonic()
        if seconds is None:
            job.join(timeout=300)
        else:
            time.sleep(seconds)
    finally:
        run_in_host(2, "tc", "qdisc", "del", "dev", "nr0", "root", check=False)
        dark = time.monotonic() - t0
        job.join(timeout=timeout)
    (result,) = outcome
    return result, dark


@pytest.mark.parametrize("algo", ["auto", "switch", "ring"])
def test_a_host_link_dark_for_20_s_mid_job_costs_no_call(
        algo: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The default retry budget (6: 7 x 67 ms, docs/roce.md): host 2's link dark for 20 s
    from call 10 of 45 of 4 MiB, algo auto and switch through the switch, and the host ring
    without a switch (with one, algo="ring" exchanges its metadata on "inc": the open gap
    of tests/test_native_rc_model.py's xfail): every call exact on every rank, the fault and
    its recovery named in rank 0's log; auto and switch: the settle waits in the store until
    the link is back (its traffic crosses the link), "inc" is rebuilt at once and the call
    redone through the switch: every call there, none refused (algo "switch": a call refused
    while the switch is away would run with algo "auto", as the DDP hook does)."""
    calls = 45
    args = ["--calls", str(calls), "--algo", algo]
    args += ["--no-switch"] if algo == "ring" else ["--until-switch", "400"]
    result, dark = dark_job(20, *args)
    routes, stats, out0 = checked(result, calls)
    t = stats["transport"]
    assert t["faults"] >= 1, stats
    if algo == "ring":
        assert set(routes) == {"ring"} and t["rebuilds"] >= 1 and t["redone"] >= 1, stats
    else:
        assert set(routes) == {"switch"} and stats["switch"]["fallbacks"] == 0, stats
    refused = [len(lines(result, r, "REFUSED ")) for r in range(N)]
    assert refused == [0] * N, refused
    named = [line for line in out0 if "transport fault on '" in line]
    recovered = "were rebuilt" if algo == "ring" else "rebuilt at once"
    assert named and any(recovered in line for line in out0), out0[-60:]
    secs = [float(c.split()[2]) for c in lines_of(out0, "CALL ")]
    figure(capsys, f"{algo}: link dark {dark:.1f} s: routes "
                   f"{''.join(r[0] for r in routes)}, slowest call {max(secs):.1f} s, "
                   f"refused {refused[0]}, transport {t}, switch {stats['switch']}; "
                   f"rank 0 named: {named[0][:300]}")


def test_a_host_link_dark_during_switch_calls_with_two_in_flight_costs_no_call(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The default retry budget: host 2's link dark for 8 s from call 10 of 45 async calls
    of 4 MiB, two in flight (algo auto, through the switch): every call exact on every
    rank and completed in issue order (each waited for in turn), the fault counted alike
    on every rank, each redone call counted, rank 0's log naming the fault."""
    calls = 45
    result, dark = dark_job(8, "--calls", str(calls), "--async-pairs")
    routes, stats, out0 = checked(result, calls)
    t = stats["transport"]
    assert set(routes) == {"async"} and t["faults"] >= 1 and t["redone"] == t["faults"], stats
    for r in range(N):
        assert json.loads(lines(result, r, "DONE ")[0]) == list(range(calls)), why(result, r)
    named = [line for line in out0 if "transport fault on '" in line]
    assert named, out0[-60:]
    secs = [float(c.split()[2]) for c in lines_of(out0, "CALL ")]
    rebuilt = [line.split("; call #")[1].split(",")[0] for line in out0
               if "rebuilt at once" in line]
    figure(capsys, f"2 in flight: link dark {dark:.1f} s: calls {stats['calls']}, "
                   f"slowest call {max(secs):.1f} s, 'inc' rebuilt at once for {rebuilt}, "
                   f"transport {t}, switch {stats['switch']}; rank 0 named: {named[0][:300]}")


def test_a_link_that_stays_dark_fails_every_rank_within_the_bound(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Host 2's link dark for RoCE from call 10 until the job ends (algo auto, through the
    switch; the store's TCP goes on, as over a cluster's management network: a link dark
    for all is the store's silence, PeerFailure after 60 s): every rank's call fails with
    the error naming the connection (TransportFault on every rank, with the attempts),
    within fault_bound (35 s at the defaults) plus 15 s of settling, and finalize()
    returns on every rank."""
    bound = fault_bound(FlowConfig()) + 15
    result, dark = dark_job(None, "--calls", "45", "--expect-fault", timeout=600,
                            dark=ROCE_DARK)
    assert result.ok, tails(result)
    failed = []
    for r in range(N):
        (line,) = lines(result, r, "FAILED ")
        assert lines(result, r, "FINALIZED"), result.ranks[r].output[-30:]
        failed.append(line)
    # TransportFault on every rank (the call faulted FAULT_ATTEMPTS times; a switch call's
    # settle redoes its host-ring sum as often: tests/test_rc_fault_cost.py)
    assert all("transport fault on '" in f and "TransportFault" in f for f in failed), failed
    secs = [float(f.split()[1].rstrip(":")) for f in failed]
    assert max(secs) < bound, (secs, bound, failed)
    figure(capsys, f"stays dark: every rank failed after {min(secs):.1f}-{max(secs):.1f} s "
                   f"(bound {bound:.1f} s), link dark {dark:.1f} s; rank 0: {failed[0][:400]}")


#: host 2's link both ways (tests/lab/test_faults.py's netem, twice the loss): go-back-N
#: retries, duplicates the responder re-ACKs, ACKs late behind reordered frames
RACE_NETEM = ["loss", "2%", "duplicate", "1%", "delay", "1ms", "reorder", "75%", "50%"]
RACE_RETRY_CNT = 1      # two retries without a completed WQE fail the QP (rxe_comp.c)
RACE_CALLS = 40         # the bound: calls of 1 MiB before the test gives up on a fault
#: the link is clean again at the first recovery rank 0 logs (at 1 retry the redo under
#: RACE_NETEM faults too: 8 attempts end the job) or once the ranks counted a fault
CLEAN_ON = ("transport fault on '", "FAULT SEEN")


@pytest.mark.parametrize("path", ["switch", "ring"])
def test_rxe_retry_race_past_the_budget_is_recovered(
        path: str, capsys: pytest.CaptureFixture[str]) -> None:
    """rxe's retry race (docs/roce.md) past the point where the QP errors: RACE_NETEM on
    host 2's link both ways and NR_RETRY_CNT=1, calls of 1 MiB through the switch (algo
    auto) or over the host ring (no switch) until the ranks counted a transport fault (at
    most RACE_CALLS), the link clean again from the first recovery (CLEAN_ON), 4 more calls
    (through the switch: until one goes there). Every call exact on every rank; >= 1 fault
    recovered, counted alike and named in rank 0's log; the hosts' rxe counters show the
    retries and a QP whose retries ran out (or a NAK: the fault's status in rank 0's log)."""
    args = ["--calls", "2", "--size", str(1 << 18), "--until-fault", str(RACE_CALLS)]
    args += ["--no-switch"] if path == "ring" else ["--until-switch", "600"]
    out = Cues(*CLEAN_ON)
    outcome: list[LaunchResult] = []
    job = threading.Thread(target=lambda: outcome.append(
        run_job(*args, out=out, timeout=1200, retry_cnt=RACE_RETRY_CNT)))
    t0 = time.monotonic()
    with netem_links([2], RACE_NETEM):
        job.start()
        while job.is_alive() and not any(out.seen[cue].wait(0.5) for cue in CLEAN_ON):
            pass
    job.join(timeout=1200)
    took = time.monotonic() - t0
    (result,) = outcome
    assert result.ok, tails(result)
    hw = [json.loads(lines(result, r, "HW ")[0]) for r in range(N)]
    total = {k: sum(h.get(k, 0) for h in hw) for k in
             ("completer_retry_err", "retry_exceeded_err", "duplicate_request",
              "rcvd_seq_err", "out_of_seq_request")}
    stats = [json.loads(lines(result, r, "STATS ")[0]) for r in range(N)]
    assert lines(result, 0, "FAULT SEEN "), (
        f"no transport fault in {RACE_CALLS} calls under {RACE_NETEM} at retry_cnt "
        f"{RACE_RETRY_CNT}: transport {stats[0]['transport']}, rxe counters {total}")
    routes, stat, out0 = checked(result, 2 + AFTER_FAULT)
    t = stat["transport"]
    assert t["faults"] >= 1 and t["rebuilds"] >= 1, stat
    named = [line for line in out0 if "transport fault on '" in line]
    assert named, out0[-60:]
    assert total["completer_retry_err"] > 0, total
    # RETRY_EXC_ERR; or the race's NAK "remote invalid request" (docs/roce.md)
    assert total["retry_exceeded_err"] > 0 or any("invalid request" in line for line in named), \
        (total, named)
    if path == "switch":
        assert routes[-1] == "switch", routes
    else:
        assert set(routes) == {"ring"}, routes
    figure(capsys, f"race {path}: netem {' '.join(RACE_NETEM)} on h2 both ways, retry_cnt "
                   f"{RACE_RETRY_CNT}: {len(routes)} calls exact, routes "
                   f"{''.join(r[0] for r in routes)}, transport {t}, switch {stat['switch']}; "
                   f"rxe counters (4 hosts) {total}; job {took:.0f} s; rank 0 named: "
                   f"{named[0][:300]}")
