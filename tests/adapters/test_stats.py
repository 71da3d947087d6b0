"""O1, O2: ``collect_stats`` (one query per part) equals a slow reference computed row by row from the
same database, on both backends, after deliveries, retries, dead letters, rate-limit waits and racing passes."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import sqlalchemy as sa

from statebook.adapters.db import open_book
from statebook.adapters.stats import (
    DELIVERY_OUTCOMES, LATENCY_BUCKETS, NOTIFICATION_DUE_STATUSES, SCHEDULER_REASONS, collect_stats,
)
from statebook.lifecycle import Book, FakeClock
from statebook.lifecycle.facts import facts_table
from statebook.outbox import TransportResult, enqueue_dispatch
from statebook.outbox.dispatch.delivery import deliver_due_dispatches
from statebook.outbox.notifications import send_notification
from statebook.outbox.notifications.buckets import ensure_bucket
from statebook.outbox.notifications.attempts import DEFAULT_SCOPE
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.schema import channel_attempts
from statebook.outbox.notifications.scripted import ScriptedChannel
from statebook.outbox.dispatch.policy import DUE_STATUSES

from conformance.outbox.support import Recorder


class Ticking(FakeClock):
    """A fake clock that moves a little on every read, so attempts take different, known times."""

    def __init__(self, step: float = 0.07) -> None:
        super().__init__()
        self.step = step

    def now(self) -> float:
        self.advance(self.step)
        return super().now()


async def reference(book: Book, now: float) -> dict[str, Any]:
    """The figures computed the slow way: every row and every fact read into Python and counted."""
    out: dict[str, Any] = {"entities": {}, "transitions": {}, "due": {}, "latency": {}}
    async with book.read() as conn:
        for lc in book.registry:
            rows = (await conn.execute(sa.select(lc.table))).mappings().all()
            out["entities"][lc.entity_type] = dict(Counter(r["status"] for r in rows))
            if lc.entity_type in ("dispatch", "notification"):
                due_statuses = DUE_STATUSES if lc.entity_type == "dispatch" else NOTIFICATION_DUE_STATUSES
                due = [r["next_attempt_at"] for r in rows if r["status"] in due_statuses
                       and r["next_attempt_at"] is not None and r["next_attempt_at"] <= now]
                out["due"][lc.entity_type] = (len(due), (now - min(due)) if due else None)
        for f in (await conn.execute(sa.select(facts_table.c.entity_type, facts_table.c.reason_code))).all():
            by = out["transitions"].setdefault(f.entity_type, {})
            by[f.reason_code] = by.get(f.reason_code, 0) + 1
        for a in (await conn.execute(sa.select(channel_attempts))).mappings().all():
            if a["started_at"] is None or a["ended_at"] is None:
                continue
            took = a["ended_at"] - a["started_at"]
            lat = out["latency"].setdefault(a["channel"], {"count": 0, "sum": 0.0, "buckets": Counter()})
            lat["count"] += 1
            lat["sum"] += took
            for bound in LATENCY_BUCKETS:
                if took <= bound:
                    lat["buckets"][repr(bound)] += 1
    return out


def assert_matches(stats: Any, ref: dict[str, Any]) -> None:
    assert stats.entities == ref["entities"]
    assert stats.transitions == ref["transitions"]
    assert set(stats.due) == set(ref["due"]) and _close_due(stats, ref), (stats.due, ref["due"])
    assert set(stats.latency) == set(ref["latency"])
    for channel, lat in stats.latency.items():
        want = ref["latency"][channel]
        assert lat.count == want["count"] and abs(lat.sum_seconds - want["sum"]) < 1e-6
        assert {k: v for k, v in lat.buckets.items() if k != "+Inf"} == {repr(b): want["buckets"][repr(b)]
                                                                          for b in LATENCY_BUCKETS}
        assert lat.buckets["+Inf"] == want["count"]
    # The views are the reference's facts, grouped.
    for lifecycle, mapping in DELIVERY_OUTCOMES.items():
        for outcome, n in stats.deliveries[lifecycle].items():
            assert n == sum(ref["transitions"].get(lifecycle, {}).get(r, 0) for r, o in mapping.items() if o == outcome)
    for decision, reasons in SCHEDULER_REASONS.items():
        assert stats.scheduler[decision] == sum(ref["transitions"].get("schedule_run", {}).get(r, 0) for r in reasons)


def _close_due(stats: Any, ref: dict[str, Any]) -> bool:
    """Ages are floats computed on two sides: equal counts, ages within a microsecond."""
    for k, (n, age) in ref["due"].items():
        got = stats.due[k]
        if got.count != n or (age is None) != (got.oldest_age_seconds is None):
            return False
        if age is not None and abs(age - got.oldest_age_seconds) > 1e-6:
            return False
    return True


async def populate(book: Book, db_url: str) -> Book:
    """Dispatches delivered, retried, dead-lettered, raced by two passes; notifications delivered,
    failed, rate-limited; a few left due. Returns the book on a ticking clock."""
    tick = Ticking()
    book = book.with_clock(tick)
    ok = [await enqueue_dispatch(book, kind="k", deliver_to="ok", body={"i": i}) for i in range(6)]
    bad = [await enqueue_dispatch(book, kind="k", deliver_to="bad", body={"i": i}, max_attempts=1) for i in range(2)]
    flaky = await enqueue_dispatch(book, kind="k", deliver_to="bad", body={"flaky": True}, max_attempts=3)
    assert ok and bad and flaky
    rec = Recorder(outcome=lambda to, _n: TransportResult(to == "ok", None if to == "ok" else "refused"))
    other = await open_book(db_url, clock=tick, create=False)
    try:
        # Two passes on two connections race for the same due rows (SKIP LOCKED / the single writer).
        await asyncio.gather(deliver_due_dispatches(book, transport=rec.transport, batch_size=3),
                             deliver_due_dispatches(other.with_clock(tick), transport=rec.transport, batch_size=3))
    finally:
        await other.engine.dispose()
    await deliver_due_dispatches(book, transport=rec.transport)
    # Left due: new rows nobody delivered yet (the backlog), made older by the clock.
    for i in range(3):
        await enqueue_dispatch(book, kind="later", deliver_to="ok", body={"j": i})
    tick.advance(40.0)

    await ensure_bucket(book, "slack", DEFAULT_SCOPE, capacity=1, refill_per_second=0.0001)
    channels = {"email": ScriptedChannel("email", ["success", "reject", "success"]),
                "slack": ScriptedChannel("slack", ["success"])}
    for i in range(3):
        await send_notification(book, recipient=f"ops{i}", content={"text": "x"}, mode="guaranteed",
                                channels=["email"])
    await send_notification(book, recipient="best", content={"text": "y"}, mode="best_effort", channels=["email"])
    for i in range(2):
        await send_notification(book, recipient=f"team{i}", content={"text": "z"}, mode="guaranteed",
                                channels=["slack"])
    await deliver_due_notifications(book, channels, deadline=5)
    tick.advance(400.0)
    await deliver_due_notifications(book, channels, deadline=5)
    return book


async def test_stats_equal_a_slow_reference(book: Book, db_url: str):
    """O1: every part of the snapshot equals the row-by-row reference of the same database."""
    book = await populate(book, db_url)
    fixed = FakeClock(book.clock.now())
    stats = await collect_stats(book, clock=fixed)
    ref = await reference(book, fixed.now())
    assert_matches(stats, ref)
    # The scenario reached what the test is about (else equal-and-empty would pass).
    assert stats.deliveries["dispatch"]["delivered"] >= 6 and stats.deliveries["dispatch"]["dead_letter"] >= 2
    assert stats.deliveries["dispatch"]["retried"] >= 1
    assert stats.due["dispatch"].count >= 3 and stats.due["dispatch"].oldest_age_seconds >= 40.0
    assert stats.deliveries["notification"]["delivered"] >= 1 and stats.rate_limit_waits >= 1
    assert stats.latency and all(lat.count > 0 and lat.sum_seconds > 0 for lat in stats.latency.values())
    assert stats.channel_observations.get("success", 0) >= 1


async def test_due_is_measured_against_the_clock_given(book: Book):
    """O2: the due backlog counts rows due at the clock's time (not later ones) and ages the oldest by it."""
    clock = FakeClock(1_800_000_000.0)
    book = book.with_clock(clock)
    await enqueue_dispatch(book, kind="k", deliver_to="x")
    clock.advance(10.0)
    await enqueue_dispatch(book, kind="k", deliver_to="x")
    before = await collect_stats(book, clock=FakeClock(1_800_000_000.0 - 1))
    assert before.due["dispatch"].count == 0 and before.due["dispatch"].oldest_age_seconds is None
    later = await collect_stats(book, clock=FakeClock(1_800_000_000.0 + 25.0))
    assert later.due["dispatch"].count == 2 and abs(later.due["dispatch"].oldest_age_seconds - 25.0) < 1e-6
    assert later.entities["dispatch"] == {"pending": 2}


async def test_stats_read_one_query_per_part(book: Book):
    """O1: a snapshot is a fixed number of statements, however many rows and lifecycles there are."""
    for i in range(20):
        await enqueue_dispatch(book, kind="k", deliver_to="x", body={"i": i})
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            statements.append(statement)

    sa.event.listen(book.engine.sync_engine, "before_cursor_execute", count)
    try:
        await collect_stats(book)
    finally:
        sa.event.remove(book.engine.sync_engine, "before_cursor_execute", count)
    assert len(statements) == 4, statements
