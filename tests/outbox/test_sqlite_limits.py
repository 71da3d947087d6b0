"""SQLite at its limits: a writer blocked by another connection's lock, and a full database.

SQLite only: both situations are specific to its single-writer file locking and page allocation.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect, open_book
from statebook.lifecycle import Book, FakeClock, history, verify
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.replay import read_row
from statebook.outbox import dispatch_outbox, enqueue_dispatch
from statebook.outbox.dispatch.attempts import scan
from statebook.outbox.dispatch.steps import claim

HOLD_SECONDS = 1.0


@pytest.fixture
async def sqlite_book(tmp_path):
    path = tmp_path / "limits.db"
    clock = FakeClock()
    book = await open_book(f"sqlite:///{path}", clock=clock)
    try:
        yield book, path
    finally:
        await book.engine.dispose()


class Blocker(threading.Thread):
    """Holds ``BEGIN IMMEDIATE`` on a raw sqlite3 connection, writes a row of its own, commits."""

    def __init__(self, path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.locked = threading.Event()
        self.release = threading.Event()
        self.committed = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            conn.execute("CREATE TABLE IF NOT EXISTS blocker_marks (n INTEGER)")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO blocker_marks VALUES (1)")
            self.locked.set()
            self.release.wait(HOLD_SECONDS)
            self.committed = True  # set before COMMIT: a waiter that finishes must see it
            conn.execute("COMMIT")
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            self.error = exc
            self.locked.set()


async def test_writer_waits_for_a_held_write_lock_and_loses_nothing(sqlite_book):
    """O2, O7 (O-atomic), L5: while another connection holds BEGIN IMMEDIATE for about a second, an enqueue
    and a claim wait for it (busy timeout, not an immediate "database is locked"), then both
    commit; the other connection's write and both of ours are all there, and the history verifies."""
    book, path = sqlite_book
    now = book.clock.now()
    first = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
    [candidate] = await scan(book, now=now)

    blocker = Blocker(path)
    blocker.start()
    await asyncio.to_thread(blocker.locked.wait, 10)
    assert blocker.error is None, blocker.error

    async def enqueue_then_check() -> str:
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-2", dedup_key="blocked")
        assert blocker.committed, "the enqueue finished while the other connection still held the lock"
        return did

    async def claim_then_check():
        lease = await claim(book, candidate, now=now)
        assert blocker.committed, "the claim finished while the other connection still held the lock"
        return lease

    second, lease = await asyncio.gather(enqueue_then_check(), claim_then_check())
    await asyncio.to_thread(blocker.join, 10)
    assert blocker.error is None, blocker.error

    assert lease is not None and lease.dispatch_id == first and lease.attempt == 1
    row = await read_row(book, "dispatch", first)
    assert row["status"] == "delivering" and row["attempt"] == 1
    assert [f.status for f in await history(book, "dispatch", second)] == ["pending"]
    async with book.read() as conn:
        marks = (await conn.exec_driver_sql("SELECT count(*) FROM blocker_marks")).scalar_one()
    assert marks == 1
    assert (await verify(book, "dispatch")).ok


async def test_full_database_refuses_the_enqueue_and_leaves_no_partial_row(sqlite_book):
    """O2, O7 (O-atomic), L5: when SQLite cannot allocate another page, enqueue raises (the driver's
    "database or disk is full", wrapped or not) and writes nothing: every dispatch row has its
    creation fact, no fact lacks its row, and verify is clean afterwards."""
    book, path = sqlite_book
    async with book.read() as conn:
        pages = (await conn.exec_driver_sql("PRAGMA page_count")).scalar_one()

    limited_engine = connect(f"sqlite:///{path}")

    @sa.event.listens_for(limited_engine.sync_engine, "connect")
    def _cap(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA max_page_count = {pages + 12}")
        cursor.close()

    limited = Book(limited_engine, book.registry, book.clock)
    enqueued: list[str] = []
    try:
        with pytest.raises(Exception) as caught:
            for n in range(200):
                body = {"n": n, "blob": "x" * 6000}
                enqueued.append(await enqueue_dispatch(limited, kind="bulky", deliver_to="seat-1", body=body))
        text = str(caught.value).lower() + " ".join(
            str(e).lower() for e in (caught.value.__cause__, caught.value.__context__) if e
        )
        assert "full" in text, f"expected a 'database or disk is full' error, got {caught.value!r}"
        assert enqueued, "the cap was so low that not even one dispatch fitted; raise the margin"
    finally:
        await limited_engine.dispose()

    t = dispatch_outbox
    async with book.read() as conn:
        ids = {r.id for r in (await conn.execute(sa.select(t.c.id))).fetchall()}
        created = {
            r.entity_id
            for r in (
                await conn.execute(
                    sa.select(facts_table.c.entity_id).where(
                        facts_table.c.entity_type == "dispatch", facts_table.c.previous_status.is_(None)
                    )
                )
            ).fetchall()
        }
    assert ids == set(enqueued)
    assert created == ids
    assert (await verify(book)).ok

    # The database still works once space is available again.
    did = await enqueue_dispatch(book, kind="small", deliver_to="seat-1")
    assert (await read_row(book, "dispatch", did))["status"] == "pending"
    assert (await verify(book)).ok
