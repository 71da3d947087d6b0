"""Scans: ordered, bounded, counting only won claims; bounded concurrency; SKIP LOCKED on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect
from statebook.lifecycle import Book
from statebook.outbox import (
    DispatchInvalid,
    claim,
    deliver_due_dispatches,
    dispatch_outbox,
    enqueue_dispatch,
    next_due,
    scan,
)

from dispatch_support import Recorder, failing, row


async def test_scans_are_ordered_by_due_time_then_id_and_bounded(book, clock):
    """O11 (do-better 4): candidates come in (next_attempt_at, id) order — an older row retried
    after backoff sorts after younger rows due earlier, equal due times sort by id — and a scan
    or a pass never takes more than its limit."""
    old = await enqueue_dispatch(book, kind="k", deliver_to="old")
    await deliver_due_dispatches(book, transport=Recorder(outcome=failing()).transport)  # old: due at +60
    clock.advance(10)
    ties = [await enqueue_dispatch(book, kind="k", deliver_to=f"tie-{n}") for n in range(4)]
    clock.advance(10)
    late = await enqueue_dispatch(book, kind="k", deliver_to="late")
    clock.advance(40)
    expected = [*sorted(ties), late, old]
    assert [c.dispatch_id for c in await scan(book, now=clock.now())] == expected
    assert [c.dispatch_id for c in await scan(book, now=clock.now(), limit=3)] == expected[:3]
    assert await next_due(book) == clock.now() - 50

    rec = Recorder()
    counts = await deliver_due_dispatches(book, transport=rec.transport, batch_size=3, concurrency=1)
    assert counts["attempted"] == 3
    assert rec.ids() == expected[:3]
    assert (await row(book, old))["status"] == "pending"


async def test_concurrent_passes_count_only_the_claims_they_won(book, db_url, clock):
    """O11, O12 (do-better 4): two passes on separate connections over the same due rows: each row
    is sent once, and the passes' ``attempted`` add up to the rows, not to the rows each one saw."""
    ids = [await enqueue_dispatch(book, kind="k", deliver_to=f"r{n}") for n in range(30)]
    other = Book(connect(db_url), book.registry, clock)
    rec = Recorder(delay=0.001)
    try:
        a, b = await asyncio.gather(
            deliver_due_dispatches(book, transport=rec.transport, batch_size=50),
            deliver_due_dispatches(other, transport=rec.transport, batch_size=50),
        )
    finally:
        await other.engine.dispose()
    assert a["attempted"] + b["attempted"] == len(ids)
    assert Counter(rec.ids()) == Counter(ids)


async def test_a_stale_candidate_is_not_claimed(book, clock):
    """O5, O11: a candidate another claimant already took yields no lease (and so no attempt)."""
    await enqueue_dispatch(book, kind="k", deliver_to="r")
    [c] = await scan(book, now=clock.now())
    assert await claim(book, c, now=clock.now()) is not None
    assert await claim(book, c, now=clock.now()) is None


async def test_transports_run_with_bounded_concurrency(book):
    """O12 (do-better 4): a pass runs several transports at once, never more than ``concurrency``."""
    for n in range(10):
        await enqueue_dispatch(book, kind="k", deliver_to=f"r{n}")
    rec = Recorder(delay=0.05)
    counts = await deliver_due_dispatches(book, transport=rec.transport, concurrency=3)
    assert counts["delivered"] == 10
    assert rec.in_flight_max == 3


async def test_passes_refuse_to_run_transports_inside_a_transaction(book):
    """O12: delivery needs an unbound book — external effects never run inside a transaction."""
    await enqueue_dispatch(book, kind="k", deliver_to="r")
    rec = Recorder()
    with pytest.raises(DispatchInvalid, match="transaction"):
        async with book.begin() as tx:
            await deliver_due_dispatches(tx, transport=rec.transport)
    assert rec.calls == []


@pytest.mark.postgres
async def test_postgres_candidate_selection_skips_rows_locked_by_another_worker(pg_url, clock):
    """O12 (do-better 4): while another transaction holds the earliest due row, a pass neither
    waits for it nor sends it: it claims the other due rows (FOR UPDATE SKIP LOCKED)."""
    from statebook.adapters.db import open_book, reset_schema

    book = await open_book(pg_url, clock=clock)
    holder = connect(pg_url)
    try:
        await reset_schema(book.engine)
        ids = [await enqueue_dispatch(book, kind="k", deliver_to=f"r{n}") for n in range(5)]
        first = min(ids)
        rec = Recorder()
        async with holder.begin() as conn:
            t = dispatch_outbox
            await conn.execute(sa.select(t.c.id).where(t.c.id == first).with_for_update())
            counts = await asyncio.wait_for(deliver_due_dispatches(book, transport=rec.transport), 30)
        assert counts["attempted"] == 4
        assert sorted(rec.ids()) == sorted(set(ids) - {first})
        assert (await row(book, first))["status"] == "pending"
    finally:
        await holder.dispose()
        await book.engine.dispose()


async def test_the_payload_sent_is_the_stored_envelope(book):
    """O1: the transport gets (deliver_to, stored JSON text) for each row."""
    did = await enqueue_dispatch(book, kind="k", deliver_to="seat-9", body={"x": [1, 2]})
    rec = Recorder()
    await deliver_due_dispatches(book, transport=rec.transport)
    [(to, payload)] = rec.calls
    assert to == "seat-9" and json.loads(payload) == (await row(book, did))["payload"]


async def test_the_scan_reads_the_due_index_in_order(tmp_path):
    """O11: the scan is served by the due index in (next_attempt_at, id) order — no sort of all due rows."""
    import sqlalchemy as sa

    from statebook.adapters.db import open_book
    from statebook.outbox.attempts import scan_query

    book = await open_book(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        query = scan_query(now=0.0, limit=10)
        sql = str(query.compile(book.engine, compile_kwargs={"literal_binds": True}))
        async with book.read() as conn:
            plan = " | ".join(str(r[-1]) for r in await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {sql}")))
    finally:
        await book.engine.dispose()
    assert "idx_dispatch_outbox_due" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
