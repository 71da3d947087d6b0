"""Fire gates in the seed's order: threshold+cooldown → overlap → budget → max_runs → global slot.

The gates read; the engine writes what they decide (a skipped run, an advanced cadence, an
exhausted schedule, a deferral record). Each gate is a plain function so tests can call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book

from .schema import schedule_runs
from .writes import reading

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

async def metric_value(book: Book, cfg: Mapping[str, Any], now: float, *, exclude_schedule: str | None) -> float:
    """The threshold metric over the last ``window_minutes`` from statebook's own tables."""
    since = now - float(cfg["window_minutes"]) * 60
    metric = cfg["metric"]
    own = [r.c.ended_at >= since, r.c.ended_at <= now]
    if exclude_schedule is not None:
        own.append(sa.or_(r.c.schedule_id.is_(None), r.c.schedule_id != exclude_schedule))
    async with reading(book) as conn:
        if metric == "failed_runs":
            q = sa.select(sa.func.count()).where(r.c.status.in_(("failed", "timed_out")), *own)
            return float((await conn.execute(q)).scalar() or 0)
        if metric == "total_cost":
            q = sa.select(sa.func.coalesce(sa.func.sum(r.c.cost_usd), 0.0)).where(*own)
            return float((await conn.execute(q)).scalar() or 0)
        if metric == "p95_duration":
            q = (sa.select(r.c.ended_at - r.c.fired_at).where(r.c.status.in_(("completed", "failed", "timed_out")), *own)
                 .limit(100_000))
            values = sorted(float(v) for (v,) in await conn.execute(q))
            if not values:
                return 0.0
            return values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))]
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
    async with reading(book) as conn:
        return (await conn.execute(q)).first() is not None


async def spent(book: Book, schedule_id: str) -> tuple[float, int]:
    """Cumulative reported cost and tokens of every run of the schedule (follow-ups included)."""
    q = sa.select(sa.func.coalesce(sa.func.sum(r.c.cost_usd), 0.0), sa.func.coalesce(sa.func.sum(r.c.tokens), 0)).where(
        r.c.schedule_id == schedule_id
    )
    async with reading(book) as conn:
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
    async with reading(book) as conn:
        return int((await conn.execute(q)).scalar() or 0)


def deferral_recorded(count: int, every: int) -> bool:
    """Record the first deferral and every ``every``-th one after it (1, 11, 21, ... for 10)."""
    return (count - 1) % every == 0
