"""``GET /``: the overview — entities per lifecycle and status, the due backlog, deliveries per minute,
dead letters waiting, the scheduler's leader, and what is known of the last verify.

Every figure is read from an index or a managed table, never by scanning the fact log whole, so the page
stays fast on a big book (docs/console.md, "Overview and live updates"): the rows' counts and the due
backlog are :func:`statebook.adapters.stats.collect_stats` without its history part; the deliveries chart
reads the newest facts by their primary key, at most :data:`CHART_FACTS` of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from statebook.adapters.leader import LEASE
from statebook.adapters.stats import DELIVERY_OUTCOMES, Due, collect_stats
from statebook.lifecycle import Book
from statebook.lifecycle.chain import Switch, read_switch
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.schema import status_in
from statebook.scheduler.schema import scheduler_daemons, scheduler_leases

from .audit_view import auditor
from .auth import requires
from .pages import render
from .state import console
from .svg import bar_chart

__all__ = ["CHART_FACTS", "CHART_MINUTES", "Daemon", "Deliveries", "Figures", "Lease", "chart_query",
           "deliveries_per_minute", "figures", "overview", "routes"]

CHART_MINUTES = 60
CHART_FACTS = 10_000
"""The most facts the deliveries chart reads (the newest, by seq): on a book busier than that per hour the
chart covers its last minutes only, and says from when."""

_REASONS: dict[str, tuple[str, str]] = {
    reason: (lifecycle, outcome) for lifecycle, mapping in DELIVERY_OUTCOMES.items() for reason, outcome in mapping.items()
}


@dataclass(frozen=True)
class Deliveries:
    """Delivery outcomes per minute (oldest first) over the chart's window.

    ``since`` is the time from which the figures are whole: the window's start, or later when the window
    held more than :data:`CHART_FACTS` facts.
    """

    minutes: list[tuple[float, dict[str, int]]]
    by_lifecycle: dict[str, dict[str, int]]
    since: float
    start: float

    @property
    def complete(self) -> bool:
        """True when every minute of the window is counted."""
        return self.since <= self.start

    @property
    def outcomes(self) -> list[str]:
        """The outcomes seen in the window, in order of their totals (largest first)."""
        totals: dict[str, int] = {}
        for _, counts in self.minutes:
            for outcome, n in counts.items():
                totals[outcome] = totals.get(outcome, 0) + n
        return sorted(totals, key=lambda o: (-totals[o], o))


@dataclass(frozen=True)
class Lease:
    """The scheduler's leadership lease: who holds it, under which epoch, renewed when."""

    holder: str
    epoch: int
    heartbeat_at: float
    acquired_at: float
    age: float
    stale: bool


@dataclass(frozen=True)
class Daemon:
    """A daemon's heartbeat row (leader or standby)."""

    daemon_id: str
    heartbeat_at: float
    started_at: float
    age: float


@dataclass(frozen=True)
class Figures:
    """Everything the overview shows, read at ``at`` (the book's clock)."""

    at: float
    entities: dict[str, dict[str, int]]
    due: dict[str, Due]
    dead_letters: dict[str, int]
    deliveries: Deliveries
    lease: Lease | None
    daemons: list[Daemon]
    switch: Switch | None
    lease_seconds: float

    @property
    def dead_letters_total(self) -> int:
        """Dead letters waiting for an operator, dispatches and notifications together."""
        return sum(self.dead_letters.values())


