"""What both storage backends share: compiled statement shapes run on the driver, units of work,
and the translation of driver errors into statebook's own.

A backend (:mod:`.sqlite`, :mod:`.postgres`) subclasses :class:`SQLStore`, which implements the
three protocols of ``statebook.lifecycle.store`` (``Store``, ``Reads``, ``Upkeep``), and supplies the
statements that differ by dialect (and its SQL for ``queries.ids_in``); every case of ``tests/conformance``
runs against both.

Statements are SQLAlchemy Core, compiled once per store (``shape``) and run on the driver
connection (aiosqlite or asyncpg) with SQLAlchemy's own bind processors: per call this skips
SQLAlchemy's execution context, which dominated statebook's CPU per operation (specs/performance.md).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from statebook.lifecycle.book import TOUCHED
from statebook.lifecycle.errors import ConstraintViolation, StorageError, StorageUnavailable
from statebook.lifecycle.facts import HASHED_FIELDS, Cursor, facts_table, stored_columns
from statebook.lifecycle.queries import ids_in, lock_rows
from statebook.lifecycle.store import Lock, Unit

FACT_COLUMNS: tuple[str, ...] = (*HASHED_FIELDS, "prev_hash", "hash")
OWN_TRANSACTION = "statebook.own_transaction"
"""``conn.info`` key: this connection's transaction was begun by the store (``SQLStore.begin``)."""


@dataclass(frozen=True)
class Shape:
    """A compiled statement: driver SQL, bind names in positional order, their bind processors."""

    sql: str
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    constants: Mapping[str, Any]  # values bound in the statement itself (e.g. a NOTIFY channel)

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional driver arguments for ``params``, in the statement's order, each through its bind
        processor.
        """
        if self.constants:
            params = {**self.constants, **params}
        return [
            params[name] if process is None else process(params[name])
            for name, process in zip(self.names, self.processors)
        ]


class Driver:
    """A driver connection (aiosqlite or asyncpg) running compiled shapes; errors become ours."""

    def __init__(self, store: SQLStore, raw: Any) -> None:
        self.store = store
        self.raw = raw

    async def fetch(self, statement: Any, params: Mapping[str, Any]) -> list[Sequence[Any]]:
        """Run a compiled statement and return its rows; driver errors become statebook's storage errors."""
        s = self.store.shape(statement)
        try:
            return await self.store.driver_fetch(self.raw, s.sql, s.args(params))
        except Exception as exc:
            raise translated(exc, s.sql) from exc

    async def execute(self, statement: Any, params: Mapping[str, Any]) -> int:
        """Run one statement; the number of rows it inserted, updated or deleted."""
        s = self.store.shape(statement)
        try:
            return await self.store.driver_execute(self.raw, s.sql, s.args(params))
        except Exception as exc:
            raise translated(exc, s.sql) from exc

    async def executemany(self, statement: Any, rows: Iterable[Mapping[str, Any]]) -> None:
        """Run a compiled statement once per row of parameters (nothing for none); driver errors become storage
        errors.
        """
        s = self.store.shape(statement)
        batch = [s.args(row) for row in rows]
        if not batch:
            return
        try:
            await self.raw.executemany(s.sql, batch)
        except Exception as exc:
            raise translated(exc, s.sql) from exc

    async def run(self, sql: str) -> None:
        """Run a plain SQL string (BEGIN, COMMIT, ...); driver errors become storage errors."""
        try:
            await self.raw.execute(sql)
        except Exception as exc:
            raise translated(exc, sql) from exc


