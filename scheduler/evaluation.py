"""Evaluating a set of due schedules together: the gates for all of them, then ONE transaction.

The tick's schedule evaluation (S1, S5) in a constant number of statements, whatever the number
of due schedules:

1. lock the due rows (:func:`occurrence.lock`: PostgreSQL ``FOR UPDATE``; on SQLite the transaction
   holds the write lock) and re-read them: a row no longer ``active`` at the occurrence read before
   is someone else's claim (``conflict``, nothing written);
2. read every gate input with one grouped query per input (:func:`admission.read_inputs`) — inside
   the transaction, after the lock, so max_runs is counted where no other claimant can add a run;
3. let :func:`admission.admit` decide the set in due order (the gates in S5's order, the global slot
   last) and turn each verdict into what it writes (:func:`decide`);
4. write the decisions: every schedule transition (claim, advance, exhaust) with one ``apply_many``,
   every run (fired, skipped for overlap, deferral record) with one ``create_many``.

Launches happen after the commit, outside the transaction (``firing.Firing.started``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Command, NewEntity, Reason, apply_many

from . import admission as gates
from .occurrence import claim_command, exhaust_command, lock
from .runs import new_run, open_runs
from .schema import schedules
from .triggers import following


@dataclass
class Decision:
    """What the gates decided for one due schedule; ``outcome`` is what ``consider`` returns."""

    schedule: Mapping[str, Any]
    """the locked row the gates read (the row as first read when it changed meanwhile)"""
    outcome: str
    command: Command | None = None
    """the schedule's transition: claim, advance or exhaust"""
    run: NewEntity | None = None
    """the run written with it (fired, skipped for overlap) or alone (a deferral record)"""
    context: Mapping[str, Any] | None = None
    handle: gates.SlotHandle | None = None
    """the global slot a fire holds"""
    deferrals: int | None = None
    """the schedule's deferral count after this evaluation, when it was deferred"""
    run_id: str | None = None

    def release(self) -> None:
        """Give back the concurrency slot the decision holds, if any (idempotent)."""
        if self.handle is not None:
            self.handle.release()
            self.handle = None


def due_query(now: float, limit: int = 1000) -> sa.Select[Any]:
    """Active schedules due at ``now``, in due order ``(next_fire_at, id)`` (S5: the earliest get the slots)."""
    s = schedules
    return (sa.select(s).where(s.c.status == "active", s.c.next_fire_at.is_not(None), s.c.next_fire_at <= now)
            .order_by(s.c.next_fire_at, s.c.id).limit(limit))


async def decide_and_write(book: Book, due: Sequence[Mapping[str, Any]], now: float, *, zone: str | None,
                           slots: gates.Slots, deferrals: Mapping[str, int], record_every: int,
                           daemon_id: str, fence: Callable[[Book], Awaitable[int | None]] | None = None,
                           ) -> list[Decision]:
    """Steps 1-4 above in one transaction; the committed decisions in due order (fires hold their
    slots, not yet launched). On an error nothing is written, every slot taken is given back and the
    error propagates.

    ``fence`` (the leadership's, S16) runs first in the transaction; the epoch it returns is recorded
    in the trigger context of every run fired."""
    decisions: list[Decision] = []
    verdicts: list[gates.Verdict] = []
    try:
        async with book.begin() as tx:
            epoch = await fence(tx) if fence is not None else None
            current = await lock(tx, due)
            live = [s for s in current if s is not None]
            inputs = await gates.read_inputs(tx, live, now)
            verdicts = gates.admit(live, inputs, slots, now=now)
            judged = iter(verdicts)
            for stale, s in zip(due, current, strict=True):
                if s is None:
                    decisions.append(Decision(stale, "conflict"))
                    continue
                decisions.append(decide(s, next(judged), now=now, zone=zone, deferrals=deferrals,
                                        record_every=record_every, daemon_id=daemon_id, epoch=epoch,
                                        limit=slots.limit))
            await write(tx, decisions)
    except BaseException:
        for v in verdicts:
            if v.handle is not None:
                v.handle.release()
        raise
    return decisions


