"""L17: SQLite's writers of one process wait in ONE queue per database file — shared by every engine on the
file, whatever path or link names it — and a writer that cannot get its turn fails like SQLite's own lock
would (StorageUnavailable), never hangs."""

from __future__ import annotations

import asyncio
import os

import pytest

import statebook.adapters.sqlite as sqlite_backend
from statebook.adapters.db import open_book
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import FakeClock
from statebook.lifecycle.errors import StorageUnavailable
from statebook.outbox import enqueue_dispatch


@pytest.fixture
async def two_books(tmp_path):
    path = tmp_path / "one.db"
    first = await open_book(f"sqlite:///{path}", clock=FakeClock())
    os.symlink(path, tmp_path / "link.db")
    second = await open_book(f"sqlite:///{tmp_path / 'link.db'}", registry=builtin_registry(), clock=FakeClock())
    try:
        yield first, second
    finally:
        await first.engine.dispose()
        await second.engine.dispose()


async def test_every_engine_on_a_file_shares_its_writer_queue(two_books):
    """L17: two engines on one file (one through a symlink) get the same queue; another file gets its own."""
    first, second = two_books
    assert first.store is not second.store
    assert first.store.writer() is second.store.writer()


async def test_a_writer_of_another_engine_waits_in_the_queue_not_in_the_busy_handler(two_books):
    """L17: while one engine's transaction holds the file, a write through another engine waits for its turn
    (here: until the first commits) and then applies."""
    first, second = two_books
    async with first.begin() as tx:
        await enqueue_dispatch(tx, kind="k", deliver_to="a")
        waiting = asyncio.create_task(enqueue_dispatch(second, kind="k", deliver_to="b"))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "the second writer must wait for the first to commit"
    assert len(await waiting) == 32


async def test_a_writer_that_never_gets_its_turn_fails_as_on_a_locked_database(two_books, monkeypatch):
    """L18: a turn not given within the busy timeout is StorageUnavailable (nothing written), as SQLite's own
    'database is locked' would be — not a hang."""
    first, second = two_books
    monkeypatch.setattr(sqlite_backend, "WAIT_SECONDS", 0.2)
    async with first.begin() as tx:
        await enqueue_dispatch(tx, kind="k", deliver_to="a")
        other = asyncio.create_task(enqueue_dispatch(second, kind="k", deliver_to="b"))  # another writer
        with pytest.raises(StorageUnavailable, match="locked by another writer of this process"):
            await other


async def test_a_pooled_connection_left_inside_a_transaction_is_discarded(tmp_path):
    """L5 / L17: a connection that went back to the pool inside a transaction (a task cancelled while its BEGIN
    still ran in aiosqlite's thread) is not handed out again: the next unit gets another connection, and the
    stale one is closed, so the write lock it held is released — the next write applies instead of failing
    with 'cannot start a transaction within a transaction' or 'database is locked'."""
    book = await open_book(f"sqlite:///{tmp_path / 'left.db'}", clock=FakeClock())
    try:
        fairy = await book.engine.raw_connection()
        await fairy.driver_connection.execute("BEGIN IMMEDIATE")  # the write lock, never committed
        fairy.close()  # back to the pool, still inside the transaction (SQLite engines skip the reset)
        assert len(await enqueue_dispatch(book, kind="k", deliver_to="a")) == 32
        async with book.begin() as tx:
            assert len(await enqueue_dispatch(tx, kind="k", deliver_to="b")) == 32
    finally:
        await book.engine.dispose()


async def test_a_task_that_left_the_queue_waits_its_turn_like_any_other():
    """L17: the queue is released on leave(): a task that left and enters again waits behind the writer that was
    waiting meanwhile, instead of passing as if it still held it. While it holds the queue, entering again (a
    nested unit) passes at once and leaving that changes nothing."""
    queue = sqlite_backend._WriterQueue("queue.db")
    assert await queue.enter() is True
    assert await queue.enter() is False, "a nested entry by the holder passes (and its leave is a no-op)"
    queue.leave(False)
    held: list[str] = []

    async def other() -> None:
        entered = await queue.enter()
        held.append("other")
        await asyncio.sleep(0.05)
        held.remove("other")
        queue.leave(entered)

    waiting = asyncio.create_task(other())
    await asyncio.sleep(0.01)
    assert not waiting.done() and held == [], "the other writer waits while this task holds the queue"
    queue.leave(True)
    again = await queue.enter()  # this task again: behind the other writer, which was waiting first
    assert again is True, "leave() must release: entering again is a turn of its own"
    assert waiting.done() and held == [], "the other writer had its whole turn first"
    queue.leave(again)
    await waiting


async def test_a_writer_that_leaves_and_writes_again_queues_behind_the_one_waiting(tmp_path):
    """L17: through the store, two tasks on one file: while the first task's unit runs, the second asks for a
    unit; the first task's next unit runs after the second's, not in between."""
    book = await open_book(f"sqlite:///{tmp_path / 'turns.db'}", clock=FakeClock())
    store = book.store
    order: list[str] = []

    async def unit(name: str) -> None:
        async with store.unit(None):
            order.append(f"{name} begins")
            await asyncio.sleep(0.05)
            order.append(f"{name} ends")

    async def first() -> None:
        async with store.unit(None):
            order.append("first begins")
            second.append(asyncio.create_task(unit("second")))
            await asyncio.sleep(0.05)  # the second task now waits in the queue
            order.append("first ends")
        await unit("first again")

    second: list[asyncio.Task[None]] = []
    try:
        await first()
        await second[0]
        assert order == ["first begins", "first ends", "second begins", "second ends", "first again begins",
                         "first again ends"]
    finally:
        await book.engine.dispose()
