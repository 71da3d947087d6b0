"""The scheduler's units: a write transaction and a read connection of its book.

Writers of one process are queued by the storage backend itself (on SQLite, one writer queue per
database, shared with the outbox and the engine), so these are the book's own units.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

from statebook.lifecycle import Book


def writing(book: Book) -> AbstractAsyncContextManager[Book]:
    """A transaction-bound book (joins the bound one)."""
    return book.begin()


def reading(book: Book) -> AbstractAsyncContextManager[Any]:
    """A connection for reads (never takes SQLite's write lock)."""
    return book.read()
