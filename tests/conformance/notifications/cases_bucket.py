"""Notifications, rate-limit buckets (specs/notifications.md N8): the refill math, an empty bucket writes
nothing, a rolled-back draw gives its token back, concurrent drawers never overdraw, row == fold of facts."""

from __future__ import annotations

import asyncio
import math

import pytest
import sqlalchemy as sa

from statebook.lifecycle import Book, history, replay, verify
from statebook.lifecycle.facts import facts_table
from statebook.outbox.notifications import NotificationInvalid
from statebook.outbox.notifications.schema import rate_buckets
from statebook.outbox.notifications.buckets import draw, ensure_bucket

RACERS = 8
CAPACITY = 20


async def bucket_facts(book: Book) -> list[str]:
    """The reason codes of every rate_bucket fact, oldest first: what "nothing was written" compares."""
    async with book.read() as conn:
        rows = (await conn.execute(sa.select(facts_table.c.reason_code).where(facts_table.c.entity_type == "rate_bucket")
                                   .order_by(facts_table.c.entity_id, facts_table.c.version))).fetchall()
    return [r.reason_code for r in rows]


async def bucket(book: Book, channel: str = "slack", scope: str = "team") -> dict | None:
    async with book.read() as conn:
        row = (await conn.execute(sa.select(rate_buckets).where(rate_buckets.c.id == f"{channel}:{scope}"))).first()
    return None if row is None else dict(row._mapping)


async def draw_once(book: Book, channel: str = "slack", scope: str = "team", *, now: float) -> float:
    async with book.begin() as tx:
        return await draw(tx, channel, scope, now=now)


async def assert_folds(book: Book, entity_id: str = "slack:team") -> None:
    """The row is the fold of its facts, and the history verifies."""
    async with book.read() as conn:
        raw = dict((await conn.execute(sa.select(rate_buckets).where(rate_buckets.c.id == entity_id))).one()._mapping)
    assert await replay(book, "rate_bucket", entity_id) == raw
    assert (await verify(book, "rate_bucket")).ok


class Rollback(Exception):
    pass


class NotificationBucketCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_refill_is_fractional_and_never_exceeds_capacity(self, book: Book, clock):
        """N8: a bucket is created full; each draw takes one token; elapsed time refills refill_per_second
        tokens per second, fractions included, and never beyond capacity however long it waited."""
        await ensure_bucket(book, "slack", "team", capacity=3, refill_per_second=0.5)
        t0 = clock.now()
        assert (await bucket(book))["tokens"] == 3.0
        assert [await draw_once(book, now=t0) for _ in range(3)] == [0.0, 0.0, 0.0]
        assert await draw_once(book, now=t0) == 2.0  # 1 token at 0.5/s
        assert await draw_once(book, now=t0 + 1.0) == 1.0  # half a token refilled meanwhile
        assert await draw_once(book, now=t0 + 2.0) == 0.0  # 2 s * 0.5/s = exactly one token
        row = await bucket(book)
        assert (row["tokens"], row["refilled_at"]) == (0.0, t0 + 2.0)
        assert await draw_once(book, now=t0 + 2.5) == 1.5  # a quarter token: 0.75 missing at 0.5/s
        assert await draw_once(book, now=t0 + 4.5) == 0.0  # 1.25 tokens: one taken, a quarter kept
        assert (await bucket(book))["tokens"] == 0.25
        # An hour later the bucket is full (3 tokens), not 1800: three draws, then a wait.
        later = t0 + 3600.0
        assert [await draw_once(book, now=later) for _ in range(4)] == [0.0, 0.0, 0.0, 2.0]
        for row in [await bucket(book)]:
            assert 0.0 <= row["tokens"] <= row["capacity"]
        assert (await bucket_facts(book)).count("rate_bucket.open.drawn") == 3 + 1 + 1 + 3
        await assert_folds(book)

    async def test_a_clock_stepping_back_refills_nothing(self, book: Book, clock):
        """N8: a ``now`` before the last refill (another host's clock behind) adds no token and does not
        move ``refilled_at`` back, so no interval is paid out twice; the wait it reports counts the time
        until ``refilled_at`` too."""
        await ensure_bucket(book, "email", "ops", capacity=1, refill_per_second=1.0)
        t0 = clock.now()
        assert await draw_once(book, "email", "ops", now=t0 + 10.0) == 0.0  # full: 1 token, refilled_at t0+10
        # Nothing refills before t0+10, so by this caller's clock the next token is 5 + 1 s away.
        assert await draw_once(book, "email", "ops", now=t0 + 5.0) == 6.0
        row = await bucket(book, "email", "ops")
        assert (row["tokens"], row["refilled_at"]) == (0.0, t0 + 10.0)
        assert await draw_once(book, "email", "ops", now=t0 + 11.0) == 0.0

    async def test_an_empty_bucket_returns_the_wait_and_writes_nothing(self, book: Book, clock):
        """N8: no token: the seconds until the next one, and no fact, no row change (version and tokens
        as they were)."""
        await ensure_bucket(book, "pagerduty", "svc", capacity=1, refill_per_second=0.25)
        t0 = clock.now()
        assert await draw_once(book, "pagerduty", "svc", now=t0) == 0.0
        before, row_before = await bucket_facts(book), await bucket(book, "pagerduty", "svc")
        assert before == ["rate_bucket.open.created", "rate_bucket.open.drawn"]
        assert await draw_once(book, "pagerduty", "svc", now=t0) == 4.0
        assert await draw_once(book, "pagerduty", "svc", now=t0 + 3.0) == 1.0
        assert await bucket_facts(book) == before
        assert await bucket(book, "pagerduty", "svc") == row_before
        await assert_folds(book, "pagerduty:svc")

    async def test_a_missing_bucket_means_no_limit(self, book: Book, clock):
        """N8: a (channel, scope) without a bucket has no limit configured: every draw is 0.0 and writes nothing."""
        assert [await draw_once(book, "websocket", "anyone", now=clock.now()) for _ in range(5)] == [0.0] * 5
        assert await bucket_facts(book) == []
        assert await bucket(book, "websocket", "anyone") is None

    async def test_a_rolled_back_draw_gives_the_token_back(self, book: Book, clock):
        """N8: the token is taken in the caller's transaction; when that transaction rolls back (the attempt
        it paid for was not recorded) the token is still there."""
        await ensure_bucket(book, "slack", "team", capacity=1, refill_per_second=0.01)
        now = clock.now()
        with pytest.raises(Rollback):
            async with book.begin() as tx:
                assert await draw(tx, "slack", "team", now=now) == 0.0
                assert await draw(tx, "slack", "team", now=now) == 100.0  # this transaction sees its own draw
                raise Rollback
        assert (await bucket(book))["tokens"] == 1.0
        assert await bucket_facts(book) == ["rate_bucket.open.created"]
        assert await draw_once(book, now=now) == 0.0
        assert await draw_once(book, now=now) == 100.0
        await assert_folds(book)

    async def test_draw_refuses_an_unbound_book_and_bad_arguments(self, book: Book, clock):
        """N8: ``draw`` runs only in the caller's transaction (an unbound book is refused, naming
        ``book.begin()``); a bad channel, scope or time is a NotificationInvalid; nothing is written."""
        await ensure_bucket(book, "slack", "team", capacity=1, refill_per_second=1)
        with pytest.raises(NotificationInvalid, match="begin") as refused:
            await draw(book, "slack", "team", now=clock.now())
        assert (refused.value.argument, refused.value.rule) == ("tx", "bound")
        for channel, scope, now, argument in (("sms", "team", clock.now(), "channel"), ("slack", "", clock.now(), "scope"),
                                              ("slack", 7, clock.now(), "scope"), ("slack", "team", math.nan, "now"),
                                              ("slack", "team", "soon", "now")):
            with pytest.raises(NotificationInvalid) as refused:
                await draw_once(book, channel, scope, now=now)
            assert refused.value.argument == argument
        assert await bucket_facts(book) == ["rate_bucket.open.created"]

    @pytest.mark.parametrize("change, argument", [
        ({"capacity": 0}, "capacity"), ({"capacity": 0.5}, "capacity"), ({"capacity": math.inf}, "capacity"),
        ({"capacity": math.nan}, "capacity"), ({"capacity": True}, "capacity"), ({"capacity": "3"}, "capacity"),
        ({"refill_per_second": 0}, "refill_per_second"), ({"refill_per_second": -1.0}, "refill_per_second"),
        ({"refill_per_second": math.nan}, "refill_per_second"), ({"refill_per_second": math.inf}, "refill_per_second"),
        ({"channel": "sms"}, "channel"), ({"channel": None}, "channel"), ({"scope": ""}, "scope"),
        ({"scope": "x" * 300}, "scope"), ({"scope": 1}, "scope"),
    ])
    async def test_ensure_bucket_refuses_bad_arguments(self, book: Book, change, argument):
        """N8: capacity >= 1, refill > 0, both finite numbers; a known channel; a non-empty text scope.
        Each refusal names its argument and writes nothing."""
        args = {"channel": "slack", "scope": "team", "capacity": 5, "refill_per_second": 1.0, **change}
        with pytest.raises(NotificationInvalid) as refused:
            await ensure_bucket(book, args.pop("channel"), args.pop("scope"), **args)
        assert refused.value.argument == argument
        assert await bucket_facts(book) == []

    async def test_racing_creators_make_one_bucket_and_a_resize_is_a_transition(self, book: Book, clock,
                                                                                 more_engines):
        """N8: ensure_bucket from several connections at once creates ONE row and one creation fact; the
        same size again writes nothing; another size is one ``rate_bucket.open.resized`` transition that
        refills at the old rate first and keeps at most the new capacity."""
        books = [Book(more_engines(), book.registry, book.clock) for _ in range(RACERS)]
        await asyncio.gather(*(ensure_bucket(b, "slack", "team", capacity=4, refill_per_second=1) for b in books))
        assert await bucket_facts(book) == ["rate_bucket.open.created"]
        await ensure_bucket(book, "slack", "team", capacity=4, refill_per_second=1.0)
        assert await bucket_facts(book) == ["rate_bucket.open.created"]
        t0 = clock.now()
        for _ in range(4):
            assert await draw_once(book, now=t0) == 0.0
        clock.advance(3.0)  # 3 tokens refilled at the old rate, then at most 2 are kept
        await ensure_bucket(book, "slack", "team", capacity=2, refill_per_second=0.5)
        row = await bucket(book)
        assert (row["capacity"], row["refill_per_second"], row["tokens"], row["refilled_at"]) == (2.0, 0.5, 2.0, t0 + 3)
        assert (await bucket_facts(book))[-1] == "rate_bucket.open.resized"
        [*_, resized] = await history(book, "rate_bucket", "slack:team")
        assert resized.patch == {"capacity": 2.0, "refill_per_second": 0.5, "tokens": 2.0, "refilled_at": t0 + 3}
        await assert_folds(book)

    async def test_concurrent_drawers_take_exactly_the_capacity(self, book: Book, clock, more_engines):
        """N8: drawers on separate connections, all at the same instant (no refill), over a bucket of capacity
        K: exactly K tokens are taken — K drawn facts, tokens 0 — however their transactions interleave
        (PostgreSQL: the row lock queues them; SQLite: the single writer)."""
        await ensure_bucket(book, "email", "fleet", capacity=CAPACITY, refill_per_second=1e-6)
        now = clock.now()
        books = [Book(more_engines(), book.registry, book.clock) for _ in range(RACERS)]

        async def drawer(b: Book) -> int:
            taken = 0
            while True:
                async with b.begin() as tx:
                    wait = await draw(tx, "email", "fleet", now=now)
                    await asyncio.sleep(0)  # hold the transaction open while the others queue
                if wait > 0:
                    return taken
                taken += 1

        taken = await asyncio.gather(*(drawer(b) for b in books))
        assert sum(taken) == CAPACITY, taken
        assert (await bucket_facts(book)).count("rate_bucket.open.drawn") == CAPACITY
        assert (await bucket(book, "email", "fleet"))["tokens"] == 0.0
        await assert_folds(book, "email:fleet")
