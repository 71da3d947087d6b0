"""Hot-path statements run on the database driver underneath SQLAlchemy.

SQLAlchemy builds and compiles each statement shape once (``shape``); the engine then runs it on
the driver connection of the SQLAlchemy connection it already holds (asyncpg or aiosqlite),
with the same bind processors SQLAlchemy would apply. Per call this skips SQLAlchemy's
execution context, per-parameter processing and, on SQLite, three of the four thread hand-offs
its async adapter makes per statement — the costs that dominated statebook's CPU per operation
in ``tests/bench``. Transactions stay SQLAlchemy's: a statement run here joins the transaction
of the connection it came from (see :func:`driver`).

Driver errors are re-raised as the SQLAlchemy exceptions the rest of the package (and its
callers) already handle: ``sqlalchemy.exc.IntegrityError``, ``OperationalError``, ``DBAPIError``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

_shapes: dict[tuple[Any, ...], Shape] = {}


@dataclass(frozen=True)
class Shape:
    """A compiled statement: driver SQL, bind names in positional order, their bind processors."""

    sql: str
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    statement: Any  # keeps the statement alive, so the id() in the cache key cannot be reused
    constants: Mapping[str, Any]  # values bound in the statement itself (e.g. a NOTIFY channel)

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        if self.constants:
            params = {**self.constants, **params}
        return [
            params[name] if process is None else process(params[name])
            for name, process in zip(self.names, self.processors)
        ]


def shape(dialect: Dialect, statement: Any) -> Shape:
    """Compile ``statement`` for ``dialect`` once (statements come from :mod:`.statements`' caches)."""
    # The JSON serializer is the one engine setting bind processors depend on (adapters.db sets it).
    key = (id(statement), dialect.name, getattr(dialect, "_json_serializer", None))
    found = _shapes.get(key)
    if found is not None and found.statement is statement:
        return found
    compiled = statement.compile(dialect=dialect)
    names = tuple(compiled.positiontup or ())
    processors = tuple(compiled.binds[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names)
    constants = {n: compiled.binds[n].value for n in names if not compiled.binds[n].required}
    found = _shapes[key] = Shape(compiled.string, names, processors, statement, constants)
    return found


class Driver:
    """The driver connection under one SQLAlchemy connection (asyncpg or aiosqlite)."""

    def __init__(self, dialect: Dialect, raw: Any) -> None:
        self.dialect = dialect
        self.raw = raw
        self.postgresql = dialect.name == "postgresql"

    async def begin(self) -> None:
        """Open a write transaction (``BEGIN IMMEDIATE`` on SQLite: the write lock up front)."""
        try:
            if self.postgresql:
                self._transaction = self.raw.transaction()
                await self._transaction.start()
            else:
                await self.raw.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            raise _translated(exc, "BEGIN") from exc

    async def commit(self) -> None:
        try:
            if self.postgresql:
                await self._transaction.commit()
            else:
                await self.raw.commit()
        except Exception as exc:
            raise _translated(exc, "COMMIT") from exc

    async def rollback(self) -> None:
        if self.postgresql:
            await self._transaction.rollback()
        else:
            await self.raw.rollback()

    def closed(self) -> bool:
        """True when the connection is gone (it must not go back to the pool)."""
        if self.postgresql:
            return bool(self.raw.is_closed())
        return not getattr(self.raw, "_running", True)

    async def fetch(self, statement: Any, params: Mapping[str, Any]) -> list[Sequence[Any]]:
        """Rows of one statement (tuples on SQLite, records on PostgreSQL)."""
        s = shape(self.dialect, statement)
        args = s.args(params)
        try:
            if self.postgresql:
                return await self.raw.fetch(s.sql, *args)
            cursor = await self.raw.execute(s.sql, args)
            return await cursor.fetchall()
        except Exception as exc:
            raise _translated(exc, s.sql) from exc

    async def execute(self, statement: Any, params: Mapping[str, Any]) -> int:
        """Run one statement; the number of rows it inserted, updated or deleted."""
        s = shape(self.dialect, statement)
        args = s.args(params)
        try:
            if self.postgresql:
                status = await self.raw.execute(s.sql, *args)  # e.g. "INSERT 0 1", "UPDATE 3", "SET"
                count = status.rpartition(" ")[2]
                return int(count) if count.isdigit() else 0
            cursor = await self.raw.execute(s.sql, args)
            return cursor.rowcount
        except Exception as exc:
            raise _translated(exc, s.sql) from exc

    async def executemany(self, statement: Any, rows: Iterable[Mapping[str, Any]]) -> None:
        """One statement over many parameter sets (pipelined by asyncpg, one thread hop on SQLite)."""
        s = shape(self.dialect, statement)
        batch = [s.args(row) for row in rows]
        if not batch:
            return
        try:
            await self.raw.executemany(s.sql, batch)
        except Exception as exc:
            raise _translated(exc, s.sql) from exc


async def driver(conn: AsyncConnection) -> Driver:
    """The driver connection under ``conn``, inside ``conn``'s transaction if it has one.

    SQLAlchemy's asyncpg adapter sends BEGIN lazily, with the first statement it runs; a statement
    sent straight to asyncpg before that would run outside the transaction. So when ``conn`` is in
    a transaction the adapter has not begun yet, it is begun here (the adapter's own method, one
    BEGIN). SQLite's BEGIN IMMEDIATE is sent when the transaction opens (``adapters.db``).
    """
    fairy = await conn.get_raw_connection()
    adapted = fairy.dbapi_connection
    if (
        conn.dialect.name == "postgresql"
        and conn.in_transaction()
        and getattr(adapted, "_transaction", False) is None
        and getattr(adapted, "isolation_level", None) != "autocommit"
    ):
        await adapted._start_transaction()
    return Driver(conn.dialect, fairy.driver_connection)


def _translated(exc: Exception, sql: str) -> Exception:
    """The SQLAlchemy exception for a driver error (others pass through unchanged)."""
    if isinstance(exc, sqlite3.IntegrityError):
        return sa.exc.IntegrityError(sql, None, exc)
    if isinstance(exc, sqlite3.OperationalError):
        return sa.exc.OperationalError(sql, None, exc)
    if isinstance(exc, sqlite3.Error):
        return sa.exc.DBAPIError(sql, None, exc)
    module = type(exc).__module__
    if module.startswith("asyncpg"):
        from asyncpg import exceptions as pg  # only on PostgreSQL; asyncpg is the postgres extra

        if isinstance(exc, pg.IntegrityConstraintViolationError):
            return sa.exc.IntegrityError(sql, None, exc)
        if isinstance(exc, pg.PostgresError):
            return sa.exc.DBAPIError(sql, None, exc)
        if isinstance(exc, (pg.InterfaceError, pg.InternalClientError)):  # e.g. the connection was lost
            return sa.exc.OperationalError(sql, None, exc)
    if isinstance(exc, (OSError, ConnectionError)):
        return sa.exc.OperationalError(sql, None, exc)
    return exc
