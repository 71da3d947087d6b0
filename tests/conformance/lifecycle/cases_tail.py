"""Conformance cases for the tailing reader (specs/lifecycle.md L13, L13a).

``TailCases`` hold on every backend; ``ConcurrentTailCases`` on backends where many transactions write at once
(PostgreSQL; ``ConcurrentWriterCases`` inherits them). A tail read while honest writers run at once is with
their workload, in cases_concurrency.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statebook.lifecycle import Book, Fact, history, transition
from statebook.lifecycle.facts import Cursor, tail

from .support import REFUSED, RELEASED, SYSTEM, new_task, start

MakeEngine = Callable[[], AsyncEngine]


async def read_tail(book: Book, cursor: Cursor = Cursor(), limit: int = 1000) -> tuple[list[Fact], Cursor]:
    async with book.read() as conn:
        return await tail(conn, cursor, limit=limit)


def ids(facts: list[Fact]) -> list[str]:
    return [f.id for f in facts]


class TailCases:
    """L13: the tailing reader returns every committed fact exactly once, in an order late commits respect."""

    async def test_tail_returns_facts_in_order_after_a_cursor(self, book: Book):
        """L13: tail yields facts after the cursor, oldest first, in pages, and nothing twice."""
        facts, cursor = await read_tail(book)
        assert facts == [] and cursor == Cursor()
        await new_task(book, "t1")
        await start(book, "t1")
        await new_task(book, "t2")
        written = [*await history(book, "task", "t1"), *await history(book, "task", "t2")]
        facts, cursor = await read_tail(book)
        assert ids(facts) == ids(written)
        again, same = await read_tail(book, cursor)
        assert again == [] and same == cursor
        moved = await transition(book, "task", "t2", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        newer, cursor = await read_tail(book, cursor)
        assert ids(newer) == [moved.fact_id]
        paged: list[Fact] = []
        page_cursor = Cursor()
        while True:
            page, page_cursor = await read_tail(book, page_cursor, limit=2)
            if not page:
                break
            assert len(page) <= 2
            paged.extend(page)
        assert ids(paged) == ids(facts) + [moved.fact_id]
        assert page_cursor == cursor

    async def test_fact_committing_during_a_tail_is_not_skipped(self, book: Book, more_engines: MakeEngine):
        """L13: a fact written by a transaction still open when a tail starts is returned once it commits."""
        await new_task(book, "t1")
        seen, cursor = await read_tail(book)
        writer_engine = more_engines()
        async with writer_engine.connect() as conn:
            await conn.begin()
            writer = Book(writer_engine, book.registry, book.clock, conn=conn)
            late = await start(writer, "t1")
            reading = asyncio.create_task(read_tail(book, cursor))
            await asyncio.sleep(0.2)  # let the reader run (or wait) while the writer is open
            await conn.commit()
        first, cursor = await reading
        second, cursor = await read_tail(book, cursor)
        assert ids(first + second) == [late.fact_id]
        assert ids(seen) + [late.fact_id] == ids(await history(book, "task", "t1"))


    async def test_an_entity_moved_several_times_in_one_transaction_comes_out_of_the_tail(self, book: Book):
        """L13a: one transaction moves an entity three times; with nothing written after it, the tail read one fact
        at a time gives all four facts, in version order (no key waits for transaction ids not yet used)."""
        await new_task(book, "t1")
        async with book.begin() as tx:
            moved = [await start(tx, "t1"),
                     await transition(tx, "task", "t1", "open", expected="working", reason=RELEASED, actor=SYSTEM),
                     await start(tx, "t1", attempt=1)]
            assert all(o.applied for o in moved)
        seen: list[Fact] = []
        facts, cursor = await read_tail(book, limit=1)
        while facts:
            seen.extend(facts)
            facts, cursor = await read_tail(book, cursor, limit=1)
        assert [f.version for f in seen] == [1, 2, 3, 4]
        assert ids(seen) == ids(await history(book, "task", "t1"))


class ConcurrentTailCases:
    """L13 / L13a where many transactions write at once (PostgreSQL): their ids are assigned at their first write."""

    async def test_tail_does_not_pass_an_older_open_transaction(self, book: Book, more_engines: MakeEngine):
        """L13: a fact of an older, still-open transaction holds back the tail, even past a newer commit;
        after the older commit both come out, older first."""
        await new_task(book, "t1")
        await new_task(book, "t2")
        _, cursor = await read_tail(book)
        writer_engine = more_engines()
        async with writer_engine.connect() as conn:
            await conn.begin()
            slow = Book(writer_engine, book.registry, book.clock, conn=conn)
            older = await start(slow, "t1")  # its transaction id is assigned now, before the newer one's
            newer = await start(book, "t2")  # commits at once
            held, held_cursor = await read_tail(book, cursor)
            assert held == [] and held_cursor == cursor, "the tail must not move past the open transaction"
            await conn.commit()
        released, cursor = await read_tail(book, cursor)
        assert ids(released) == [older.fact_id, newer.fact_id]
        assert (await read_tail(book, cursor))[0] == []

    async def test_the_tail_gives_an_entitys_facts_in_version_order_whatever_its_writers_ids(
            self, book: Book, more_engines: MakeEngine):
        """L13a: T2 writes a (its transaction id is assigned), T1 — a newer id — writes b and commits, T2 then waits
        for and writes b, and commits. T2's id is below T1's, yet the tail, read one fact at a time, gives b's
        facts in version order (T1's before T2's) and every fact once."""
        await new_task(book, "a")
        await new_task(book, "b")
        early, late = Book(more_engines(), book.registry, book.clock), Book(more_engines(), book.registry, book.clock)
        async with early.begin() as t2:
            assert t2.conn is not None
            await start(t2, "a")
            t2_id = (await t2.conn.execute(sa.text("SELECT pg_current_xact_id()::text::bigint"))).scalar()
            async with late.begin() as t1:
                assert t1.conn is not None
                await start(t1, "b")
                t1_id = (await t1.conn.execute(sa.text("SELECT pg_current_xact_id()::text::bigint"))).scalar()
                waiting = asyncio.create_task(transition(t2, "task", "b", "open", expected="working",
                                                         reason=RELEASED, actor=SYSTEM))
                await asyncio.sleep(0.3)
                assert not waiting.done(), "T2 must wait for T1's row lock on b"
            assert (await waiting).applied
        assert t2_id < t1_id, "the interleaving needs T2's transaction id below T1's"
        seen: list[Fact] = []
        facts, cursor = await read_tail(book, limit=1)
        while facts:
            seen.extend(facts)
            facts, cursor = await read_tail(book, cursor, limit=1)
        assert [f.version for f in seen if f.entity_id == "b"] == [1, 2, 3]
        assert [f.version for f in seen if f.entity_id == "a"] == [1, 2]
        written = [*await history(book, "task", "a"), *await history(book, "task", "b")]
        assert sorted(ids(seen)) == sorted(ids(written))
