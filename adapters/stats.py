"""``collect_stats``: the operating figures of a database, one query per part.

What ``statebook stats`` prints and ``/metrics`` exposes (docs/how-to/metrics.md, specs/operations.md):

- **entities** — rows by lifecycle and status (one ``UNION ALL`` over the registry's tables);
- **transitions** — facts by lifecycle and reason code (one ``GROUP BY`` over the fact log). Facts are
  never deleted (a purge appends a tombstone), so these are monotonic totals: deliveries and their
  outcomes, channel observations, rate-limit waits, scheduler fires, deferrals and skips are views of them;
- **due** — the due backlog and the oldest due time of dispatches and notifications, read with the due
  scans' own predicates (the active statuses as literals, ``next_attempt_at <= now``), which the
  partial due indexes serve;
- **latency** — channel attempts that were admitted and ended, per channel: count, sum and cumulative
  histogram buckets of ``ended_at - started_at``.

Verify findings are not recorded in the database (``verify`` reports and keeps nothing), so they are not
here; ``statebook verify`` is the way to them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Clock, Lifecycle
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.schema import status_in
from statebook.outbox import dispatch_outbox
from statebook.outbox.dispatch.policy import DUE_STATUSES

__all__ = ["DELIVERY_OUTCOMES", "LATENCY_BUCKETS", "REFRESH_SECONDS", "VERIFY_SECONDS", "Due", "Latency", "Stats",
           "collect_stats"]

REFRESH_SECONDS = 5.0
"""How often the daemon reads a fresh snapshot for ``/metrics`` (one query per part); here, not in
:mod:`.metrics`, so the daemon knows it without the metrics extra."""

VERIFY_SECONDS = 3600.0
"""How often a daemon serving metrics runs ``verify`` (and once at start); its findings are a gauge."""

LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the attempt latency histogram; ``+Inf`` is the count."""

NOTIFICATION_DUE_STATUSES = ("pending", "rate_limited")
"""The statuses the notification due scan reads (``outbox.notifications.attempts.DUE``)."""

DELIVERY_OUTCOMES: dict[str, dict[str, str]] = {
    "dispatch": {
        "dispatch.delivered.transport_ok": "delivered",
        "dispatch.pending.awaiting_ack": "awaiting_ack",
        "dispatch.pending.transport_failed": "retried",
        "dispatch.pending.released": "released",
        "dispatch.dead_letter.max_attempts": "dead_letter",
        "dispatch.dead_letter.ack_timeout": "dead_letter",
        "dispatch.expired.deadline": "expired",
        "dispatch.acked.consumer": "acked",
    },
    "notification": {
        "notification.delivered.channel_success": "delivered",
        "notification.pending.retry": "retried",
        "notification.pending.released": "released",
        "notification.failed.cycle_exhausted": "dead_letter",
        "notification.failed.best_effort": "failed",
        "notification.rate_limited.no_token": "rate_limited",
        "notification.deduplicated.owner_delivered": "deduplicated",
        "notification.deduplicated.window": "deduplicated",
    },
}
"""lifecycle -> reason code -> the delivery outcome a fact with that code records."""

ATTEMPT_REASONS = {
    "dispatch": ("dispatch.delivering.attempt", "dispatch.delivering.reclaimed"),
    "notification": ("notification.pending.claimed", "notification.pending.reclaimed",
                     "notification.pending.rate_limit_cleared"),
}
"""The claims that start an attempt, per deliverable lifecycle."""

SCHEDULER_REASONS = {
    "fired": ("schedule_run.running.fired",),
    "skipped": ("schedule_run.skipped.overlap", "schedule_run.skipped.missed_fire"),
    "deferred": ("schedule_run.skipped.deferred_capacity",),
}
"""What the scheduler decided, as the run records it writes (a deferral is recorded first and every
``record_every``-th time, specs/scheduler.md S5)."""


@dataclass(frozen=True)
class Due:
    """The due backlog of one deliverable lifecycle: how many rows are due and how long the oldest has been."""

    count: int
    oldest_age_seconds: float | None  # None: nothing is due


@dataclass(frozen=True)
class Latency:
    """Admitted-and-ended channel attempts of one channel: count, total seconds, cumulative buckets."""

    count: int
    sum_seconds: float
    buckets: dict[str, int]  # upper bound (as text, "+Inf" last) -> attempts at most that long


