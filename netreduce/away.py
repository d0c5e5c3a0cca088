"""The switch went away (issue 24): the one home of the switch-away protocol.

A switch that stops aggregating the registered "inc" ring (it restarted, or lost the ring:
a lease renewal hears NOT_FOUND, a call's seal or metadata bank came back unaggregated)
costs one call's time, never the job. docs/reliability.md ("Switch restarts") has the
argument; `AwayProtocol` runs it on each rank, in steps:
1. Notice: the rank that sees the loss publishes a switch-away notice of epoch e through
   the store (`Rendezvous.notice`); a rank waiting on "inc" sees it in its liveness check
   (`SwitchAway`), a transfer error on "inc" that comes with it is one too (`on_inc`);
   a failed completion on "inc" without one is a transport fault, settled as the switch's
   loss (netreduce/transport_fault.py); a host-ring fault's epoch goes to `on_fault`, as
   does one some rank left a "ring" wait for (the ranks learn it in the settle's gather).
2. Settle epoch e once, under the communicator's call lock (`AwayProtocol.settle`: inside
   the call that saw it, before the next call, or on the progress thread when idle): this
   rank's "inc" QPs go to ERROR (no late WRITE through the lost switch lands in its
   memory), every rank publishes its position (the first call it could not complete
   through the switch; idle: its next call) and all agree on k* (`settle_plan`).
3. Recover k* when some rank completed it with a good seal: the lowest such rank hands the
   sum the switch gave it (kept in its workspace) to every rank over the host ring (every
   other rank adds zeros: one ring sum, the same message sequence on every rank; a small
   call: every rank sends its record of k* again) and the ranks at k* write that result;
   the other good ones check that the switch gave them the same. A host-ring fault there
   is settled as on "ring" and the hand-over redone from what `Recovery` kept.
4. Redo over the host ring the calls nobody completed (the communicator does: their inputs
   are untouched, their outputs unwritten). Calls run over the ring meanwhile.
5. Return: rank 0 Pings the controller after a back-off (`Backoff`, `Rejoiner`) and flags
   its next call's record (`meta.REJOIN`); in that call every rank builds a fresh "inc"
   ring and rank 0 registers it (`AwayProtocol.rejoin`).
6. Finalize: a rank whose last call went through the switch waits until every rank is
   closing, settling what arrives meanwhile (`AwayProtocol.wait_closing`).

Invariant: every rank's position is k* or k*+1 (a rank can complete call k+1 through the
switch only after every rank started it, i.e. completed k), and every rank keeps the
workspace (the sum the switch gave it, on a good seal) and record of its last switch call
until every rank started the next one -- never the caller's buffers, which it may
overwrite once the call returned (an int32 input is sent from them in place); so whatever
the plan, the sum it hands around exists on a rank that completed k*, and is bit for bit
the switch's. A rank at k* has not written its output, and its input is untouched. A
switch call's output is written only from what the switch gave with a good seal (a small
call: every record) or from that recovered result: no output is written twice, no partial
sum is returned. What cannot be settled so is `SwitchFailure`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from flowctl.plan import FlowConfig
from flowctl.stream import CompletionError, FlowError, StallError, Stream
from netreduce.algorithms import CallContext
from netreduce.algorithms.switch import (SWITCH, inline_sum, recv_offset, wire_bytes,
                                         write_inline)
from netreduce.errors import SwitchFailure
from netreduce.meta import (INLINE, CallMeta, CallRejected, MetaExchange, SwitchNotAggregating,
                            check_agreement)
from netreduce.registration import (Controller, LeaseKeeper, SwitchRegistrationError,
                                    SwitchStatus, register_inc_ring, switch_view,
                                    unregister)
from netreduce.rejoin import Backoff, Rejoiner
from netreduce.rings import Host, RingQPsLike, connect_ring, inc_ring_spec
from netreduce.routing import CallStats
from netreduce.settle import KeptCall, Recovery, SettlePlan, hand_sum, settle_plan
from netreduce.transport_fault import RingFault, fault_reason, faulted_ring, ring_of
from netreduce.workspace import RegisteredMemory, Workspace
from ring_setup.endpoints import HostEndpoint, RingEndpoint
from ring_setup.rendezvous import Rendezvous
from ring_setup.store_protocol import RendezvousError

logger = logging.getLogger(__name__)

NOTICE_GRACE = 0.5      # s a transfer error on "inc" waits for another rank's switch-away
#                         notice (its QPs went to ERROR just after it published one)
STALL_PROBE = 0.1       # s without progress on "inc" before a lease rank probes the switch
INC_POLL = 0.05         # s between the "inc" stream's liveness checks while it waits


class SwitchAway(Exception):
    """The switch stopped aggregating during this rank's call on "inc" (internal: the
    communicator settles and finishes the call over the host ring)."""


class AwayProtocol:
    """One rank's side of the switch (module doc): the "inc" ring (QPs, stream, endpoints),
    its registration (`status`, alike on every rank) and lease, the switch-away epochs
    settled, the last switch call kept, rank 0's back-off and Rejoiner. `settle`,
    `rejoin`, `wait_closing` and the call-side methods run under the communicator's call
    lock; the watch and lease threads only read `epoch` or publish a notice."""

    def __init__(self, *, rendezvous: Rendezvous, host: Host, control: RegisteredMemory,
                 endpoints: list[HostEndpoint], streams: dict[str, Stream],
                 inc: RingQPsLike | None, inc_config: FlowConfig, timeout: float,
                 status: SwitchStatus, controller: Controller | None, stats: CallStats,
                 meta: MetaExchange, workspaces: Sequence[Workspace],
                 slot: Callable[[int], int] = lambda seq: 0) -> None:
        self._rendezvous, self.rank = rendezvous, rendezvous.rank
        self._host, self._control = host, control
        self.endpoints = endpoints            # every rank's, "inc" as last built
        self._streams = streams               # the communicator's: "inc" replaced on rejoin
        self._inc = inc                       # this rank's "inc" QPs
        self._inc_config, self._timeout = inc_config, timeout
        self.status = status                  # is "inc" registered with a switch (all alike)
        self._controller = controller         # rank 0's controller client (or a renewer's)
        self._stats, self._meta = stats, meta
        self._workspaces, self._slot = workspaces, slot   # call seq's: workspaces[slot(seq)]
        self.epoch = 0                        # switch-away epochs settled (all alike)
        self.settling = 0                     # the epoch being settled, else the last one
        self.reason: str | None = None        # why the switch is away (None: it is not)
        self._away_at = (0, 0.0)              # the call settled and when, for the log
        self._kept: dict[int, KeptCall] = {}  # by seq: wire words that may be needed
        self._recovery: Recovery | None = None    # the last settled call finished from them
        self._began: CallMeta | None = None   # this rank's record of the last call it began
        self._failed_at: float | None = None  # when a wait on "inc" last failed (unsettled)
        self._generation = 0                  # "inc" rings built again
        self._rebuilt_for: int | None = None  # the call whose "inc" fault rebuilt at once
        self._meet: int | None = None         # that epoch, until every rank began the redo
        self._backoff = Backoff()
        self._rejoiner: Rejoiner | None = None
        self._unregistered = False
        self.closing = False                  # the communicator is closing: no new notice
        # settles a host-ring fault's epoch (netreduce.transport_fault.FaultRecovery.settle)
        self.on_fault: Callable[[int, int, str], None] | None = None
        self._stall = (0.0, STALL_PROBE)      # the stall probed: (its start, next probe at)
        self._watch(streams["inc"])
        self._lease = self._keep_lease()

    @property
    def aggregating(self) -> bool:
        """Calls may go through the switch: "inc" is registered and the switch not away."""
        return self.status.registered and self.reason is None

    @property
    def pending(self) -> bool:
        """Some rank published a switch-away notice this rank has not settled."""
        return self._rendezvous.notice_epoch > self.epoch

    @property
    def keeping(self) -> bool:
        """Switch calls' wire words are kept (their workspaces must stay untouched)."""
        return bool(self._kept)

    @property
    def rejoin_due(self) -> bool:
        """Rank 0's Rejoiner heard the controller: flag this call's record (`meta.REJOIN`)."""
        return self._rejoiner is not None and self._rejoiner.ready.is_set()

    def began(self, record: CallMeta) -> None:
        """This rank is about to exchange `record`, its record of the call it begins."""
        self._began = record

    def forget_kept(self, below: int | None = None) -> None:
        """The sums of the switch calls before call `below` (None: all) will never be
        needed again: every rank completed them (or a settle used them). A workspace's
        retired buffers go once no kept call uses that workspace."""
        self._kept = {seq: k for seq, k in self._kept.items()
                      if below is not None and seq >= below}
        if self._recovery is not None and (below is None or self._recovery.call < below):
            self._recovery = None
        used = {self._slot(seq) for seq in self._kept}
        for slot, workspace in enumerate(self._workspaces):
            if slot not in used:
                workspace.release_retired()

    def free_below(self, memory: RegisteredMemory) -> int:
        """How many bytes at the start of `memory` (a call's workspace, one of the two the
        calls in flight alternate) no kept call needs: all of it, unless it holds a kept
        call's sum, which starts at that call's receive area (`SWITCH.areas`; a small call
        keeps its records instead)."""
        return min((recv_offset(wire_bytes(k.context.count, k.context.world_size))
                    for k in self._kept.values()
                    if k.context.workspace is memory and not k.context.inline),
                   default=memory.nbytes)

    def run_switch(self, context: CallContext, src: np.ndarray, dst: np.ndarray,
                   record: CallMeta) -> None:
        """Run an agreed call through the switch, keeping it (`record`: this rank's)."""
        self._kept[context.seq] = KeptCall(context, record)
        self.on_inc(True, lambda: SWITCH.run(context, src, dst))

    def settle_inc(self, used: bool) -> None:
        """Wait for the acknowledgements of this call's records on "inc" (`used`: they went
        through the switch); a failure there is the switch's (`on_inc`)."""
        if used:
            self.on_inc(True, self._streams["inc"].settle)

    def on_inc(self, uses_inc: bool, step: Callable[[], Any]) -> Any:
        """Run `step`; when it moves data on "inc", a transport error there that comes with
        (or within NOTICE_GRACE s before) another rank's switch-away notice is `SwitchAway`:
        that rank moved its "inc" QPs to ERROR right after publishing it."""
        if not uses_inc:
            return step()
        try:
            return step()
        except FlowError as exc:
            self._failed_at = self._failed_at or time.monotonic()
            if not isinstance(exc, SwitchNotAggregating) and self._notice_within(NOTICE_GRACE):
                raise SwitchAway(f"a transfer on 'inc' failed after the switch went away: "
                                 f"{exc}") from exc
            if isinstance(exc, CompletionError):    # a transport fault: settled alike
                raise SwitchAway(fault_reason("inc", exc)) from exc
            if isinstance(exc, StallError):
                view = switch_view(self._controller if self.rank == 0 else None,
                                   self.status.ring_id)
                raise StallError(f"{exc}; {view}") from exc
            raise

    def _notice_within(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not self.pending:
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def _notice_reason(self) -> str:
        """The reason of the first switch-away notice not settled yet."""
        notices = self._rendezvous.notices
        return notices.get(self.epoch + 1) or notices[max(notices)]

    def _watch(self, stream: Stream) -> None:
        """Make `stream` ("inc") check `liveness` every INC_POLL s while it waits."""
        stream.liveness, stream.liveness_poll = self.liveness, INC_POLL

    def liveness(self) -> None:
        """The "inc" stream's liveness check: the peers' (PeerFailed), then whether some
        rank published a switch-away notice this rank has not settled (SwitchAway). A wait
        of STALL_PROBE s without progress makes this rank's lease keeper (if any) probe the
        switch (`LeaseKeeper.probe`), again each time the stall doubles: a switch that
        restarted or died during a call is noticed within a fraction of a second, not at
        the next renewal (every third of the lease)."""
        self._rendezvous.check_peers()
        epoch = self._rendezvous.notice_epoch
        if epoch > self.epoch:
            self._failed_at = self._failed_at or time.monotonic()
            raise SwitchAway(self._rendezvous.notices[epoch])
        if self._lease is None:
            return
        since = self._streams["inc"].last_progress
        if since != self._stall[0]:
            self._stall = (since, STALL_PROBE)
        idle = time.monotonic() - since
        if idle >= self._stall[1]:
            self._stall = (since, 2 * idle)
            self._lease.probe()

    def recovered(self) -> None:
        """This rank's call completed (idle: its settle ended): the time since the faults
        settled meanwhile were detected is lost (`CallStats.fault_recovered`)."""
        self._stats.fault_recovered(time.monotonic())

    def settle(self, position: int, target: np.ndarray | None = None,
               seen: str | None = None) -> bool:
        """Settle the next switch-away epoch (module doc) with this rank's `position` (the
        call it could not complete through the switch, or its next call when idle) and the
        output of its call in flight (`target`, None when idle); `seen`: what this rank
        saw, published as the notice unless one is pending. Returns True when the call in
        flight was completed from a good rank's sum (its output written)."""
        epoch = self.settling = self.epoch + 1
        failed_at, self._failed_at = self._failed_at or time.monotonic(), None
        if self._rendezvous.notice_epoch < epoch:
            self._rendezvous.notice(epoch, f"rank {self.rank}: {seen}")
        reason = self._notice_reason()
        if self.on_fault is not None and faulted_ring(reason) == "ring":
            return self._resume(self.on_fault(epoch, position, reason), position, target,
                                reason)                 # netreduce.transport_fault
        self._stop_lease()
        if self._inc is not None:
            self._inc.to_error()    # no late WRITE through the lost switch lands in our memory
        # what the switch gave this rank with a good seal (its last call completed), before
        # any rank's recovery ring can write into that workspace (staging overlaps it)
        good = self._kept.get(position - 1)
        expected = SWITCH.areas(good.context)[1][:good.context.count].copy() \
            if good is not None and not good.context.inline else None
        gathered = self._rendezvous.gather(
            f"away.{epoch}", {"position": position, "left": self._streams["ring"].interrupted,
                              "controller": self._controller is not None},
            self._timeout, waiting_for=f"settled the switch's loss (epoch {epoch})")
        if self.on_fault is not None and any(p.get("left") for p in gathered):
            # a rank left a "ring" wait mid-transfer for this notice: settled as a host-ring
            # fault (the ring rebuilt, a host-ring call completed somewhere redone there)
            return self._resume(self.on_fault(epoch, position, reason), position, target,
                                reason)
        plan = settle_plan([p["position"] for p in gathered])
        if faulted_ring(reason) == "inc":
            self._stats.fault_detected(failed_at)
        recovered = False
        if plan.recover:
            last = self._kept.get(plan.call)
            self._recovery = Recovery(plan.call, record=self._began if last is None else
                                      last.record) \
                if last is None or last.context.inline else \
                Recovery.handing(plan, last.context, expected if last is good else None,
                                 self.rank)
            try:
                recovered = self._recover(position, target, reason)
            except (RingFault, CompletionError, CallRejected):
                self._left(epoch, reason, plan)     # the recovery is redone in the next epoch
                raise                               # (refused: alike on the ranks at k*)
        if not (gathered[0]["controller"] and self._rebuild_at_once(epoch, reason, plan)):
            self._left(epoch, reason, plan)
        return recovered

    def resuming(self, call: int) -> bool:
        """Settled call `call` is finished from a good rank's kept sum (`Recovery`), not
        redone from its input: a host-ring fault interrupted that, or may have."""
        return self._recovery is not None and self._recovery.call == call

    def _resume(self, call: int, position: int, target: np.ndarray | None,
                reason: str) -> bool:
        """After host-ring fault epoch settled for call `call` (its ring rebuilt): finish
        it again from the kept data when a settle was finishing it (every rank holds that
        `Recovery`, alike); True when that wrote this rank's `target`."""
        return self.resuming(call) and self._recover(position, target, reason)

    def _recover(self, position: int, target: np.ndarray | None, reason: str) -> bool:
        """Finish settled call k* (`_recovery`) over the host ring from a good rank's kept
        data; the ranks at k* (`position`) write the result into `target` (True), the
        others check it against what the switch gave them. Redoable: it reads only what
        the `Recovery` and the kept records hold."""
        rec = self._recovery
        assert rec is not None
        if rec.context is None or rec.words is None:
            return self._finish_inline(rec.call, position, target, reason)
        summed = hand_sum(rec, self._streams, self.rank, self.status.controller)
        if position != rec.call:
            return False
        assert target is not None, "a rank at the settled call has it in flight"
        SWITCH.deliver(rec.context, summed, target)
        return True

    def _rebuild_at_once(self, epoch: int, reason: str, plan: SettlePlan) -> bool:
        """Epoch `epoch` is a transport fault on "inc" (no switch-away notice named the
        switch's loss), the first one settled for call k* (`plan`), no rank completed k*
        (none holds a sum to hand over), and rank 0 holds a controller client: the switch
        most likely holds the ring still (a rank later than the retry budget, a link that
        flapped), so every rank builds a fresh "inc" ring at once and rank 0 registers it
        in place of the old one (unregistered first; lease, owner and quota as before).
        Calls from k* on go through the switch again, k* redone there once every rank met
        the others in the store (`meet`): algo="switch" is not refused. True when it is
        registered; else, or a second fault of the same call (the link stays dark), or a
        plan that hands a good rank's sum over the host ring (a host-ring fault there may
        end that on some ranks only: every rank must take the same next step), the caller
        leaves the switch as for its loss (`_left`)."""
        if faulted_ring(reason) != "inc" or self._rebuilt_for == plan.call or plan.recover:
            return False
        self._rebuilt_for = plan.call
        self.forget_kept()
        lost_ring, self.epoch = self.status.ring_id, epoch
        if self.rank == 0 and lost_ring is not None:
            unregister(self._controller, lost_ring, quiet=True)
        t0 = time.monotonic()
        status, ring_id = self._build_inc()
        if not status.registered:
            logger.warning("netreduce: rank %d: after %s, the switch at %s did not register "
                           "ring %s: %s", self.rank, reason, self.status.controller, ring_id,
                           status.note)
            return False
        self.status = status
        self._lease = self._keep_lease()
        self._meet = epoch
        counts = self._stats.fault_rebuilt()
        if self.rank == 0:
            logger.warning("netreduce: %s; epoch %d: 'inc' rebuilt at once (%.2f s), ring %s "
                           "registered in place of %s; call #%d redone, calls go on through "
                           "the switch (transport counts: %s)", reason, epoch,
                           time.monotonic() - t0, ring_id, lost_ring, plan.call,
                           _counts(counts))
        return True

    def meet(self) -> None:
        """Before this rank's first attempt after an "inc" rebuilt at once
        (`_rebuild_at_once`; every rank's next attempt is that call): wait for every rank
        in the store, where a rank later than the RC retry budget -- the likeliest cause of
        that fault -- is waited for up to the collective timeout
        (PeerFailed if it dies), not on "inc", where the budget would fail the QPs again.
        A notice that comes meanwhile is `SwitchAway` (settled first; the ranks meet at
        their next attempt)."""
        if self._meet is not None:
            epoch = self._meet
            if self._rendezvous.gather(f"redo.{epoch}", True, self._timeout,
                                       waiting_for=f"began the call redone after epoch {epoch}",
                                       until=lambda: self.pending) is None:
                raise SwitchAway(self._notice_reason())
            self._meet = None

    def fall_back(self, epoch: int, reason: str, call: int) -> None:
        """Leave the switch at notice `epoch` without a settle plan: a host-ring fault in
        call `call` while the switch aggregates (netreduce.transport_fault redoes that call
        over the host ring, whose records then travel there too). As for the switch's loss:
        "inc" to ERROR, the lease stopped, rank 0 asks the controller again after the
        back-off."""
        self._stop_lease()
        if self._inc is not None:
            self._inc.to_error()
        self._left(epoch, reason, SettlePlan(call, False, ()))

    def _left(self, epoch: int, reason: str, plan: SettlePlan) -> None:
        """Epoch `epoch` settled by leaving the switch (`plan`): count, start rank 0's
        Rejoiner, log. A call it finishes from the kept data stays kept (`Recovery`)."""
        self.forget_kept(plan.call if plan.recover else None)
        lost_ring = self.status.ring_id
        self.epoch, self.reason = epoch, reason
        self._away_at = (plan.call, time.monotonic())
        self._stats.switch_event("fallbacks")
        counts = self._stats.switch_event("recovered", int(plan.recover))
        if faulted_ring(reason) == "inc":
            self._stats.fault_event("faults")
            self._stats.fault_event("redone")
        if self.rank == 0 and self._controller is not None:
            delay = self._backoff.lost()
            self._rejoiner = Rejoiner(self._controller, delay, lost_ring)
            when = f"rank 0 asks the controller again in {delay:g} s"
        else:
            when = "no controller to ask again"
        if self.rank == 0:
            logger.warning("netreduce: the switch at %s stopped aggregating ring %s (%s): "
                           "fallback %d at call #%d: %s; calls run over the host ring, %s "
                           "(switch counts: %s)", self.status.controller, lost_ring, reason,
                           counts["fallbacks"], plan.call, plan.describe(), when,
                           _counts(counts))

    def _finish_inline(self, seq: int, position: int, target: np.ndarray | None,
                       reason: str) -> bool:
        """Settle call `seq`, a small call that travelled in its records (INLINE), which
        the switch completed for some ranks only (it was lost while it emitted their
        sums): every rank exchanges its record of it again around the host ring (the one
        `Recovery.record` holds, so a redo after a host-ring fault sends it again, also
        from a rank an earlier attempt completed it on); the ranks without it (`position`
        == `seq`) write its result from those records into `target`, the ranks the switch
        gave records check that it gave them the same. Returns True when it wrote
        `target`. `SwitchFailure` when this rank holds neither that call's wire words
        (`settle` sums those) nor its record of a small call."""
        rec, last = self._recovery, self._kept.get(seq)
        assert rec is not None and rec.call == seq
        mine = rec.record
        if mine is None or mine.seq != seq or not mine.flags & INLINE:
            if position > seq and last is None:
                raise SwitchFailure(
                    f"netreduce: rank {self.rank}: the switch at {self.status.controller} was "
                    f"lost ({reason}) while some ranks lacked the records of call #{seq}, "
                    f"which this rank refused from them and left (it keeps nothing to finish "
                    f"it with)")
            raise SwitchFailure(
                f"netreduce: rank {self.rank}: the switch at {self.status.controller} was "
                f"lost ({reason}); call #{seq} must be finished from a good rank's sum (or "
                f"every rank's records), but this rank holds "
                f"{'those of calls ' + str(sorted(self._kept)) if self._kept else 'none'}")
        records = self._meta.exchange(mine, through_switch=False)
        if position > seq:
            if last is not None and tuple(m.blocks for m in records) != last.context.blocks:
                raise SwitchFailure(
                    f"netreduce: rank {self.rank}: allreduce call #{seq}: the records the "
                    f"switch at {self.status.controller} returned differ from every rank's "
                    f"records exchanged over the host ring: the result returned was wrong")
            return False
        assert target is not None, "a rank at the settled call has it in flight"
        check_agreement(records)
        divisor = len(records) if records[0].op == "avg" else 1
        write_inline(inline_sum([m.blocks for m in records], divisor, target.dtype), target)
        return True

    def rejoin(self, seq: int) -> None:
        """Collective, inside call `seq` (rank 0's record asked for it, so alike on every
        rank): build a fresh "inc" ring and let rank 0 register it (`_build_inc`).
        Registered: calls from `seq` + 1 on may take the switch again; else rank 0 backs
        off and asks again later."""
        if self._rejoiner is not None:
            self._rejoiner.stop()
            self._rejoiner = None
        status, ring_id = self._build_inc()
        if not status.registered:
            if self.rank == 0 and self._controller is not None:
                delay = self._backoff.failed()
                self._rejoiner = Rejoiner(self._controller, delay, None)
                logger.warning("netreduce: the switch at %s did not register ring %s again "
                               "at call #%d: %s; calls keep running over the host ring, rank "
                               "0 asks again in %g s", self.status.controller, ring_id,
                               seq, status.note, delay)
            return
        away_call, since = self._away_at
        if faulted_ring(self.reason or "") == "inc":
            self._stats.fault_event("rebuilds")
        self.status, self.reason = status, None
        self._backoff.returned()
        counts = self._stats.switch_event("returns")
        self._lease = self._keep_lease()
        if self.rank == 0:
            logger.warning("netreduce: back on the switch at %s: ring %s registered at call "
                           "#%d, %.1f s and %d call(s) after it went away; calls from #%d on "
                           "aggregate in the network again (switch counts: %s)",
                           status.controller, status.ring_id, seq, time.monotonic() - since,
                           seq - away_call, seq + 1, _counts(counts))

    def _build_inc(self) -> tuple[SwitchStatus, str]:
        """Collective: a fresh "inc" ring (new QPs and PSNs: the old ones are in ERROR, and
        a new switch knows none of them), connected through the store, registered by rank
        0: the status, alike on every rank (not registered: its note says why), and the
        new ring's id."""
        gen = self._generation + 1
        if self._inc is not None:
            try:
                self._inc.close()
            except Exception as exc:    # noqa: BLE001 - in ERROR, unused: leaking it is safe
                logger.warning("netreduce: rank %d: the old 'inc' QPs could not be destroyed "
                               "(they stay in ERROR until the device closes): %s",
                               self.rank, exc)
        qps = self._host.create_ring("inc", self._inc_config)
        theirs = self._rendezvous.gather(f"inc.{gen}", qps.local().to_dict(), self._timeout,
                                         waiting_for=f"rebuilt 'inc' ({gen})")
        endpoints = [replace(ep, rings={**ep.rings, "inc": RingEndpoint.from_dict(d)})
                     for ep, d in zip(self.endpoints, theirs)]
        self._streams["inc"] = connect_ring(qps, "inc", self._inc_config, endpoints,
                                            self.rank, self._control, self.liveness)
        self._watch(self._streams["inc"])
        self._inc, self.endpoints, self._generation = qps, endpoints, gen
        self._rendezvous.gather(f"inc-ready.{gen}", True, self._timeout,
                                waiting_for=f"connected 'inc' ({gen})")
        spec = inc_ring_spec(endpoints, self._inc_config, self._rendezvous.job_key)
        try:
            status = register_inc_ring(self._rendezvous, spec,
                                       self._controller if self.rank == 0 else None,
                                       self.status.choice, key=f"switch.{gen}")
        except SwitchRegistrationError as exc:
            status = replace(self.status, ring_id=None, note=str(exc))
        return status, spec.ring_id

    def wait_closing(self, position: int, timeout: float) -> None:
        """Before leaving a ring registered with a switch: wait (up to `timeout` s) until
        every rank is closing too, settling a switch-away notice that arrives meanwhile --
        a rank without a good seal for the last call may need this rank's sum of it
        (`position`: this rank's next call). A transport fault of a call redone in a settle
        (its epoch settled) is settled next, as in a call (`Communicator._settle`)."""
        seen: str | None = None
        while seen is not None or self._rendezvous.gather(
                "closing", position, timeout, waiting_for="closed",
                until=lambda: self.pending) is None:
            epoch = self.epoch
            try:
                self.settle(position, seen=seen)
                self.recovered()
                seen = None
            except (RingFault, CompletionError) as exc:
                if self.epoch == epoch:
                    raise
                seen = fault_reason(ring_of(exc), exc) if isinstance(exc, CompletionError) \
                    else None

    def _keep_lease(self) -> LeaseKeeper | None:
        """A lease keeper for the registered ring on this rank (ranks LEASE_RANKS with a
        controller client), reporting a loss as a switch-away notice of the next epoch."""
        if self._controller is None or not self.status.registered or self.status.lease_ms <= 0:
            return None
        epoch = self.epoch + 1
        return LeaseKeeper(self._controller, self.status,
                           lambda why: self._lease_lost(epoch, why),
                           judge_silence=self.rank == 0,
                           job_alive=self._rendezvous.peers_alive)

    def _lease_lost(self, epoch: int, why: str) -> None:
        """The keeper thread heard the switch lose the ring: tell every rank (they settle)."""
        if epoch <= self.epoch or self.closing:
            return
        try:
            self._rendezvous.notice(epoch, f"rank {self.rank}: {why}")
        except RendezvousError as exc:
            logger.warning("netreduce: rank %d: %s, and the store could not be told: %s",
                           self.rank, why, exc)

    def _stop_lease(self) -> None:
        if self._lease is not None:
            self._lease.stop()
            self._lease = None

    def release(self) -> None:
        """Stop renewing the lease and asking the switch back, and unregister the "inc"
        ring (rank 0; once; not while the switch is away: it lost the ring)."""
        self._stop_lease()
        if self._rejoiner is not None:
            self._rejoiner.stop()
            self._rejoiner = None
        if self.rank == 0 and self._controller is not None and self.status.ring_id is not None \
                and self.reason is None and not self._unregistered:
            self._unregistered = True
            unregister(self._controller, self.status.ring_id)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())
