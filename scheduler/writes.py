"""One writer at a time on SQLite, queued in-process.

SQLite has a single writer; concurrent ``BEGIN IMMEDIATE`` transactions from one process otherwise
wait in SQLite's busy handler, which sleeps in growing steps (up to 100 ms). Queueing our own writers
on an asyncio lock keeps a burst of fires and finalizations fast. PostgreSQL needs no queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

from statebook.lifecycle import Book

_locks: weakref.WeakKeyDictionary[Any, dict[Any, asyncio.Lock]] = weakref.WeakKeyDictionary()


def _lock(book: Book) -> asyncio.Lock:
    per_loop = _locks.setdefault(book.engine.sync_engine, {})
    loop = asyncio.get_running_loop()
    lock = per_loop.get(loop)
    if lock is None:
        lock = per_loop[loop] = asyncio.Lock()
    return lock


@contextlib.asynccontextmanager
async def writing(book: Book) -> AsyncIterator[Book]:
    """A transaction-bound book; on SQLite the outermost one waits for our other writers first."""
    if book.conn is not None or book.dialect != "sqlite":
        async with book.begin() as tx:
            yield tx
        return
    async with _lock(book), book.begin() as tx:
        yield tx


@contextlib.asynccontextmanager
async def reading(book: Book) -> AsyncIterator[Any]:
    """A connection for reads. On SQLite every transaction is ``BEGIN IMMEDIATE`` (adapters/db.py), so
    a read takes the write lock too: queue it with our writers instead of busy-waiting."""
    if book.conn is not None or book.dialect != "sqlite":
        async with book.read() as conn:
            yield conn
        return
    async with _lock(book), book.read() as conn:
        yield conn