@dataclass(frozen=True)
class Stats:
    """One snapshot of the database's figures, taken at ``at`` (the clock's time)."""

    at: float
    entities: dict[str, dict[str, int]]
    transitions: dict[str, dict[str, int]]
    due: dict[str, Due]
    latency: dict[str, Latency] = field(default_factory=dict)

    def reason_total(self, lifecycle: str, reasons: tuple[str, ...]) -> int:
        """How many facts of ``lifecycle`` carry one of ``reasons``."""
        counts = self.transitions.get(lifecycle, {})
        return sum(counts.get(r, 0) for r in reasons)

    @property
    def deliveries(self) -> dict[str, dict[str, int]]:
        """lifecycle -> outcome -> count, for dispatches and notifications (every attempt that ended)."""
        out: dict[str, dict[str, int]] = {}
        for lifecycle, mapping in DELIVERY_OUTCOMES.items():
            if lifecycle not in self.entities:
                continue
            by_outcome = out.setdefault(lifecycle, {})
            for reason, outcome in mapping.items():
                by_outcome[outcome] = by_outcome.get(outcome, 0) + self.transitions.get(lifecycle, {}).get(reason, 0)
        return out

    @property
    def attempts(self) -> dict[str, int]:
        """lifecycle -> attempts started (claims), for dispatches and notifications."""
        return {lc: self.reason_total(lc, reasons) for lc, reasons in ATTEMPT_REASONS.items() if lc in self.entities}

    @property
    def channel_observations(self) -> dict[str, int]:
        """outcome -> channel attempt observations recorded with it (``channel_attempt.<outcome>.observed``)."""
        out: dict[str, int] = {}
        for reason, count in self.transitions.get("channel_attempt", {}).items():
            parts = reason.split(".")
            if len(parts) == 3 and parts[2] == "observed":
                out[parts[1]] = out.get(parts[1], 0) + count
        return out

    @property
    def rate_limit_waits(self) -> int:
        """Times a notification waited for a rate-limit token (``notification.rate_limited.no_token``)."""
        return self.reason_total("notification", ("notification.rate_limited.no_token",))

    @property
    def scheduler(self) -> dict[str, int]:
        """fired / skipped / deferred, as the scheduler's run records count them."""
        return {what: self.reason_total("schedule_run", reasons) for what, reasons in SCHEDULER_REASONS.items()}

    @property
    def runs(self) -> dict[str, int]:
        """Runs by status (their outcome, once terminal)."""
        return dict(self.entities.get("schedule_run", {}))

    def as_json(self) -> dict[str, Any]:
        """Everything, plain JSON: the raw parts and the views above."""
        return {
            "at": self.at,
            "entities": self.entities,
            "due": {k: asdict(v) for k, v in self.due.items()},
            "deliveries": self.deliveries,
            "attempts": self.attempts,
            "attempt_latency": {k: asdict(v) for k, v in self.latency.items()},
            "channel_observations": self.channel_observations,
            "rate_limit_waits": self.rate_limit_waits,
            "scheduler": self.scheduler,
            "runs": self.runs,
            "transitions": self.transitions,
            "verify": None,  # not recorded in the database: run `statebook verify`
        }


def _status_parts(lc: Lifecycle) -> list[tuple[str, ...]] | None:
    """The status sets to count apart, each with the predicate of one of the table's partial status indexes
    (``status_index``): its active and its terminal statuses, when it has an index for both; else None.

    Counted apart, each part is read from its index (SQLite: the settled one covers ``status``) instead of
    scanning every row; between them they cover every status."""
    roles = set(lc.table.info.get("status_indexes", {}).values())
    terminal = tuple(s for s in lc.statuses if s in lc.terminal)
    if roles < {"active", "terminal"} or not lc.active or not terminal:
        return None
    return [lc.active, terminal]


def _entities_query(book: Book) -> sa.CompoundSelect[str, str, int] | sa.Select[str, str, int]:
    parts: list[sa.Select[str, str, int]] = []
    for lc in book.registry:
        t = lc.table
        query = sa.select(sa.literal(lc.entity_type, sa.Text).label("lifecycle"), t.c.status,
                          sa.func.count().label("n")).group_by(t.c.status)
        # The predicate's text is the index's own (status_in, literals in declared order), so either planner
        # proves the partial index usable.
        split = _status_parts(lc)
        parts += [query] if split is None else [query.where(sa.text(status_in(f"{t.name}.status", statuses)))
                                                for statuses in split]
    return parts[0] if len(parts) == 1 else sa.union_all(*parts)


