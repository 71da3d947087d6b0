"""Real concurrency on PostgreSQL: many workers on the same due rows, many producers on one key.

Every worker and producer has its own engine (its own connections), so the database, not the
event loop, decides who wins: the asyncio tasks only overlap their round-trips.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect, open_book, reset_schema
from statebook.lifecycle import Book, FakeClock, history, verify
from statebook.lifecycle.facts import facts_table
from statebook.outbox import (
    CallableTransport,
    TransportResult,
    deliver_due_dispatches,
    dispatch_outbox,
    enqueue_dispatch,
)
from statebook.outbox.dispatch.attempts import CLAIM_LEASE_SECONDS, scan
from statebook.outbox.dispatch.delivery import claim_due
from statebook.outbox.dispatch.steps import claim, execute, finalize, settle

pytestmark = pytest.mark.postgres

WORKERS = 6
ROWS = 200
PRODUCERS = 10


@pytest.fixture
async def pg_book(pg_url):
    book = await open_book(pg_url, clock=FakeClock())
    await reset_schema(book.engine)
    try:
        yield book
    finally:
        await book.engine.dispose()


async def _books(pg_book: Book, n: int) -> list[Book]:
    return [Book(connect(pg_book.engine.url.render_as_string(hide_password=False)), pg_book.registry, pg_book.clock)
            for _ in range(n)]


async def step_worker(book: Book, now: float, transport: CallableTransport) -> Counter:
    """scan + settle + claim + execute + finalize, one row at a time, without SKIP LOCKED at the
    scan: concurrent step workers see the same candidates and collide on the claim itself."""
    total: Counter = Counter()
    for _ in range(200):
        candidates = await scan(book, now=now, limit=20)
        if not candidates:
            break
        for candidate in candidates:
            if await settle(book, candidate, now=now) is not None:
                continue
            lease = await claim(book, candidate, now=now)
            if lease is None:
                total["lost"] += 1
                continue
            total["attempted"] += 1
            outcome = await finalize(book, lease, await execute(lease, transport), now=now)
            total[outcome] += 1
    return total


async def pass_worker(book: Book, now: float, transport: CallableTransport) -> Counter:
    total: Counter = Counter()
    for _ in range(50):
        counts = await deliver_due_dispatches(book, now=now, transport=transport, batch_size=25, concurrency=4)
        total.update(counts)
        if counts["attempted"] == 0 and await _due_left(book, now) == 0:
            break
    return total


@pytest.mark.parametrize("reclaim", [False, True], ids=["fresh", "lapsed_leases"])
@pytest.mark.parametrize("worker", [pass_worker, step_worker], ids=["passes", "steps"])
async def test_concurrent_workers_execute_each_attempt_once(pg_book, worker, reclaim):
    """O5 (O-single-claim), O11 (O-counters), O12: six workers on separate connections deliver the
    same 200 due rows at the same instant — whole passes (SKIP LOCKED) or single steps (colliding
    on the claim's compare-and-set). Every row is delivered, the transport runs exactly once per
    won claim, the facts hold exactly one claim per (dispatch, attempt), and the counters add up
    to the claims won. With ``lapsed_leases`` every row was first claimed by a worker that died
    (attempt 1, lease lapsed), so the six race to reclaim attempt 2."""
    now = pg_book.clock.now()
    ids = [await enqueue_dispatch(pg_book, kind="load", deliver_to=f"seat-{n % 7}", body={"n": n}) for n in range(ROWS)]
    attempt = 1
    if reclaim:
        leases, _ = await claim_due(pg_book, now=now, limit=ROWS)  # claimed, then the worker "died"
        assert len(leases) == ROWS
        now += CLAIM_LEASE_SECONDS + 1
        attempt = 2
    executed: list[str] = []

    async def send(deliver_to: str, payload: str) -> TransportResult:
        executed.append(json.loads(payload)["dispatch_id"])
        await asyncio.sleep(0)  # let the other workers' claims interleave with this send
        return TransportResult(ok=True, error=None)

    books = await _books(pg_book, WORKERS)
    try:
        totals = await asyncio.gather(*(worker(b, now, CallableTransport(send)) for b in books))
    finally:
        for b in books:
            await b.engine.dispose()

    assert await _due_left(pg_book, now) == 0
    assert Counter(executed) == Counter({d: 1 for d in ids}), [d for d, n in Counter(executed).items() if n > 1]
    assert sum(t["attempted"] for t in totals) == ROWS
    assert sum(t["delivered"] for t in totals) == ROWS
    assert sum(t["retried"] + t["dead_letter"] + t["expired"] + t["conflict"] for t in totals) == 0

    async with pg_book.read() as conn:
        statuses = Counter(r.status for r in (await conn.execute(sa.select(dispatch_outbox.c.status))).fetchall())
        claim_facts = Counter(
            (r.entity_id, r.patch["attempt"])
            for r in (
                await conn.execute(
                    sa.select(facts_table.c.entity_id, facts_table.c.patch).where(
                        facts_table.c.entity_type == "dispatch", facts_table.c.status == "delivering"
                    )
                )
            ).fetchall()
        )
    assert statuses == Counter({"delivered": ROWS})
    assert claim_facts == Counter({(d, a): 1 for d in ids for a in range(1, attempt + 1)})
    assert (await verify(pg_book, "dispatch")).ok
    print(f"claims won per worker: {[t['attempted'] for t in totals]}, lost: {[t['lost'] for t in totals]}")


async def _due_left(book: Book, now: float) -> int:
    t = dispatch_outbox
    async with book.read() as conn:
        return (
            await conn.execute(
                sa.select(sa.func.count()).where(t.c.status.in_(("pending", "delivering")), t.c.next_attempt_at <= now)
            )
        ).scalar_one()


@pytest.mark.parametrize("in_caller_tx", [False, True], ids=["plain", "caller_tx"])
async def test_producers_racing_one_new_dedup_key_share_one_row(pg_book, in_caller_tx):
    """O3 (O-dedup): ten producers on separate connections enqueue the same new dedup key at once; all
    get the one committed id, the table holds one row for the key and its history one creation
    fact. With ``caller_tx`` every producer has its own transaction open before the barrier, so the
    inserts truly overlap and the losers wait on the unique index for the winner's commit."""
    books = await _books(pg_book, PRODUCERS)
    barrier = asyncio.Barrier(PRODUCERS)
    try:
        for round_ in range(5):
            key = f"race-{in_caller_tx}-{round_}"

            async def produce(book: Book, n: int) -> str:
                if in_caller_tx:
                    async with book.begin() as tx:
                        await tx.conn.execute(sa.text("SELECT 1"))
                        await barrier.wait()
                        return await enqueue_dispatch(tx, kind="race", deliver_to=f"seat-{n}", dedup_key=key)
                await barrier.wait()
                return await enqueue_dispatch(book, kind="race", deliver_to=f"seat-{n}", dedup_key=key)

            got = await asyncio.gather(*(produce(b, n) for n, b in enumerate(books)))
            assert len(set(got)) == 1, Counter(got)
            [did] = set(got)
            async with pg_book.read() as conn:
                rows = (
                    await conn.execute(sa.select(dispatch_outbox.c.id).where(dispatch_outbox.c.dedup_key == key))
                ).fetchall()
            assert [r.id for r in rows] == [did]
            facts = await history(pg_book, "dispatch", did)
            assert [(f.previous_status, f.status) for f in facts] == [(None, "pending")]
    finally:
        for b in books:
            await b.engine.dispose()
    assert (await verify(pg_book, "dispatch")).ok
