"""The head is the engine's (specs/lifecycle.md L4): a head read or written by the engine is handed back as ``seen``,
and a head that went stale is a conflict, never a write over a row that moved."""

from __future__ import annotations

import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
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


def test_no_caller_outside_lifecycle_and_the_storage_backends_names_the_chain_columns():
    """The head is the engine's (issue 27): domain code and the command line hold a ``Head`` or select
    ``head_columns``; only the backends that write the rows, and the schema's migration, spell the columns."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    writers = {"adapters/sqlite.py", "adapters/postgres.py", "adapters/postgres_batches.py",
               "adapters/migrations/versions/0001_initial.py"}
    named = sorted(str(p.relative_to(root)) for part in ("outbox", "scheduler", "adapters") for p in (root / part).rglob("*.py")
                   if str(p.relative_to(root)) not in writers
                   and any(word in p.read_text() for word in ("last_fact_id", "chain_hash")))
    assert named == [], f"these modules spell the engine's chain columns: {named}"


def test_a_head_made_for_speed_is_the_head_the_constructor_makes():
    """``head.filled`` (what ``Head.of`` and ``Outcome.head`` use) fills the instance without the frozen
    ``__init__``: it must still equal, print and refuse writes like ``Head(...)``."""
    import dataclasses

    import pytest

    from statebook.lifecycle.head import filled

    fast = filled(Head, status="open", version=3, fact_id="f3", chain_hash="h3", guarded={"attempt": 2})
    slow = Head("open", 3, "f3", "h3", {"attempt": 2})
    assert fast == slow and repr(fast) == repr(slow) and "h3" not in repr(fast)
    assert fast.guarding(attempt=3) == slow.guarding(attempt=3) != fast
    assert Head.of({"status": "open", "version": 3, "last_fact_id": "f3", "chain_hash": "h3", "attempt": 2},
                   "attempt") == slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.status = "closed"  # type: ignore[misc]


@given(status=st.sampled_from(["open", "working", "done"]),
       expected=st.lists(st.sampled_from(["open", "working", "done"]), min_size=1, max_size=3, unique=True),
       held=st.dictionaries(st.sampled_from(["attempt", "claim_id"]), st.integers(0, 2)),
       guards=st.dictionaries(st.sampled_from(["attempt", "claim_id", "version"]), st.integers(0, 3)))
def test_a_head_matches_a_command_exactly_when_the_row_it_stands_for_does(status, expected, held, guards):
    """``matches`` reads a Head through its attributes (a fast path) and a row through ``[]``: the same
    answer for the same values, a guard on a lifecycle column included."""
    from statebook.lifecycle.plan import matches

    row = {"status": status, "version": 2, "last_fact_id": "f2", "chain_hash": "h2", **held}
    head = Head.of(row, *held)
    command = Command("task", "t1", "working", STARTED, SYSTEM, tuple(expected), guards)
    try:
        by_row: bool | type[KeyError] = matches(command, row)
    except KeyError:
        by_row = KeyError
    try:
        by_head: bool | type[KeyError] = matches(command, head)
    except KeyError:
        by_head = KeyError
    assert by_head == by_row
