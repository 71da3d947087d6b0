"""Run rows: opened ``running`` (or written terminal: skipped / failed-before-launch) and finalized.

When the schedule asks to be notified, the terminal transition and the dispatch enqueue share ONE
transaction and the dispatch's dedup key is the terminal fact's id (S9): a notification exists if
and only if the run ended, and never twice for one ending. ``open_runs`` and ``finalize_runs`` are
the set-based forms (one ``create_many`` / ``apply_many``), with the same rule per run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import (
    Actor, Book, Command, EntityNotFound, NewEntity, Outcome, Reason, apply_many, create, create_many, transition,
)
from statebook.outbox import enqueue_dispatch

from .schema import schedule_runs
from .errors import ScheduleError
from .models import ScheduleRun
from .store import RUN_TERMINAL, SCHEDULER, actor_arg, get_run, ref_arg, run_row, schedule_row

NOTIFIED = ("completed", "failed", "timed_out", "cancelled")
ERROR_DETAIL_LIMIT = 4000


def _bounded(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= ERROR_DETAIL_LIMIT else text[-ERROR_DETAIL_LIMIT:]


def run_values(schedule: Mapping[str, Any], *, context: Mapping[str, Any], now: float, daemon_id: str | None,
               action_kind: str | None = None, action_args: Any = None, chain_parent_id: str | None = None,
               chain_depth: int = 0, occurrence_at: float | None = None) -> dict[str, Any]:
    """The data columns of a new run of ``schedule`` started at ``now`` with trigger ``context``."""
    return {
        "schedule_id": schedule["id"],
        "trigger_context": dict(context),
        "action_kind": action_kind or schedule["action_kind"],
        "action_args": action_args if action_args is not None else [],
        "chain_parent_id": chain_parent_id,
        "chain_depth": chain_depth,
        "fired_at": now,
        "created_at": now,
        "occurrence_at": occurrence_at,
        "daemon_id": daemon_id,
    }


def new_run(schedule: Mapping[str, Any], *, now: float, reason: Reason, status: str = "running",
            actor: Actor = SCHEDULER, ended: Mapping[str, Any] | None = None, **values: Any) -> NewEntity:
    """The run row :func:`open_run` inserts, for :func:`open_runs`."""
    row = run_values(schedule, now=now, **values)
    if status in RUN_TERMINAL:
        row["ended_at"] = now
        row.update(ended or {})
    return NewEntity(row, status, reason, actor)


async def open_run(book: Book, schedule: Mapping[str, Any], *, reason: Reason, status: str = "running",
                   actor: Actor = SCHEDULER, ended: Mapping[str, Any] | None = None, **values: Any) -> str:
    """Insert a run row; a terminal initial status (skipped / failed) also stamps ``ended_at``.

    A run created ``failed`` (refused before launch) notifies like any other ending.
    """
    run = new_run(schedule, now=book.clock.now(), reason=reason, status=status, actor=actor, ended=ended, **values)
    async with book.begin() as tx:
        out = await create(tx, "schedule_run", values=run.values, status=status, reason=reason, actor=actor)
        if status in NOTIFIED:
            await _notify(tx, schedule, out.entity_id, status, out.fact_id or "", reason, run.values)
    return out.entity_id


async def open_runs(book: Book, runs: Sequence[tuple[Mapping[str, Any], NewEntity]]) -> list[str]:
    """Insert many runs (each with its schedule, from :func:`new_run`) in one transaction; ids in order."""
    if not runs:
        return []
    async with book.begin() as tx:
        outs = await create_many(tx, "schedule_run", [run for _, run in runs])
        for (schedule, run), out in zip(runs, outs, strict=True):
            if run.status in NOTIFIED:
                await _notify(tx, schedule, out.entity_id, run.status, out.fact_id or "", run.reason, run.values)
    return [out.entity_id for out in outs]


async def _notify(tx: Book, schedule: Mapping[str, Any], run_id: str, status: str, fact_id: str,
                  reason: Reason, run: Mapping[str, Any]) -> str | None:
    notify = schedule.get("notify")
    if not notify or status not in (notify.get("on") or NOTIFIED):
        return None

    body = {
        "event": "schedule_run.ended",
        "schedule_id": schedule["id"],
        "schedule": schedule.get("name"),
        "run_id": run_id,
        "status": status,
        "reason": reason.code,
        "summary": reason.summary,
        "exit_code": run.get("exit_code"),
        "fired_at": run.get("fired_at"),
        "ended_at": run.get("ended_at"),
        "chain_depth": run.get("chain_depth", 0),
    }
    return await enqueue_dispatch(
        tx, kind=notify["kind"], deliver_to=notify["deliver_to"], body=body,
        dedup_key=f"schedule_run:{run_id}:{fact_id}", schedule_run_id=run_id,
    )


async def finalize_run(book: Book, run_id: str, target: str, *, reason: Reason, patch: Mapping[str, Any] | None = None,
                       schedule: Mapping[str, Any] | None = None, actor: Actor = SCHEDULER,
                       expected: str | tuple[str, ...] = "running") -> Outcome:
    """Terminal transition (guarded on ``expected``) and, when asked for, its notification — one transaction.

    A lost race (someone else ended the run first) is a ``conflict`` outcome and writes nothing.
    """
    now = book.clock.now()
    full = {"ended_at": now, **(patch or {})}
    if "error_detail" in full:
        full["error_detail"] = _bounded(full["error_detail"])
    async with book.begin() as tx:
        out = await transition(tx, "schedule_run", run_id, target, expected=expected, reason=reason, actor=actor,
                               patch=full, on_conflict="return")
        if out.applied:
            run = await run_row(tx, run_id)
            sched = schedule if schedule is not None else await _schedule_of(tx, run)
            if sched is not None:
                await _notify(tx, sched, run_id, target, out.fact_id or "", reason, run)
    return out


@dataclass(frozen=True)
class Ending:
    """One terminal transition for :func:`finalize_runs` (the arguments of :func:`finalize_run`)."""

    run_id: str
    target: str
    reason: Reason
    patch: Mapping[str, Any] = field(default_factory=dict)
    schedule: Mapping[str, Any] | None = None
    actor: Actor = SCHEDULER
    expected: tuple[str, ...] = ("running",)


async def finalize_runs(book: Book, endings: Sequence[Ending]) -> list[Outcome]:
    """:func:`finalize_run` for several distinct runs in ONE transaction (one ``apply_many``), each
    applied ending with its notification; outcomes in order. Any failure rolls back every ending."""
    if not endings:
        return []
    now = book.clock.now()
    commands = []
    for e in endings:
        full = {"ended_at": now, **e.patch}
        if "error_detail" in full:
            full["error_detail"] = _bounded(full["error_detail"])
        commands.append(Command("schedule_run", e.run_id, e.target, e.reason, e.actor, e.expected, {}, full))
    async with book.begin() as tx:
        outs = await apply_many(tx, commands)
        # Only endings that may notify need the run row (the body) and perhaps the schedule.
        maybe = [(e, out) for e, out in zip(endings, outs, strict=True)
                 if out.applied and (e.schedule is None or e.schedule.get("notify"))]
        if maybe:
            async with tx.read() as conn:
                q = sa.select(schedule_runs).where(schedule_runs.c.id.in_([e.run_id for e, _ in maybe]))
                rows = {r.id: dict(r._mapping) for r in await conn.execute(q)}
            for e, out in maybe:
                run = rows[e.run_id]
                sched = e.schedule if e.schedule is not None else await _schedule_of(tx, run)
                if sched is not None:
                    await _notify(tx, sched, e.run_id, e.target, out.fact_id or "", e.reason, run)
    return outs


async def _schedule_of(book: Book, run: Mapping[str, Any]) -> dict[str, Any] | None:
    if not run.get("schedule_id"):
        return None
    try:
        return await schedule_row(book, run["schedule_id"])
    except EntityNotFound:
        return None


async def cancel_run(book: Book, run_id: str, *, actor: Actor = Actor("operator", "cli")) -> ScheduleRun:
    """Mark a run ``cancelled`` (notifying like any ending); the daemon owning its process kills its group."""
    ref_arg("run_id", run_id)
    actor_arg(actor)
    run = await get_run(book, run_id)
    if run.status in RUN_TERMINAL:
        raise ScheduleError(f"run {run_id} already ended ({run.status}); nothing to cancel")
    out = await finalize_run(
        book, run_id, "cancelled", expected=("running", "queued", "retry_wait", "waiting_dependency"), actor=actor,
        reason=Reason("schedule_run.cancelled.operator", f"cancelled by {actor}"),
    )
    if out.conflict:
        raise ScheduleError(f"run {run_id} changed concurrently (now {out.status}); nothing cancelled")
    return await get_run(book, run_id)