class SQLStore:
    """The statements both dialects share; a backend overrides what differs (see the subclasses)."""

    dialect = "?"

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._shapes: dict[int, tuple[Any, Shape]] = {}
        self._statements: dict[Any, Any] = {}

    # -- compiled shapes ---------------------------------------------------------------------------
    def shape(self, statement: Any) -> Shape:
        """``statement`` compiled for this store's engine, once (statements come from ``cached``)."""
        found = self._shapes.get(id(statement))
        if found is not None and found[0] is statement:
            return found[1]
        dialect = self.engine.dialect
        compiled = statement.compile(dialect=dialect)
        names = tuple(compiled.positiontup or ())
        processors = tuple(compiled.binds[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names)
        constants = {n: compiled.binds[n].value for n in names if not compiled.binds[n].required}
        made = Shape(compiled.string, names, processors, constants)
        self._shapes[id(statement)] = (statement, made)  # the statement is kept, so its id stays unique
        return made

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """The statement cached under ``key``, built with ``build()`` the first time."""
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = build()
        return found

    # -- driver calls (a backend's driver API) -----------------------------------------------------
    async def driver_fetch(self, raw: Any, sql: str, args: list[Any]) -> list[Sequence[Any]]:
        """Run ``sql`` with positional ``args`` on the raw driver connection and return its rows (per backend)."""
        raise NotImplementedError

    async def driver_execute(self, raw: Any, sql: str, args: list[Any]) -> int:
        """Run ``sql`` with positional ``args`` on the raw driver connection and return the count of rows it changed
        (per backend).
        """
        raise NotImplementedError

    # -- units of work -----------------------------------------------------------------------------
    def unit(self, bound: AsyncConnection | None, *, one_statement: bool = False) -> Any:
        """The bound transaction's unit, or one of the store's own (see ``own_unit``)."""
        return self.own_unit(one_statement) if bound is None else self._joined(bound)

    @asynccontextmanager
    async def _joined(self, bound: AsyncConnection) -> AsyncIterator[Unit]:
        work = Unit(Driver(self, await self.joined(bound)))
        yield work
        touched = bound.info.get(TOUCHED)
        if touched is not None:
            touched.update(work.wrote)

    def own_unit(self, one_statement: bool) -> Any:
        """An async context manager for a unit of work of the store's own (per backend); ``one_statement`` lets a
        backend skip the transaction.
        """
        raise NotImplementedError

    @asynccontextmanager
    async def reader(self, bound: AsyncConnection | None) -> AsyncIterator[Unit]:
        """One SELECT needs no transaction: a pooled connection outside any reads one snapshot."""
        if bound is not None:
            yield Unit(Driver(self, await self.joined(bound)))
            return
        fairy = await self.engine.raw_connection()
        try:
            yield Unit(Driver(self, fairy.driver_connection))
        except BaseException as exc:
            if not isinstance(exc, Exception) or self.closed(fairy.driver_connection):
                fairy.invalidate()
            raise
        finally:
            await self.release(fairy)

    async def joined(self, conn: AsyncConnection) -> Any:
        """The driver connection under ``conn``, inside ``conn``'s transaction."""
        raise NotImplementedError

    def begin(self) -> Any:
        """An async context manager yielding a SQLAlchemy connection inside a write transaction (per backend)."""
        raise NotImplementedError

    async def release(self, fairy: Any) -> None:
        """Give a raw pooled connection back to the pool."""
        fairy.close()

    def closed(self, raw: Any) -> bool:
        """True when the raw driver connection is closed (per backend)."""
        raise NotImplementedError

    @asynccontextmanager
    async def transaction_on(self, fairy: Any, begin: str) -> AsyncIterator[Unit]:
        """BEGIN, the unit's statements, COMMIT on a bare pooled connection; any exception rolls back."""
        db = Driver(self, fairy.driver_connection)
        work = Unit(db)
        broken = False
        try:
            await self.driver_begin(db, begin)
            try:
                yield work
            except BaseException:
                try:
                    await self.driver_end(db, commit=False)
                except BaseException:
                    broken = True
                raise
            await self.driver_end(db, commit=True)
        except BaseException as exc:
            broken = broken or not isinstance(exc, Exception) or self.closed(db.raw)
            raise
        finally:
            if broken:
                fairy.invalidate()
            await self.release(fairy)

    async def driver_begin(self, db: Driver, begin: str) -> None:
        """Open a transaction on the driver connection with the backend's ``begin`` statement."""
        await db.run(begin)

    async def driver_end(self, db: Driver, *, commit: bool) -> None:
        """Commit (``commit=True``) or roll back the driver connection's transaction."""
        await db.run("COMMIT" if commit else "ROLLBACK")

    # -- the write port (lifecycle.store.Store) -----------------------------------------------------
    async def histories(self, unit: Unit, entity_type: str, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` that have facts of ``entity_type`` (a purged history keeps its id taken)."""
        if not ids:
            return set()
        t = facts_table
        stmt = self.cached(("histories",), lambda: sa.select(t.c.entity_id).distinct().where(
            t.c.entity_type == sa.bindparam("b_type"), ids_in(t.c.entity_id, "b_ids")))
        found = await unit.handle.fetch(stmt, {"b_type": entity_type, "b_ids": ids})
        return {r[0] for r in found}

    async def rows(self, unit: Unit, table: sa.Table, columns: Sequence[str], ids: Sequence[str], *,
                   lock: Lock = None) -> list[dict[str, Any]]:
        """The rows of ``table`` with the given ids, as dicts of ``columns``, locked as ``lock`` says."""
        names = tuple(columns)
        stmt = self.cached(("rows", table, names, lock), lambda: lock_rows(
            sa.select(*(table.c[c] for c in names)).where(ids_in(table.c.id, "b_ids")), lock))
        return [dict(zip(names, r)) for r in await unit.handle.fetch(stmt, {"b_ids": ids})]

    async def facts_by_key(self, unit: Unit, entity_type: str, keys: Sequence[tuple[str, str]]
                           ) -> dict[tuple[str, str], dict[str, Any]]:
        """The facts recorded under each (entity id, idempotency key) of ``keys``, for idempotent replay."""
        t = facts_table
        stmt = self.cached(("fact_by_key",), lambda: sa.select(
            t.c.entity_id, t.c.idempotency_key, t.c.id, t.c.status, t.c.version, t.c.command_digest).where(
            t.c.entity_type == sa.bindparam("b_type"), t.c.entity_id == sa.bindparam("b_id"),
            t.c.idempotency_key == sa.bindparam("b_key")))
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for entity_id, key in keys:
            for r in await unit.handle.fetch(stmt, {"b_type": entity_type, "b_id": entity_id, "b_key": key}):
                found[(entity_id, key)] = {"id": r[2], "status": r[3], "version": r[4], "command_digest": r[5]}
        return found

    async def select(self, unit: Unit, query: sa.Select[Any], params: Mapping[str, Any] | None = None, *,
                     lock: Lock = None) -> list[dict[str, Any]]:
        """Run an arbitrary select in the unit of work and return its rows as dicts, locked as ``lock`` says."""
        stmt = self.cached(("select", id(query), lock), lambda: (query, lock_rows(query, lock)))[1]
        names = [str(c.key) for c in query.selected_columns]  # every selected column of a statebook query is named
        return [dict(zip(names, r)) for r in await unit.handle.fetch(stmt, params or {})]

    # -- upkeep (lifecycle.store.Upkeep) and the reads' tail ---------------------------------------
    async def notify(self, unit: Unit | None, channel: str, payload: str) -> None:
        """Signal ``channel`` with ``payload`` to listeners on other connections (a no-op where the backend has no
        signal).
        """
        return None

    def tail_query(self, cursor: Cursor, limit: int) -> sa.Select[Any]:
        """The query for up to ``limit`` facts after ``cursor``, in commit order."""
        t = facts_table
        return sa.select(*stored_columns(t)).where(t.c.seq > cursor.seq).order_by(t.c.seq).limit(limit)

    async def maintain(self) -> None:
        """Periodic backend housekeeping (a no-op unless the backend needs some)."""
        return None

    async def settle(self, timeout: float) -> None:
        """Nothing to wait for where writers draw seqs in commit order (one writer at a time)."""
        return None

    # -- verify's and audit's reads (lifecycle.store.Reads) -----------------------------------------
    @asynccontextmanager
    async def snapshot(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """An async context manager opening ``conn``'s transaction so every read inside it sees one snapshot."""
        async with conn.begin():
            yield

    @asynccontextmanager
    async def lenient(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """An async context manager for reads that may meet undecodable stored values (a no-op unless the backend
        needs it).
        """
        yield

    def undecodable(self, exc: BaseException) -> bool:
        """True when ``exc`` means a stored value could not be decoded (damaged data), not a failed query."""
        return False

    async def batches(self, conn: AsyncConnection, query: sa.Select[Any], size: int
                      ) -> AsyncGenerator[Sequence[Sequence[Any]], None]:
        """Through a server-side cursor of SQLAlchemy's."""
        result = await conn.stream(query.execution_options(yield_per=size))
        async for part in result.partitions(size):
            yield [tuple(r) for r in part]

    def in_id_order(self, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        """``column`` as an ordering expression that sorts ids the same way on every backend."""
        return column

    def file_screen(self, bound: AsyncConnection | None) -> Any:
        """A helper that screens a database file in other processes for verify, or None when the backend has none.
        """
        return None

    # -- shared statements -------------------------------------------------------------------------
    def insert_fact(self) -> Any:
        """INSERT one fact; parameters named after ``FACT_COLUMNS``, JSON fields as their stored text."""
        return self.cached(("insert_fact",), lambda: sa.insert(facts_table).values(
            {c: self.fact_value(c, c) for c in FACT_COLUMNS}))

    def fact_value(self, column: str, name: str) -> Any:
        """The bind parameter ``name`` for the facts table's ``column``, JSON columns bound as text."""
        c = facts_table.c[column]
        if isinstance(c.type, sa.JSON):
            return self.json_text(sa.bindparam(name, type_=sa.Text))
        return sa.bindparam(name, type_=c.type)

    def json_text(self, bind: Any) -> Any:
        """JSON given as its (canonical) text, so it is not serialised twice."""
        return bind


def translated(exc: Exception, sql: str) -> Exception:
    """statebook's error for a driver error (others pass through unchanged)."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, sqlite3.IntegrityError):
        return ConstraintViolation(str(exc), orig=exc, unique="UNIQUE constraint failed" in str(exc))
    if isinstance(exc, sqlite3.OperationalError):
        return StorageUnavailable(f"SQLite: {exc}", orig=exc)
    if isinstance(exc, sqlite3.Error):
        return StorageError(f"SQLite: {exc}", orig=exc)
    if type(exc).__module__.startswith("asyncpg"):
        from asyncpg import exceptions as pg  # only on PostgreSQL; asyncpg is the postgres extra

        if isinstance(exc, pg.IntegrityConstraintViolationError):
            return ConstraintViolation(str(exc), orig=exc, unique=getattr(exc, "sqlstate", None) == "23505")
        if isinstance(exc, (pg.InterfaceError, pg.InternalClientError, pg.PostgresConnectionError,
                            pg.CannotConnectNowError)):
            return StorageUnavailable(f"PostgreSQL: {exc}", orig=exc)
        if isinstance(exc, pg.PostgresError):
            return StorageError(f"PostgreSQL: {exc}", orig=exc)
    if isinstance(exc, (OSError, ConnectionError)):
        return StorageUnavailable(f"database connection: {exc}", orig=exc)
    return exc
