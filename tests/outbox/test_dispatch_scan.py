"""Scans: ordered, bounded, counting only won claims; bounded concurrency; SKIP LOCKED on PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect
from statebook.outbox import (
    deliver_due_dispatches,
    dispatch_outbox,
    enqueue_dispatch,
)

from conformance.outbox.support import Recorder, row


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
        assert (await row(book, first)).status == "pending"
    finally:
        await holder.dispose()
        await book.engine.dispose()


async def test_the_scan_reads_the_due_index_in_order(tmp_path):
    """O11: the scan is served by the due index in (next_attempt_at, id) order — no sort of all due rows."""
    import sqlalchemy as sa

    from statebook.adapters.db import open_book
    from statebook.outbox.dispatch import attempts

    book = await open_book(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        query = attempts.SCAN.params(b_now=0.0, b_limit=10)  # the statement every scan runs
        sql = str(query.compile(book.engine, compile_kwargs={"literal_binds": True}))
        async with book.read() as conn:
            plan = " | ".join(str(r[-1]) for r in await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {sql}")))
    finally:
        await book.engine.dispose()
    assert "idx_dispatch_outbox_due" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


async def test_retention_and_bulk_purge_read_the_settled_index(tmp_path):
    """O11 (specs/performance.md, "Dispatch indexes"): a query over terminal statuses repeats the settled
    index's predicate, so SQLite serves it from that partial index instead of scanning the table; a
    query that also names a non-terminal status (a forced purge) is left as it was."""
    import sqlalchemy as sa

    from statebook.adapters.db import open_book
    from statebook.outbox.dispatch import admin

    book = await open_book(f"sqlite:///{tmp_path / 'plan.db'}")
    try:
        async def plan(statuses: list[str]) -> str:
            query = admin.settled_query(book, statuses, 1e9)
            sql = str(query.compile(book.engine, compile_kwargs={"literal_binds": True}))
            async with book.read() as conn:
                return " | ".join(str(r[-1]) for r in await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {sql}")))

        for statuses in (["delivered", "acked"], ["dead_letter", "expired"], ["dead_letter"]):
            assert "idx_dispatch_outbox_settled" in await plan(statuses), statuses
        assert admin.settled_only(book, ["pending", "delivered"]) == []
        assert "idx_dispatch_outbox_settled" not in await plan(["pending", "delivered"])
    finally:
        await book.engine.dispose()
