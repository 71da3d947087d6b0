"""From an admitted verdict to a committed claim: the tick's sets and the single-schedule paths.

Every path that may fire goes through :func:`admission.admit`: the tick with the set of its due timed
schedules (``evaluation.py``), and here, with a set of one, a manual fire, a missed fire's recovery
run and a github event. Each single path is ONE transaction that takes the schedule's row lock and
checks the row is still as its caller read it (:func:`occurrence.lock`, S1), reads the gate inputs
(:func:`admission.read_inputs`), lets the gates decide, and writes what the verdict means on its path
together with the claim's compare-and-set (S1, S5, S6, S13). The fires launch after the commit.

Every transaction that writes for an automatic fire is fenced by the leadership (S16); a manual
fire is an operator's act and is not.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from statebook.lifecycle import Actor, Book, Reason, transition

from . import admission
from .admission import DUE, ON_DEMAND, Gates, SlotHandle, Slots, Verdict
from .evaluation import Decision, decide_and_write, deferral_record
from .leadership import Leader
from .occurrence import claim, exhaust, lock
from .runs import open_run, open_runs
from .errors import CapacityExhausted, ScheduleError
from .store import SCHEDULER, actor_arg, note_arg, schedule_row, with_note
from .triggers import following, missed_between

Launch = Callable[[Mapping[str, Any], str, Mapping[str, Any], SlotHandle], None]
"""``launch(schedule, run_id, context, slot)``: start a committed fire (the engine's, outside any transaction)"""


class Firing:
    """Admission and claims for one engine; its slots, deferral counts and counters."""

    def __init__(self, book: Book, *, leader: Leader, slots: Slots, daemon_id: str, zone: str | None,
                 record_every: int, launch: Launch, stats: dict[str, int]) -> None:
        self.book = book
        self.leader = leader
        self.slots = slots
        self.daemon_id = daemon_id
        self.zone = zone
        self.record_every = record_every
        self.launch = launch
        self.stats = stats
        self.deferrals: dict[str, int] = {}
        """schedule id -> consecutive deferrals (in memory, per daemon; the records are the audit)"""
        self.deferred_now = False
        """a fire was deferred since the engine last cleared this (it then ticks again soon)"""

    @contextlib.asynccontextmanager
    async def fenced(self) -> AsyncIterator[tuple[Book, int | None]]:
        """A write transaction for a fire and the lease epoch: its first statement is the leadership
        fence (S16), so a daemon that lost the lease writes nothing (``LeadershipLost``, rolled back)."""
        async with self.book.begin() as tx:
            yield tx, await self.leader.fence(tx)

    # -- the tick's set ---------------------------------------------------------------------------
    async def decide(self, due: Sequence[Mapping[str, Any]], now: float) -> list[Decision]:
        """The committed decisions of due timed schedules (``evaluation.py``), fenced, not yet started."""
        return await decide_and_write(
            self.book, due, now, zone=self.zone, slots=self.slots, deferrals=self.deferrals,
            record_every=self.record_every, daemon_id=self.daemon_id, fence=self.leader.fence)

    def started(self, decisions: Sequence[Decision]) -> None:
        """After the commit: count, remember deferrals and launch the fires (outside any transaction)."""
        for d in decisions:
            if d.outcome == "skipped_overlap" and d.run_id is not None:
                self.stats["skipped"] += 1
            elif d.outcome == "deferred":
                self._deferred(d.schedule["id"], d.deferrals or 0)
            elif d.outcome == "fired" and d.handle is not None and d.run_id is not None:
                handle, d.handle = d.handle, None
                self._launch(d.schedule, d.run_id, d.context or {}, handle)

    # -- one schedule -----------------------------------------------------------------------------
    async def _judge(self, tx: Book, s: Mapping[str, Any], now: float, gates: Gates, *,
                     statuses: tuple[str, ...] = ("active",), guards: tuple[str, ...] = ("next_fire_at",),
                     ) -> tuple[Mapping[str, Any] | None, Verdict | None]:
        """Inside ``tx``: lock ``s`` (None when it changed under its caller) and admit it, a set of one."""
        (current,) = await lock(tx, [s], statuses=statuses, guards=guards)
        if current is None:
            return None, None
        inputs = await admission.read_inputs(tx, [current], now, gates=gates)
        (verdict,) = admission.admit([current], inputs, self.slots, now=now, gates=gates)
        return current, verdict

    async def advance(self, s: Mapping[str, Any], due: float, nxt: float | None, code: str, summary: str,
                      patch: Mapping[str, Any] | None = None) -> bool:
        """Move the cadence past ``due`` without a fire (S1: the claim's compare-and-set); False on conflict."""
        async with self.fenced() as (tx, _):
            out = await claim(tx, s, due, nxt, fired=False, extra=patch, reason=Reason(code, summary))
        return out.applied

    async def manual(self, schedule_id: str, *, actor: Actor = SCHEDULER, note: str | None = None) -> str:
        """An operator's fire (S5): budget, max_runs and a global slot; a refusal raises and opens no run
        (budget or max_runs spent exhausts an active schedule, as the tick would). Returns the run id.
        ``actor`` and ``note`` are the facts' (the schedule's and the run's) actor and summary's note."""
        actor_arg(actor)
        note_arg(note)
        s = await schedule_row(self.book, schedule_id)
        if s["status"] not in ("active", "paused"):
            raise ScheduleError(f"schedule {s['name']} is {s['status']}; enable it before firing")
        now = self.book.clock.now()
        context = {"trigger": "manual", "schedule": s["name"], "fired_at": now}
        verdict: Verdict | None = None
        run_id: str | None = None
        try:
            async with self.book.begin() as tx:  # not fenced: an operator's act needs no leadership (S16)
                current, verdict = await self._judge(tx, s, now, ON_DEMAND, statuses=("active", "paused"), guards=())
                refusal = _manual_refusal(s, current, verdict, self.slots)
                if current is not None and verdict is not None:
                    if verdict.gate in ("budget", "max_runs") and current["status"] == "active":
                        await exhaust(tx, current, f"schedule.exhausted.{verdict.gate}", verdict.summary)
                    elif refusal is None and (await _touch(tx, current, with_note("schedule_run.running.manual", note),
                                                           actor)).applied:
                        run_id = await open_run(tx, current, context=context, daemon_id=self.daemon_id, actor=actor,
                                                reason=Reason("schedule_run.running.manual",
                                                              with_note("manual fire", note)))
        except BaseException:
            _release(verdict)
            raise
        if refusal is not None or run_id is None or verdict is None or verdict.handle is None:
            _release(verdict)
            raise refusal or ScheduleError(f"schedule {s['name']} could not be fired (changed concurrently)")
        self._launch(current or s, run_id, context, verdict.handle)
        return run_id

    async def missed(self, s: Mapping[str, Any], now: float) -> None:
        """An occurrence that fell due while no daemon ran, by the schedule's missed_fire_policy (S6)."""
        if s["trigger_type"] == "github_poll":
            return  # S13: the cursor covers the downtime; the next tick polls
        due = s["next_fire_at"]
        nxt = following(s, due, now, self.zone)
        count = missed_between(s, due, now, self.zone)
        evidence = (f"occurrence_at:{due}", f"missed:{count}", f"detected_at:{now}")
        context: dict[str, Any] = {"trigger": "missed_fire", "occurrence_at": due, "missed": count, "schedule": s["name"]}
        if s["missed_fire_policy"] == "skip":
            async with self.fenced() as (tx, _):
                out = await claim(tx, s, due, nxt, fired=False, reason=Reason(
                    "schedule.active.missed_fire", f"{count} occurrence(s) missed while down; skipped", evidence))
                if out.applied:
                    await open_run(tx, s, status="skipped", context=context, daemon_id=self.daemon_id,
                                   occurrence_at=due, reason=Reason(
                                       "schedule_run.skipped.missed_fire", f"{count} occurrence(s) missed", evidence))
            return
        # run_once: reserve the next fire time; only the reserver admits and opens one recovery run.
        verdict: Verdict | None = None
        run_id = None
        try:
            async with self.fenced() as (tx, epoch):
                current, verdict = await self._judge(tx, s, now, ON_DEMAND)
                if current is None or verdict is None:
                    return
                out = await claim(tx, current, due, nxt, fired=True, reason=Reason(
                    "schedule.active.missed_fire", f"{count} occurrence(s) missed; one recovery run", evidence))
                if out.conflict:
                    _release(verdict)
                    return
                if verdict.gate in ("budget", "max_runs"):
                    if nxt is not None:  # a one-shot's claim already exhausted it
                        await exhaust(tx, {**current, "next_fire_at": nxt}, f"schedule.exhausted.{verdict.gate}",
                                      verdict.summary)
                elif verdict.gate == "capacity":
                    await open_run(tx, current, status="skipped", context=context, daemon_id=self.daemon_id,
                                   occurrence_at=due, reason=Reason("schedule_run.skipped.deferred_capacity",
                                                                    "no slot for the recovery run"))
                else:
                    if epoch is not None:
                        context["leader_epoch"] = epoch
                    run_id = await open_run(tx, current, context=context, daemon_id=self.daemon_id,
                                            occurrence_at=due, reason=Reason("schedule_run.running.recovery",
                                                                             "missed_fire fire"))
        except BaseException:
            _release(verdict)
            raise
        if run_id is not None and verdict is not None and verdict.handle is not None:
            self._launch(s, run_id, context, verdict.handle)

    async def event(self, s: Mapping[str, Any], due: float, cursor: str | None, event_id: str,
                    context: Mapping[str, Any]) -> str:
        """A github event of the occurrence ``due`` (S13): the gates, then move the cursor to
        ``event_id`` and open its run in ONE transaction. Returns "fired", "overlap", "capacity"
        (nothing moved: the event waits above the cursor), "exhausted" or "conflict"."""
        now = self.book.clock.now()
        verdict: Verdict | None = None
        deferred: int | None = None
        run_id = None
        try:
            async with self.fenced() as (tx, epoch):
                current, verdict = await self._judge(tx, {**s, "github_cursor": cursor}, now, DUE,
                                                     guards=("next_fire_at", "github_cursor"))
                if current is None or verdict is None:
                    return "conflict"
                if verdict.gate == "overlap":
                    return "overlap"
                if verdict.gate in ("budget", "max_runs"):
                    await exhaust(tx, current, f"schedule.exhausted.{verdict.gate}", verdict.summary)
                    return "exhausted"
                if verdict.gate == "capacity":
                    deferred = self.deferrals.get(s["id"], 0) + 1
                    record = deferral_record(current, context, deferred, now=now, every=self.record_every,
                                             limit=self.slots.limit, daemon_id=self.daemon_id)
                    if record is not None:
                        await open_runs(tx, [(current, record)])
                else:
                    if epoch is not None:
                        context = {**context, "leader_epoch": epoch}
                    out = await transition(
                        tx, "schedule", s["id"], "active", expected="active", actor=SCHEDULER,
                        guards={"next_fire_at": due, "github_cursor": cursor},
                        patch={"github_cursor": event_id, "last_fired_at": now},
                        reason=Reason("schedule.active.poll_event", f"{context['event_type']} {event_id} claimed by "
                                      f"{self.daemon_id}", (f"github_event:{event_id}",)),
                        on_conflict="return",
                    )
                    if out.conflict:
                        _release(verdict)
                        return "conflict"
                    run_id = await open_run(tx, current, context=context, daemon_id=self.daemon_id, occurrence_at=due,
                                            reason=Reason("schedule_run.running.fired", f"github event {event_id}"))
        except BaseException:
            _release(verdict)
            raise
        if deferred is not None:
            self._deferred(s["id"], deferred)
            return "capacity"
        assert run_id is not None and verdict is not None and verdict.handle is not None
        self._launch(s, run_id, context, verdict.handle)
        return "fired"

    # -- bookkeeping after a commit ---------------------------------------------------------------
    def _deferred(self, schedule_id: str, count: int) -> None:
        self.deferrals[schedule_id] = count
        self.stats["deferred"] += 1
        self.deferred_now = True

    def _launch(self, s: Mapping[str, Any], run_id: str, context: Mapping[str, Any], handle: SlotHandle) -> None:
        self.deferrals.pop(s["id"], None)
        self.launch(s, run_id, context, handle)


def _manual_refusal(s: Mapping[str, Any], current: Mapping[str, Any] | None, verdict: Verdict | None,
                    slots: Slots) -> ScheduleError | None:
    if current is None or verdict is None:
        return ScheduleError(f"schedule {s['name']} could not be fired (changed concurrently; it is no longer "
                             "active or paused)")
    if verdict.gate == "budget":
        return ScheduleError(f"schedule {s['name']} has exhausted its budget ({verdict.summary})")
    if verdict.gate == "max_runs":
        return ScheduleError(f"schedule {s['name']} has used all {current['max_runs']} of its runs")
    if verdict.gate == "capacity":
        return CapacityExhausted(f"all {slots.limit} global slots are busy; try again when a run ends")
    return None


def _release(verdict: Verdict | None) -> None:
    if verdict is not None and verdict.handle is not None:
        verdict.handle.release()


async def _touch(tx: Book, s: Mapping[str, Any], why: str, actor: Actor = SCHEDULER) -> Any:
    """A same-status transition on the schedule: a manual fire audited on the schedule (S5)."""
    status = s["status"]
    return await transition(tx, "schedule", s["id"], status, expected=status, actor=actor,
                            patch={"last_fired_at": tx.clock.now()},
                            reason=Reason(f"schedule.{status}.manual_fire", why), on_conflict="return")