def _ordered_entities(book: Book, found: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Every registered lifecycle with every status, in declaration order, zeros included."""
    return {lc.entity_type: {s: int(found.get(lc.entity_type, {}).get(s, 0)) for s in lc.statuses}
            for lc in book.registry}


def chart_query(floor: int, start: float, end: float) -> sa.Select[float, str]:
    """The delivery facts with ``seq > floor`` and a time in [start, end): a range of the primary key."""
    f = facts_table
    # No condition on entity_type: the planner would take its index and read every delivery fact.
    return sa.select(f.c.at, f.c.reason_code).where(f.c.seq > floor, f.c.at >= start, f.c.at < end,
                                                     f.c.reason_code.in_(list(_REASONS)))


async def deliveries_per_minute(book: Book, now: float, *, minutes: int = CHART_MINUTES,
                                limit: int = CHART_FACTS) -> Deliveries:
    """Delivery outcomes (``stats.DELIVERY_OUTCOMES``) per minute of the last ``minutes``, from the newest
    ``limit`` facts (a range of the primary key, so the cost does not grow with the log)."""
    f = facts_table
    end = (now // 60 + 1) * 60  # the current minute is the last bar
    start = end - minutes * 60
    async with book.read() as conn:
        top = (await conn.execute(sa.select(sa.func.coalesce(sa.func.max(f.c.seq), 0)))).scalar_one()
        floor = max(int(top) - limit, 0)
        since = start
        if floor > 0:
            last_left = (await conn.execute(
                sa.select(f.c.at).where(f.c.seq <= floor).order_by(f.c.seq.desc()).limit(1))).scalar()
            if last_left is not None and float(last_left) >= start:
                since = float(last_left)  # the window holds facts older than the newest `limit`
        rows = (await conn.execute(chart_query(floor, start, end))).all()
    buckets: list[tuple[float, dict[str, int]]] = [(start + 60 * i, {}) for i in range(minutes)]
    by_lifecycle: dict[str, dict[str, int]] = {}
    for at, reason in rows:
        lifecycle, outcome = _REASONS[reason]
        counts = buckets[min(int((float(at) - start) // 60), minutes - 1)][1]
        counts[outcome] = counts.get(outcome, 0) + 1
        mine = by_lifecycle.setdefault(lifecycle, {})
        mine[outcome] = mine.get(outcome, 0) + 1
    return Deliveries(buckets, by_lifecycle, since, start)


async def _dead_letters(book: Book, entities: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    out = {}
    if "dispatch" in entities:
        out["dispatch"] = int(entities["dispatch"].get("dead_letter", 0))
    if "notification" in book.registry:
        from statebook.outbox.notifications.schema import notifications as n

        settled = tuple(s for s in book.policy("notification").statuses if s in book.policy("notification").terminal)
        async with book.read() as conn:
            out["notification"] = int((await conn.execute(
                # The settled statuses, as the partial index names them: the count reads the index, not the table.
                sa.select(sa.func.count()).select_from(n)
                .where(sa.text(status_in("notifications.status", settled)), n.c.status == "failed", n.c.dead_letter == 1)
            )).scalar_one())
    return out


async def _leadership(book: Book, now: float, lease_seconds: float) -> tuple[Lease | None, list[Daemon]]:
    lease, daemons = scheduler_leases, scheduler_daemons
    async with book.read() as conn:
        row = (await conn.execute(sa.select(lease).where(lease.c.name == LEASE))).first()
        beats = (await conn.execute(
            sa.select(daemons).order_by(daemons.c.heartbeat_at.desc()).limit(20))).all()
    found = None
    if row is not None:
        age = max(0.0, now - float(row.heartbeat_at))
        found = Lease(row.holder, int(row.epoch), float(row.heartbeat_at), float(row.acquired_at), age,
                      age > lease_seconds)
    return found, [Daemon(d.daemon_id, float(d.heartbeat_at), float(d.started_at),
                          max(0.0, now - float(d.heartbeat_at))) for d in beats]


async def figures(book: Book, *, lease_seconds: float = 90.0) -> Figures:
    """Read every figure of the overview (a handful of indexed reads; no scan of the whole fact log).

    ``lease_seconds`` is the scheduler's lease (``[scheduler] lease_seconds``): a leader whose heartbeat is
    older is shown as stale.
    """
    stats = await collect_stats(book, history=False)
    entities = _ordered_entities(book, stats.entities)
    deliveries = await deliveries_per_minute(book, stats.at)
    lease, daemons = await _leadership(book, stats.at, lease_seconds)
    return Figures(stats.at, entities, dict(stats.due), await _dead_letters(book, entities), deliveries, lease,
                   daemons, await read_switch(book), lease_seconds)



# -- the page -------------------------------------------------------------------------------------

@requires("viewer")
async def overview(request: Request) -> Response:
    """``GET /``; ``?fragment=figures``: only the figures' region (what a live refresh fetches)."""
    c = console(request)
    found = await figures(c.book, lease_seconds=c.settings.scheduler.lease_seconds)
    # svg.py escapes every label of the chart; the markup is ours, not the data's.
    chart = Markup(bar_chart(found.deliveries.minutes, title="deliveries per minute, last hour (UTC)"))
    context = {"figures": found, "chart": chart, "audit": auditor(c)}
    if request.query_params.get("fragment") == "figures":
        return render(request, "overview/figures.html", context)
    return render(request, "overview/page.html", context)


routes = [Route("/", overview, name="overview")]
