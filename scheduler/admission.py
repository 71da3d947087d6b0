"""Fire gates in the seed's order: threshold+cooldown → overlap → budget → max_runs → global slot.

The gates read; the engine writes what they decide (a skipped run, an advanced cadence, an
exhausted schedule, a deferral record). Each gate is a plain function so tests can call it.
:func:`read_inputs` reads what the gates need for a whole set of due schedules at once, with one
grouped query per kind of input (the tick's evaluation); the one-schedule reads below serve manual
fires, missed fires and github_poll events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book

from .schema import schedule_runs

r = schedule_runs


@dataclass
class Slots:
    """The daemon-wide concurrency limit for top-level fires; handles release idempotently."""

    limit: int
    used: int = 0

    def try_take(self) -> SlotHandle | None:
        if self.used >= self.limit:
            return None
        self.used += 1
        return SlotHandle(self)

    @property
    def free(self) -> int:
        return self.limit - self.used


class SlotHandle:
    def __init__(self, slots: Slots) -> None:
        self._slots: Slots | None = slots

    def release(self) -> None:
        if self._slots is not None:
            self._slots.used -= 1
            self._slots = None


# -- threshold -------------------------------------------------------------------------------------

def _p95(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


async def metric_value(book: Book, cfg: Mapping[str, Any], now: float, *, exclude_schedule: str | None) -> float:
    """The threshold metric over the last ``window_minutes`` from statebook's own tables."""
    since = now - float(cfg["window_minutes"]) * 60
    metric = cfg["metric"]
    own = [r.c.ended_at >= since, r.c.ended_at <= now]
    if exclude_schedule is not None:
        own.append(sa.or_(r.c.schedule_id.is_(None), r.c.schedule_id != exclude_schedule))
    async with book.read() as conn:
        if metric == "failed_runs":
            q = sa.select(sa.func.count()).where(r.c.status.in_(("failed", "timed_out")), *own)
            return float((await conn.execute(q)).scalar() or 0)
        if metric == "total_cost":
            q = sa.select(sa.func.coalesce(sa.func.sum(r.c.cost_usd), 0.0)).where(*own)
            return float((await conn.execute(q)).scalar() or 0)
        if metric == "p95_duration":
            q = (sa.select(r.c.ended_at - r.c.fired_at).where(r.c.status.in_(("completed", "failed", "timed_out")), *own)
                 .limit(100_000))
            return _p95(float(v) for (v,) in await conn.execute(q))
        if metric == "dead_letters":
            from statebook.outbox import dispatch_outbox as d

            q = sa.select(sa.func.count()).where(d.c.status == "dead_letter", d.c.updated_at >= since)
            return float((await conn.execute(q)).scalar() or 0)
    raise ValueError(f"unknown threshold metric {metric!r}")


def breached(cfg: Mapping[str, Any], value: float) -> bool:
    limit = float(cfg["value"])
    return value >= limit if cfg.get("op", "gt") == "gte" else value > limit


def in_cooldown(cfg: Mapping[str, Any], last_alert_at: float | None, now: float) -> bool:
    return last_alert_at is not None and now - last_alert_at < float(cfg["window_minutes"]) * 60


# -- overlap, budget, max_runs ---------------------------------------------------------------------

async def has_running(book: Book, schedule_id: str) -> bool:
    q = sa.select(r.c.id).where(r.c.schedule_id == schedule_id, r.c.status == "running").limit(1)
    async with book.read() as conn:
        return (await conn.execute(q)).first() is not None


async def spent(book: Book, schedule_id: str) -> tuple[float, int]:
    """Cumulative reported cost and tokens of every run of the schedule (follow-ups included)."""
    q = sa.select(sa.func.coalesce(sa.func.sum(r.c.cost_usd), 0.0), sa.func.coalesce(sa.func.sum(r.c.tokens), 0)).where(
        r.c.schedule_id == schedule_id
    )
    async with book.read() as conn:
        cost, tokens = (await conn.execute(q)).one()
    return float(cost or 0), int(tokens or 0)


def over_budget(schedule: Mapping[str, Any], cost: float, tokens: int) -> str | None:
    if schedule.get("budget_usd") is not None and cost >= schedule["budget_usd"]:
        return f"spent ${cost:.4f} of a ${schedule['budget_usd']:.4f} budget"
    if schedule.get("budget_tokens") is not None and tokens >= schedule["budget_tokens"]:
        return f"spent {tokens} of a {schedule['budget_tokens']}-token budget"
    return None


async def top_level_runs(book: Book, schedule_id: str) -> int:
    """Runs that count against max_runs: top-level (not follow-ups) and not skipped."""
    q = sa.select(sa.func.count()).where(
        r.c.schedule_id == schedule_id, r.c.chain_depth == 0, r.c.status != "skipped"
    )
    async with book.read() as conn:
        return int((await conn.execute(q)).scalar() or 0)


