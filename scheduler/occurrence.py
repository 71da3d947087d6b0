"""Claiming an occurrence: a compare-and-set on the schedule's ``next_fire_at`` (S1).

Whoever moves ``next_fire_at`` from ``due`` to the following time owns the occurrence ``due``; any
other claimant of the same occurrence gets ``conflict`` and writes nothing — across daemons too.
A one-shot (no following time) is claimed by moving the schedule to ``exhausted``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statebook.lifecycle import Actor, Book, Outcome, Reason, transition

from .writes import writing

SCHEDULER = Actor("system", "scheduler")


async def claim(book: Book, schedule: Mapping[str, Any], due: float, following: float | None, *,
                reason: Reason, fired: bool = True, extra: Mapping[str, Any] | None = None) -> Outcome:
    """Advance ``next_fire_at`` from ``due`` to ``following`` iff it still equals ``due``."""
    now = book.clock.now()
    patch: dict[str, Any] = {"next_fire_at": following, **(extra or {})}
    if fired:
        patch["last_fired_at"] = now
    target = "active"
    if following is None:
        target = "exhausted"
        patch["enabled"] = 0
        reason = Reason("schedule.exhausted.one_shot", f"one-shot occurrence at {due} handled ({reason.summary})",
                        reason.evidence)
    async with writing(book) as tx:
        return await transition(tx, "schedule", schedule["id"], target, expected="active",
                                guards={"next_fire_at": due}, patch=patch, reason=reason, actor=SCHEDULER)


async def exhaust(book: Book, schedule: Mapping[str, Any], code: str, summary: str) -> Outcome:
    """active → exhausted (budget or max_runs), guarded on the cadence the gate looked at."""
    async with writing(book) as tx:
        return await transition(tx, "schedule", schedule["id"], "exhausted", expected="active",
                                guards={"next_fire_at": schedule["next_fire_at"]}, patch={"enabled": 0},
                                reason=Reason(code, summary), actor=SCHEDULER)