def decide(s: Mapping[str, Any], verdict: gates.Verdict, *, now: float, zone: str | None,
           deferrals: Mapping[str, int], record_every: int, daemon_id: str, epoch: int | None = None,
           limit: int = 0) -> Decision:
    """What the tick writes for one due schedule's verdict (S5); a fire keeps the verdict's slot."""
    due = s["next_fire_at"]
    nxt = following(s, due, now, zone)
    context = {**occurrence_context(s, epoch), **(verdict.alert or {})}
    gate = verdict.gate
    if gate in ("threshold_ok", "threshold_cooldown"):
        return Decision(s, gate, claim_command(s, due, nxt, now=now, fired=False,
                                               reason=Reason(f"schedule.active.{gate}", verdict.summary)))
    if gate == "overlap":
        return Decision(s, "skipped_overlap", claim_command(
            s, due, nxt, now=now, fired=False, reason=Reason("schedule.active.skipped_overlap", "previous run still running"),
        ), new_run(s, now=now, status="skipped", context=context, daemon_id=daemon_id, occurrence_at=due, reason=Reason(
            "schedule_run.skipped.overlap", verdict.summary)), context)
    if gate in ("budget", "max_runs"):
        return Decision(s, f"exhausted_{gate}", exhaust_command(s, f"schedule.exhausted.{gate}", verdict.summary))
    if gate == "capacity":
        count = deferrals.get(s["id"], 0) + 1
        return Decision(s, "deferred", None, deferral_record(s, context, count, now=now, every=record_every,
                                                             limit=limit, daemon_id=daemon_id),
                        context, deferrals=count)
    extra = {"last_alert_at": now} if verdict.alert is not None else {}
    command = claim_command(s, due, nxt, now=now, extra=extra, reason=Reason(
        "schedule.active.fire_claimed", f"occurrence {due} claimed by {daemon_id}"))
    run = new_run(s, now=now, context=context, daemon_id=daemon_id, occurrence_at=due,
                  reason=Reason("schedule_run.running.fired", f"{context.get('trigger')} fire"))
    return Decision(s, "fired", command, run, context, verdict.handle)


def occurrence_context(s: Mapping[str, Any], epoch: int | None) -> dict[str, Any]:
    """The trigger context of a due occurrence's run; with the lease epoch it was fired under (S16)."""
    context: dict[str, Any] = {"trigger": s["trigger_type"], "occurrence_at": s["next_fire_at"], "schedule": s["name"]}
    if epoch is not None:
        context["leader_epoch"] = epoch
    return context


def deferral_record(s: Mapping[str, Any], context: Mapping[str, Any], count: int, *, now: float, every: int,
                    limit: int, daemon_id: str) -> NewEntity | None:
    """The skipped ``deferred_capacity`` run of deferral ``count`` (S5: the first and every ``every``-th)."""
    if not gates.deferral_recorded(count, every):
        return None
    return new_run(s, now=now, status="skipped", context={**context, "deferrals": count}, daemon_id=daemon_id,
                   occurrence_at=s["next_fire_at"], reason=Reason(
                       "schedule_run.skipped.deferred_capacity",
                       f"all {limit} slots busy; deferral {count}, the fire stays due"))


async def write(tx: Book, decisions: Sequence[Decision]) -> None:
    """Every schedule transition with one ``apply_many``, then every run with one ``create_many``.

    A transition that finds its row changed (impossible while the rows are locked, kept for safety)
    writes nothing and its run is not opened: the decision becomes ``conflict`` and gives its slot back.
    """
    planned = [d for d in decisions if d.command is not None]
    outcomes = await apply_many(tx, [d.command for d in planned if d.command is not None]) if planned else []
    lost: set[int] = set()
    for d, out in zip(planned, outcomes, strict=True):
        if out.conflict:
            lost.add(id(d))
            d.release()
            if d.outcome != "skipped_overlap" and not d.outcome.startswith("exhausted"):
                d.outcome = "conflict"
    opened = [d for d in decisions if d.run is not None and id(d) not in lost]
    ids = await open_runs(tx, [(d.schedule, d.run) for d in opened if d.run is not None])
    for d, run_id in zip(opened, ids, strict=True):
        d.run_id = run_id