def deferral_recorded(count: int, every: int) -> bool:
    """Record the first deferral and every ``every``-th one after it (1, 11, 21, ... for 10)."""
    return (count - 1) % every == 0


# -- every gate input of a set of due schedules, grouped -------------------------------------------

@dataclass
class GateInputs:
    """What the gates read for a set of due schedules (keys are schedule ids)."""

    metrics: dict[str, float] = field(default_factory=dict)
    """threshold metric value (the schedule's own runs excluded), for schedules with a threshold"""
    running: set[str] = field(default_factory=set)
    """schedules with overlap ``skip`` that have a run ``running``"""
    spent: dict[str, tuple[float, int]] = field(default_factory=dict)
    """reported (cost, tokens) of every run, for schedules with a budget"""
    counted: dict[str, int] = field(default_factory=dict)
    """top-level non-skipped runs, for schedules with max_runs"""


async def read_inputs(book: Book, due: Sequence[Mapping[str, Any]], now: float) -> GateInputs:
    """The same values as :func:`metric_value`, :func:`has_running`, :func:`spent` and
    :func:`top_level_runs` for every schedule in ``due`` that has the gate, one query per input
    (per metric and window for thresholds). Give a bound book to read inside the claim transaction."""
    out = GateInputs()
    overlap = [s["id"] for s in due if s["overlap_policy"] == "skip"]
    budget = [s["id"] for s in due if s.get("budget_usd") is not None or s.get("budget_tokens") is not None]
    limited = [s["id"] for s in due if s.get("max_runs") is not None]
    async with book.read() as conn:
        if overlap:
            q = sa.select(r.c.schedule_id).distinct().where(r.c.schedule_id.in_(overlap), r.c.status == "running")
            out.running = {sid for (sid,) in await conn.execute(q)}
        if budget:
            q = (sa.select(r.c.schedule_id, sa.func.coalesce(sa.func.sum(r.c.cost_usd), 0.0),
                           sa.func.coalesce(sa.func.sum(r.c.tokens), 0))
                 .where(r.c.schedule_id.in_(budget)).group_by(r.c.schedule_id))
            found = {sid: (float(cost or 0), int(tokens or 0)) for sid, cost, tokens in await conn.execute(q)}
            out.spent = {sid: found.get(sid, (0.0, 0)) for sid in budget}
        if limited:
            q = (sa.select(r.c.schedule_id, sa.func.count())
                 .where(r.c.schedule_id.in_(limited), r.c.chain_depth == 0, r.c.status != "skipped")
                 .group_by(r.c.schedule_id))
            found_counts = {sid: int(n) for sid, n in await conn.execute(q)}
            out.counted = {sid: found_counts.get(sid, 0) for sid in limited}
    out.metrics = await _metric_values(book, [s for s in due if s.get("threshold_config")], now)
    return out


async def _metric_values(book: Book, due: Sequence[Mapping[str, Any]], now: float) -> dict[str, float]:
    """:func:`metric_value` of each schedule's threshold: per (metric, window), one query grouped by
    schedule, then each schedule's value without its own runs."""
    groups: dict[tuple[str, float], list[str]] = {}
    for s in due:
        cfg = s["threshold_config"]
        groups.setdefault((cfg["metric"], float(cfg["window_minutes"])), []).append(s["id"])
    values: dict[str, float] = {}
    async with book.read() as conn:
        for (metric, window), ids in groups.items():
            since = now - window * 60
            own = [r.c.ended_at >= since, r.c.ended_at <= now]
            if metric == "dead_letters":
                from statebook.outbox import dispatch_outbox as d

                q = sa.select(sa.func.count()).where(d.c.status == "dead_letter", d.c.updated_at >= since)
                total = float((await conn.execute(q)).scalar() or 0)
                values.update(dict.fromkeys(ids, total))
                continue
            if metric == "p95_duration":
                q = (sa.select(r.c.schedule_id, r.c.ended_at - r.c.fired_at)
                     .where(r.c.status.in_(("completed", "failed", "timed_out")), *own).limit(100_000))
                rows = [(sid, float(v)) for sid, v in await conn.execute(q)]
                values.update({sid: _p95(v for owner, v in rows if owner != sid) for sid in ids})
                continue
            if metric == "failed_runs":
                q = sa.select(r.c.schedule_id, sa.func.count()).where(r.c.status.in_(("failed", "timed_out")), *own)
            elif metric == "total_cost":
                q = sa.select(r.c.schedule_id, sa.func.coalesce(sa.func.sum(r.c.cost_usd), 0.0)).where(*own)
            else:
                raise ValueError(f"unknown threshold metric {metric!r}")
            per_schedule = [(owner, float(v or 0)) for owner, v in await conn.execute(q.group_by(r.c.schedule_id))]
            values.update({sid: float(sum(v for owner, v in per_schedule if owner != sid)) for sid in ids})
    return values
