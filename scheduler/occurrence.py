"""Claiming an occurrence: a compare-and-set on the schedule's ``next_fire_at`` (S1).

Whoever moves ``next_fire_at`` from ``due`` to the following time owns the occurrence ``due``; any
other claimant of the same occurrence gets ``conflict`` and writes nothing — across daemons too.
A one-shot (no following time) is claimed by moving the schedule to ``exhausted``.

``claim_command`` and ``exhaust_command`` build the transitions; ``claim`` and ``exhaust`` apply one.
A tick's evaluation applies many of them together (``lifecycle.apply_many``), with the same guards.
:func:`lock` takes the row locks of a set of schedules (of one, for the single-schedule paths) and
tells which are still as their claimant read them, before the gates are read and decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Command, Outcome, Reason
from statebook.lifecycle.engine import apply
from statebook.lifecycle.queries import lock_rows

from .schema import schedules
from .store import SCHEDULER


def claim_command(schedule: Mapping[str, Any], due: float, following: float | None, *, now: float,
                  reason: Reason, fired: bool = True, extra: Mapping[str, Any] | None = None) -> Command:
    """Advance ``next_fire_at`` from ``due`` to ``following`` iff it still equals ``due``."""
    patch: dict[str, Any] = {"next_fire_at": following, **(extra or {})}
    if fired:
        patch["last_fired_at"] = now
    target = "active"
    if following is None:
        target = "exhausted"
        patch["enabled"] = 0
        reason = Reason("schedule.exhausted.one_shot", f"one-shot occurrence at {due} handled ({reason.summary})",
                        reason.evidence)
    return Command("schedule", schedule["id"], target, reason, SCHEDULER, ("active",), {"next_fire_at": due}, patch)


def exhaust_command(schedule: Mapping[str, Any], code: str, summary: str) -> Command:
    """active → exhausted (budget or max_runs), guarded on the cadence the gate looked at."""
    return Command("schedule", schedule["id"], "exhausted", Reason(code, summary), SCHEDULER, ("active",),
                   {"next_fire_at": schedule["next_fire_at"]}, {"enabled": 0})


async def claim(book: Book, schedule: Mapping[str, Any], due: float, following: float | None, *,
                reason: Reason, fired: bool = True, extra: Mapping[str, Any] | None = None) -> Outcome:
    """Apply :func:`claim_command` in its own transaction (or ``book``'s)."""
    command = claim_command(schedule, due, following, now=book.clock.now(), reason=reason, fired=fired, extra=extra)
    async with book.begin() as tx:
        return await apply(tx, command, on_conflict="return")


async def exhaust(book: Book, schedule: Mapping[str, Any], code: str, summary: str) -> Outcome:
    """Apply :func:`exhaust_command` in its own transaction (or ``book``'s)."""
    async with book.begin() as tx:
        return await apply(tx, exhaust_command(schedule, code, summary), on_conflict="return")


async def lock(tx: Book, rows: Sequence[Mapping[str, Any]], *, statuses: tuple[str, ...] = ("active",),
               guards: tuple[str, ...] = ("next_fire_at",)) -> list[Mapping[str, Any] | None]:
    """The schedules ``rows`` as they are under their row lock, in order; None for a row no longer in
    ``statuses`` or whose ``guards`` columns changed (claimed, paused or exhausted by someone else
    since it was read: a ``conflict``, S1).

    The lock reads only what says whether a row changed (its version); a row that changed but still
    passes (an operator's update) is read again in full, so the gates judge its new values (S5)."""
    s = schedules
    assert tx.conn is not None
    query = (sa.select(s.c.id, s.c.status, s.c.version, *(s.c[g] for g in guards))
             .where(s.c.id.in_([row["id"] for row in rows])).order_by(s.c.id))
    query = lock_rows(query, "wait")  # in id order: two claimants lock overlapping sets without deadlock
    locked = {row.id: row._mapping for row in await tx.conn.execute(query)}
    out: list[Mapping[str, Any] | None] = []
    changed: list[str] = []
    for row in rows:
        held = locked.get(row["id"])
        if held is None or held["status"] not in statuses or any(held[g] != row[g] for g in guards):
            out.append(None)
            continue
        out.append(row)
        if held["version"] != row["version"]:
            changed.append(row["id"])
    if changed:
        fresh = {r.id: dict(r._mapping) for r in await tx.conn.execute(sa.select(s).where(s.c.id.in_(changed)))}
        out = [fresh.get(row["id"], row) if row is not None else None for row in out]
    return out