def _due_query(book: Book) -> sa.CompoundSelect[str, int, Any] | sa.Select[str, int, Any]:
    now = sa.bindparam("b_now", type_=sa.Float)
    d = dispatch_outbox
    parts = [
        sa.select(sa.literal("dispatch", sa.Text).label("lifecycle"), sa.func.count().label("n"),
                  sa.func.min(d.c.next_attempt_at).label("oldest"))
        .where(sa.text(status_in("dispatch_outbox.status", DUE_STATUSES)), d.c.next_attempt_at <= now)
    ]
    if "notification" in book.registry:
        from statebook.outbox.notifications import notifications as n

        parts.append(
            sa.select(sa.literal("notification", sa.Text).label("lifecycle"), sa.func.count().label("n"),
                      sa.func.min(n.c.next_attempt_at).label("oldest"))
            .where(sa.text(status_in("notifications.status", NOTIFICATION_DUE_STATUSES)), n.c.next_attempt_at <= now)
        )
    return parts[0] if len(parts) == 1 else sa.union_all(*parts)


def _facts_query(dialect: str) -> Any:
    """Facts by lifecycle and reason code. SQLite would walk the (entity_type, entity_id, version) index,
    which does not cover reason_code — a row lookup per fact, about twice the cost of reading the table
    (NOT INDEXED). PostgreSQL's planner already scans the table."""
    f = facts_table
    if dialect == "sqlite":
        return sa.text(f"SELECT entity_type, reason_code, count(*) FROM {f.name} NOT INDEXED "
                       "GROUP BY entity_type, reason_code")
    return sa.select(f.c.entity_type, f.c.reason_code, sa.func.count()).group_by(f.c.entity_type, f.c.reason_code)


def _latency_query() -> sa.Select[Any]:
    from statebook.outbox.notifications.schema import channel_attempts as a

    took = a.c.ended_at - a.c.started_at
    return (
        sa.select(a.c.channel, sa.func.count().label("n"), sa.func.coalesce(sa.func.sum(took), 0.0).label("total"),
                  *(sa.func.sum(sa.case((took <= bound, 1), else_=0)).label(f"b{i}")
                    for i, bound in enumerate(LATENCY_BUCKETS)))
        .where(a.c.started_at.is_not(None), a.c.ended_at.is_not(None))
        .group_by(a.c.channel)
    )


async def collect_stats(book: Book, *, clock: Clock | None = None, history: bool = True) -> Stats:
    """Read every figure of :class:`Stats` in one read transaction, one query per part.

    ``clock`` (default the book's) gives the time the due backlog is measured against. ``history=False``
    reads the rows only (entities and due, from indexes and the managed tables): the fact log and the
    attempts are not scanned, so ``transitions`` and ``latency`` stay empty (what a page refreshed live needs).
    """
    now = (clock or book.clock).now()
    entities: dict[str, dict[str, int]] = {lc.entity_type: {} for lc in book.registry}
    transitions: dict[str, dict[str, int]] = {}
    due: dict[str, Due] = {}
    latency: dict[str, Latency] = {}
    async with book.read() as conn:
        for lifecycle, status, n in (await conn.execute(_entities_query(book))).all():
            entities[lifecycle][status] = int(n)
        if history:
            rows = await conn.execute(_facts_query(book.dialect))
            for lifecycle, reason, n in rows.all():
                transitions.setdefault(lifecycle, {})[reason] = int(n)
        for lifecycle, n, oldest in (await conn.execute(_due_query(book), {"b_now": now})).all():
            due[lifecycle] = Due(int(n), None if oldest is None else max(0.0, now - float(oldest)))
        if history and "channel_attempt" in book.registry:
            for row in (await conn.execute(_latency_query())).all():
                buckets = {_bound(b): int(row[3 + i] or 0) for i, b in enumerate(LATENCY_BUCKETS)}
                buckets["+Inf"] = int(row[1])
                latency[row[0]] = Latency(int(row[1]), float(row[2] or 0.0), buckets)
    return Stats(now, entities, transitions, due, latency)


def _bound(value: float) -> str:
    """A bucket bound as Prometheus writes it (``0.005``, ``1.0``)."""
    return repr(float(value))
