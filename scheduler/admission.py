"""Fire gates in S5's order: threshold+cooldown → overlap → budget → max_runs → global slot.

:func:`admit` is the one place the gates are applied: given a set of schedules (in due order), the
inputs the gates read for them (:func:`read_inputs`: one grouped query per kind of input) and the
free slots, it gives each schedule a :class:`Verdict`. The tick decides a set
(``evaluation.py``); a manual fire, a missed fire's recovery run and a github event decide a set of
one (``firing.py``), with the gates their path applies (:class:`Gates`). The gates only read; the
callers write what a verdict means on their path (a skipped run, an advanced cadence, an exhausted
schedule, a deferral record, a refusal).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book
from statebook.outbox import dispatch_outbox
from statebook.outbox.dispatch.admin import settled_only

from .schema import schedule_runs

r = schedule_runs


@dataclass
class Slots:
    """The daemon-wide concurrency limit for top-level fires; handles release idempotently."""

    limit: int
    used: int = 0

    def try_take(self) -> SlotHandle | None:
        """A handle on a free slot, or None when all are in use."""
        if self.used >= self.limit:
            return None
        self.used += 1
        return SlotHandle(self)

    @property
    def free(self) -> int:
        """The number of slots not in use."""
        return self.limit - self.used


class SlotHandle:
    """One taken slot; :meth:`release` gives it back (once)."""

    def __init__(self, slots: Slots) -> None:
        self._slots: Slots | None = slots

    def release(self) -> None:
        """Give the slot back; a second call does nothing."""
        if self._slots is not None:
            self._slots.used -= 1
            self._slots = None


# -- threshold -------------------------------------------------------------------------------------

def _p95(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def breached(cfg: Mapping[str, Any], value: float) -> bool:
    """True when ``value`` passes the gate's threshold (``op`` ``gt``, or ``gte``)."""
    limit = float(cfg["value"])
    return value >= limit if cfg.get("op", "gt") == "gte" else value > limit


def in_cooldown(cfg: Mapping[str, Any], last_alert_at: float | None, now: float) -> bool:
    """True while ``now`` is within the gate's cooldown window after the last alert."""
    return last_alert_at is not None and now - last_alert_at < float(cfg["window_minutes"]) * 60


# -- overlap, budget, max_runs ---------------------------------------------------------------------

def over_budget(schedule: Mapping[str, Any], cost: float, tokens: int) -> str | None:
    """Why the schedule has spent its budget (dollars or tokens), or None while it has not."""
    if schedule.get("budget_usd") is not None and cost >= schedule["budget_usd"]:
        return f"spent ${cost:.4f} of a ${schedule['budget_usd']:.4f} budget"
    if schedule.get("budget_tokens") is not None and tokens >= schedule["budget_tokens"]:
        return f"spent {tokens} of a {schedule['budget_tokens']}-token budget"
    return None


def deferral_recorded(count: int, every: int) -> bool:
    """Record the first deferral and every ``every``-th one after it (1, 11, 21, ... for 10)."""
    return (count - 1) % every == 0


# -- which gates, and every gate input of a set of schedules, grouped ------------------------------

@dataclass(frozen=True)
class Gates:
    """The gates a path applies (the order is always S5's); budget, max_runs and the slot always apply."""

    threshold: bool = True
    overlap: bool = True


DUE = Gates()
"""a due occurrence: the tick's timed schedules and a github event (a github_poll schedule has no threshold, S2)"""
ON_DEMAND = Gates(threshold=False, overlap=False)
"""a manual fire and a missed fire's recovery run (S5, S6): budget, max_runs and a global slot"""


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


async def read_inputs(book: Book, due: Sequence[Mapping[str, Any]], now: float, *,
                      gates: Gates | None = None) -> GateInputs:
    """What ``gates`` (all of them by default) read for every schedule in ``due`` that has the gate,
    one query per input (per metric and window for thresholds). Give a bound book, after the row
    lock, to read inside the claim transaction (S5: max_runs is counted where no other claimant can
    add a run)."""
    gates = gates or DUE
    out = GateInputs()
    overlap = [s["id"] for s in due if gates.overlap and s["overlap_policy"] == "skip"]
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
    thresholds = [s for s in due if gates.threshold and s.get("threshold_config")]
    if thresholds:
        out.metrics = await _metric_values(book, thresholds, now)
    return out


async def _metric_values(book: Book, due: Sequence[Mapping[str, Any]], now: float) -> dict[str, float]:
    """Each schedule's threshold metric over its last ``window_minutes``, from statebook's own tables,
    without the schedule's own runs: per (metric, window), one query grouped by schedule."""
    groups: dict[tuple[str, float], list[str]] = {}
    for s in due:
        cfg = s["threshold_config"]
        groups.setdefault((cfg["metric"], float(cfg["window_minutes"])), []).append(s["id"])
    values: dict[str, float] = {}
    async with book.read() as conn:
        for (metric, window), ids in groups.items():
            since = now - window * 60
            own = [r.c.ended_at >= since, r.c.ended_at <= now]
            q: sa.Select[str, Any]  # (schedule id, value) per run or per schedule
            if metric == "dead_letters":
                d = dispatch_outbox
                dead = sa.select(sa.func.count()).where(d.c.status == "dead_letter", d.c.updated_at >= since,
                                                        *settled_only(book, ["dead_letter"]))
                total = float((await conn.execute(dead)).scalar() or 0)
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


# -- the gates ---------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """What the gates decided for one schedule: the first gate that refused, or ``fire``."""

    gate: str
    """``threshold_ok``, ``threshold_cooldown``, ``overlap``, ``budget``, ``max_runs``, ``capacity`` or ``fire``"""
    summary: str = ""
    handle: SlotHandle | None = None
    """the global slot a fire holds (the caller launches it, or releases it)"""
    alert: dict[str, Any] | None = None
    """a threshold breach (metric, value, threshold) that later gates saw; a fire stamps ``last_alert_at``"""


def admit(due: Sequence[Mapping[str, Any]], inputs: GateInputs, slots: Slots, *, now: float,
          gates: Gates | None = None) -> list[Verdict]:
    """S5 for each schedule of ``due``, in order (so the free slots go to the earliest); reads nothing."""
    return [_admit(s, inputs, slots, now, gates or DUE) for s in due]


def _admit(s: Mapping[str, Any], inputs: GateInputs, slots: Slots, now: float, gates: Gates) -> Verdict:
    alert = None
    cfg = s.get("threshold_config")
    if gates.threshold and cfg:
        value = inputs.metrics[s["id"]]
        if not breached(cfg, value):
            return Verdict("threshold_ok", f"{cfg['metric']}={value:g} within bounds")
        if in_cooldown(cfg, s.get("last_alert_at"), now):
            return Verdict("threshold_cooldown", f"{cfg['metric']}={value:g} breached in cooldown")
        alert = {"metric": cfg["metric"], "value": value, "threshold": cfg["value"]}
    if gates.overlap and s["overlap_policy"] == "skip" and s["id"] in inputs.running:
        return Verdict("overlap", "a run of this schedule is still running", alert=alert)
    over = over_budget(s, *inputs.spent[s["id"]]) if s["id"] in inputs.spent else None
    if over:
        return Verdict("budget", over, alert=alert)
    if s.get("max_runs") is not None and inputs.counted[s["id"]] >= s["max_runs"]:
        return Verdict("max_runs", f"{s['max_runs']} run(s) used", alert=alert)
    handle = slots.try_take()
    if handle is None:
        return Verdict("capacity", f"all {slots.limit} slots busy", alert=alert)
    return Verdict("fire", handle=handle, alert=alert)
