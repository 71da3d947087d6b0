"""What every conformance class shares: a Book per test on one backend, emptied around each test.

A part's class runs its cases on a backend by inheriting the backend's base and the part's cases::

    class TestOutboxSQLite(SQLiteBackend, OutboxConformance):
        pass

Every case gets ``book``: a Book over a prepared, empty database whose registry holds the built-in
lifecycles plus the suite's ``task`` lifecycle (lifecycle/support.py), on a FakeClock. Cases that
need more connections call ``more_engines()``; those engines are disposed after the test. A case may ask
for ``backend`` (the backend's name) and ``db_url``.

A new backend provides ``db_url`` and ``backend`` the way SQLiteBackend does, and one class per part.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statebook.adapters.db import connect, create_schema, reset_schema
from statebook.lifecycle import Book, Clock, FakeClock, Registry
from statebook.lifecycle.testing.cases import StorageFixtures

from .lifecycle.support import task_registry, tasks

__all__ = ["ConformanceFixtures", "PostgresBackend", "SQLiteBackend"]

POOL_SIZE = 25
"""Room for the racing cases: every racer holds its own connection."""


class ConformanceFixtures(StorageFixtures):
    """The kit's fixtures (statebook.lifecycle.testing.cases) on our fixture ``db_url``, with the built-ins in
    the registry, every statebook table emptied around each test, and ``rival``/``more_engines`` for the
    outbox's and scheduler's cases."""

    @pytest.fixture(autouse=True)
    def _url(self, db_url: str) -> None:
        self.db_url = db_url

    async def make_book(self, registry: Registry, clock: Clock) -> Book:
        engine = connect(self.db_url, pool_size=POOL_SIZE)
        try:
            await create_schema(engine, clock, registry=registry)  # the task table's CHECK from its lifecycle
        except BaseException:
            await engine.dispose()
            raise
        return Book(engine, registry, clock)

    def conformance_registry(self) -> Registry:
        return task_registry()

    async def empty_book(self, book: Book) -> None:
        # A shared PostgreSQL database outlives the test: leave no task rows or facts behind.
        await reset_schema(book.engine)
        async with book.engine.begin() as conn:
            await conn.execute(sa.delete(tasks))

    @pytest.fixture
    async def rival(self, book: Book, db_url: str, clock: FakeClock) -> AsyncIterator[Book]:
        """A second Book on the same database: its own engine, its own connections (another daemon)."""
        other = Book(connect(db_url), book.registry, clock)
        try:
            yield other
        finally:
            await other.engine.dispose()

    @pytest.fixture
    async def more_engines(self, db_url: str) -> AsyncIterator[Callable[[], AsyncEngine]]:
        made: list[AsyncEngine] = []

        def make() -> AsyncEngine:
            engine = connect(db_url, pool_size=POOL_SIZE)
            made.append(engine)
            return engine

        yield make
        for engine in made:
            await engine.dispose()


class SQLiteBackend(ConformanceFixtures):
    """L15: SQLite, a fresh database file per test."""

    @pytest.fixture
    def db_url(self, tmp_path) -> str:
        return f"sqlite:///{tmp_path / 'conformance.db'}"

    @pytest.fixture
    def backend(self) -> str:
        return "sqlite"


class PostgresBackend(ConformanceFixtures):
    """L15: PostgreSQL, the throwaway cluster (tests/conftest.py, ``pg_url``), emptied per test. A class on it
    is marked ``postgres`` too, so a run with ``STATEBOOK_REQUIRE_PG=1`` fails rather than skips it."""

    @pytest.fixture
    def db_url(self, pg_url: str) -> str:
        return pg_url

    @pytest.fixture
    def backend(self) -> str:
        return "postgres"
