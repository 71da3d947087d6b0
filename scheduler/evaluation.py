"""Evaluating a set of due schedules together: the gates for all of them, then ONE transaction.

The tick's schedule evaluation (S1, S5) in a constant number of statements, whatever the number
of due schedules:

1. lock the due rows (PostgreSQL ``FOR UPDATE``; on SQLite the transaction holds the write lock)
   and re-read them: a row no longer ``active`` at the occurrence read before is someone else's
   claim (``conflict``, nothing written);
2. read every gate input with one grouped query per input (:func:`admission.read_inputs`) — inside
   the transaction, after the lock, so max_runs is counted where no other claimant can add a run;
3. decide each schedule in due order with :func:`decide` (the gates in the seed's order, the global
   slot last) — it reads nothing: the row, the inputs and the free slots (a fire takes one);
4. write the decisions: every schedule transition (claim, advance, exhaust) with one ``apply_many``,
   every run (fired, skipped for overlap, deferral record) with one ``create_many``.

Launches happen after the commit, outside the transaction (the engine's job).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Command, NewEntity, Reason, apply_many

from . import admission as gates
from .occurrence import claim_command, exhaust_command
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
        if self.handle is not None:
            self.handle.release()
            self.handle = None


async def lock_due(tx: Book, due: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any] | None]:
    """The rows of ``due`` as they are under the row lock, in order; None for a row that is no longer
    active at the occurrence it had (claimed, paused or changed by someone else meanwhile).

    The lock reads only what says whether a row changed (its version); a row that changed but is
    still due at the same occurrence (an operator's update) is read again in full."""
    s = schedules
    assert tx.conn is not None
    query = (sa.select(s.c.id, s.c.status, s.c.version, s.c.next_fire_at)
             .where(s.c.id.in_([row["id"] for row in due])).order_by(s.c.id))
    query = tx.store.lock_rows(query, "wait")  # in id order: two evaluators lock overlapping sets without deadlock
    locked = {row.id: row for row in await tx.conn.execute(query)}
    out: list[Mapping[str, Any] | None] = []
    changed: list[str] = []
    for row in due:
        held = locked.get(row["id"])
        if held is None or held.status != "active" or held.next_fire_at != row["next_fire_at"]:
            out.append(None)
            continue
        out.append(row)
        if held.version != row["version"]:
            changed.append(row["id"])
    if changed:
        fresh = {r.id: dict(r._mapping) for r in await tx.conn.execute(sa.select(s).where(s.c.id.in_(changed)))}
        out = [fresh.get(row["id"], row) if row is not None else None for row in out]
    return out


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
    try:
        async with book.begin() as tx:
            epoch = await fence(tx) if fence is not None else None
            current = await lock_due(tx, due)
            inputs = await gates.read_inputs(tx, [s for s in current if s is not None], now)
            for stale, s in zip(due, current, strict=True):
                if s is None:
                    decisions.append(Decision(stale, "conflict"))
                    continue
                decisions.append(decide(s, inputs, now=now, zone=zone, slots=slots, deferrals=deferrals,
                                        record_every=record_every, daemon_id=daemon_id, epoch=epoch))
            await write(tx, decisions)
    except BaseException:
        for d in decisions:
            d.release()
        raise
    return decisions


def decide(s: Mapping[str, Any], inputs: gates.GateInputs, *, now: float, zone: str | None, slots: gates.Slots,
           deferrals: Mapping[str, int], record_every: int, daemon_id: str, epoch: int | None = None) -> Decision:
    """The gates in the seed's order for one due schedule (S5); takes a slot for a fire."""
    due = s["next_fire_at"]
    nxt = following(s, due, now, zone)
    context: dict[str, Any] = {"trigger": s["trigger_type"], "occurrence_at": due, "schedule": s["name"]}
    if epoch is not None:
        context["leader_epoch"] = epoch
    extra: dict[str, Any] = {}
    cfg = s.get("threshold_config")
    if cfg:
        value = inputs.metrics[s["id"]]
        if not gates.breached(cfg, value):
            return _advance(s, due, nxt, now, "schedule.active.threshold_ok", f"{cfg['metric']}={value:g} within bounds")
        if gates.in_cooldown(cfg, s.get("last_alert_at"), now):
            return _advance(s, due, nxt, now, "schedule.active.threshold_cooldown",
                            f"{cfg['metric']}={value:g} breached in cooldown")
        context.update(metric=cfg["metric"], value=value, threshold=cfg["value"])
        extra["last_alert_at"] = now
    if s["overlap_policy"] == "skip" and s["id"] in inputs.running:
        return Decision(s, "skipped_overlap", claim_command(
            s, due, nxt, now=now, fired=False, reason=Reason("schedule.active.skipped_overlap", "previous run still running"),
        ), new_run(s, now=now, status="skipped", context=context, daemon_id=daemon_id, occurrence_at=due, reason=Reason(
            "schedule_run.skipped.overlap", "a run of this schedule is still running")), context)
    if s["id"] in inputs.spent:
        over = gates.over_budget(s, *inputs.spent[s["id"]])
        if over:
            return Decision(s, "exhausted_budget", exhaust_command(s, "schedule.exhausted.budget", over))
    if s.get("max_runs") is not None and inputs.counted[s["id"]] >= s["max_runs"]:
        return Decision(s, "exhausted_max_runs",
                        exhaust_command(s, "schedule.exhausted.max_runs", f"{s['max_runs']} run(s) used"))
    handle = slots.try_take()
    if handle is None:
        count = deferrals.get(s["id"], 0) + 1
        record = None
        if gates.deferral_recorded(count, record_every):
            record = new_run(s, now=now, status="skipped", context={**context, "deferrals": count}, daemon_id=daemon_id,
                             occurrence_at=due, reason=Reason(
                                 "schedule_run.skipped.deferred_capacity",
                                 f"all {slots.limit} slots busy; deferral {count}, the fire stays due"))
        return Decision(s, "deferred", None, record, context, deferrals=count)
    command = claim_command(s, due, nxt, now=now, extra=extra, reason=Reason(
        "schedule.active.fire_claimed", f"occurrence {due} claimed by {daemon_id}"))
    run = new_run(s, now=now, context=context, daemon_id=daemon_id, occurrence_at=due,
                  reason=Reason("schedule_run.running.fired", f"{context.get('trigger')} fire"))
    return Decision(s, "fired", command, run, context, handle)


def _advance(s: Mapping[str, Any], due: float, nxt: float | None, now: float, code: str, summary: str) -> Decision:
    return Decision(s, code.rsplit(".", 1)[1], claim_command(s, due, nxt, now=now, fired=False, reason=Reason(code, summary)))


async def write(tx: Book, decisions: Sequence[Decision]) -> None:
    """Every schedule transition with one ``apply_many``, then every run with one ``create_many``.

    A transition that finds its row changed (impossible while the rows are locked, kept for safety)
    writes nothing and its run is not opened: the decision becomes ``conflict`` and gives its slot back.
    """
    planned = [d for d in decisions if d.command is not None]
    outcomes = await apply_many(tx, [d.command for d in planned]) if planned else []
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
