"""Claiming an occurrence: a compare-and-set on the schedule's ``next_fire_at`` (S1).

Whoever moves ``next_fire_at`` from ``due`` to the following time owns the occurrence ``due``; any
other claimant of the same occurrence gets ``conflict`` and writes nothing — across daemons too.
A one-shot (no following time) is claimed by moving the schedule to ``exhausted``.

``claim_command`` and ``exhaust_command`` build the transitions; ``claim`` and ``exhaust`` apply one.
A tick's evaluation applies many of them together (``lifecycle.apply_many``), with the same guards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statebook.lifecycle import Actor, Book, Command, Outcome, Reason, apply


SCHEDULER = Actor("system", "scheduler")


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
        return await apply(tx, command)


async def exhaust(book: Book, schedule: Mapping[str, Any], code: str, summary: str) -> Outcome:
    """Apply :func:`exhaust_command` in its own transaction (or ``book``'s)."""
    async with book.begin() as tx:
        return await apply(tx, exhaust_command(schedule, code, summary))
