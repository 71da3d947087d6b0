"""The head is the engine's (specs/lifecycle.md L4): a head read or written by the engine is handed back as ``seen``,
and a head that went stale is a conflict, never a write over a row that moved."""

from __future__ import annotations

import sqlalchemy as sa
from conformance.lifecycle.support import RELEASED, STARTED, SYSTEM, new_task, prepare, start, task_registry, tasks

from statebook.adapters.db import connect
from statebook.lifecycle import Book, Command, Head, apply_many, head_columns


async def _book(db_url: str, clock) -> Book:
    engine = connect(db_url)
    await prepare(engine, clock)
    return Book(engine, task_registry(), clock)


def _start(attempt: int) -> Command:
    return Command("task", "t1", "working", STARTED, SYSTEM, ("open",), {"attempt": attempt}, {"attempt": attempt + 1})


async def _read_head(book: Book) -> Head:
    async with book.read() as conn:
        row = (await conn.execute(sa.select(*head_columns(tasks), tasks.c.attempt).where(tasks.c.id == "t1"))).one()
    return Head.of(row._mapping, "attempt")


async def test_a_head_read_before_another_transition_is_a_conflict(db_url, clock):
    book = await _book(db_url, clock)
    try:
        await new_task(book, "t1")
        stale = await _read_head(book)
        await start(book, "t1")  # another claimant moves the row: open -> working, attempt 1
        async with book.begin() as tx:  # ... and back, so status and the guarded attempt look as read
            await apply_many(tx, [Command("task", "t1", "open", RELEASED, SYSTEM, ("working",), {}, {"attempt": 0})])
        [outcome] = await apply_many(book, [_start(0)], seen={"t1": stale})
        assert outcome.conflict and outcome.version is None
        [fresh] = await apply_many(book, [_start(0)], seen={"t1": await _read_head(book)})
        assert fresh.applied and fresh.version == 4
    finally:
        await book.engine.dispose()


async def test_the_head_an_outcome_gives_is_what_the_next_command_compares(db_url, clock):
    book = await _book(db_url, clock)
    try:
        made = await new_task(book, "t1")
        head = made.head(attempt=0)
        assert head is not None and head.status == "open" and head.version == 1 and head["attempt"] == 0
        [moved] = await apply_many(book, [_start(0)], seen={"t1": head})
        assert moved.applied
        assert moved.head(attempt=1) == await _read_head(book)
        [again] = await apply_many(book, [_start(0)], seen={"t1": head})  # the head before that move: stale
        assert again.conflict
    finally:
        await book.engine.dispose()
