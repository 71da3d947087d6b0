"""The SQLite storage backend (aiosqlite): one writer, queued in-process.

SQLite has a single writer. Every write unit of the process — the engine's own, ``Book.begin``,
the scheduler's, the delivery worker's — first takes the writer queue of its database file (one per
file per event loop, shared by every engine on it), then ``BEGIN IMMEDIATE``: writers of one process wait in line instead of in
SQLite's busy handler, which sleeps in growing steps (up to 100 ms). Another process still meets
the busy timeout (``adapters.db``). Because the writer is exclusive, rows read in a write unit
cannot change before its statements run: no row locks exist or are needed.

``verify`` reads a database file on connections of its own (:class:`SQLiteFile`, the reader in
:mod:`.sqlite_screen`): in a thread here and in worker processes.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.util import greenlet_spawn

from statebook.lifecycle.codec import dumps
from statebook.lifecycle.errors import StorageUnavailable
from statebook.lifecycle.queries import IdsIn
from statebook.lifecycle.store import RowWrite, Unit, register_backend

from . import sqlite_screen
from .persistence import SQLStore, translated

BUSY_TIMEOUT_MS = 5000
"""SQLite's busy timeout on every connection statebook opens (``adapters.db``)."""


class SQLiteStore(SQLStore):
    """The SQLite storage backend on aiosqlite: one writer at a time in this process, JSON list parameters, verify
    screened in other processes.
    """

    dialect = "sqlite"

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self._database: str | None = None

    # -- driver --------------------------------------------------------------------------------------
    async def driver_fetch(self, raw: Any, sql: str, args: list[Any]) -> list[Any]:
        # One hop to aiosqlite's thread for the statement and its rows (execute, then fetchall, is two).
        return list(await raw.execute_fetchall(sql, args))

    async def driver_execute(self, raw: Any, sql: str, args: list[Any]) -> int:
        cursor = await raw.execute(sql, args)
        count: int = cursor.rowcount
        return count

    def closed(self, raw: Any) -> bool:
        try:
            raw.in_transaction  # noqa: B018 - raises once the connection is closed
        except Exception:  # noqa: BLE001
            return True
        return False

    async def release(self, fairy: Any) -> None:
        await greenlet_spawn(fairy.close)  # the pool's bookkeeping runs in SQLAlchemy's greenlet

    # -- units ---------------------------------------------------------------------------------------
    def writer(self) -> _WriterQueue:
        """This process's queue of writers on the database file, shared by every engine (and so every
        part) of this event loop that opens the same file, whatever path or link names it."""
        if self._database is None:
            name = self.engine.url.database or ""
            self._database = os.path.realpath(name) if name and name != ":memory:" else name
        per_loop = _QUEUES.setdefault(asyncio.get_running_loop(), {})
        queue = per_loop.get(self._database)
        if queue is None:
            queue = per_loop[self._database] = _WriterQueue(self._database)
        return queue

    @asynccontextmanager
    async def own_unit(self, one_statement: bool) -> AsyncIterator[Unit]:
        queue = self.writer()
        entered = await queue.enter()
        try:
            fairy = await self.engine.raw_connection()
            async with self.transaction_on(fairy, "BEGIN IMMEDIATE") as work:
                yield work
        finally:
            queue.leave(entered)

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        # adapters.db's "begin" listener sends BEGIN IMMEDIATE when the transaction opens.
        async with self.writer().turn(), self.engine.connect() as conn:
            try:
                async with conn.begin():
                    yield conn
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    # Cancelled: a BEGIN or ROLLBACK may still run in aiosqlite's thread after this task
                    # has gone on; a connection in that state must not go back to the pool.
                    await conn.invalidate()
                raise

    async def joined(self, conn: AsyncConnection) -> Any:
        return (await conn.get_raw_connection()).driver_connection

    # -- statements ----------------------------------------------------------------------------------
    async def insert(self, unit: Unit, table: sa.Table, writes: Sequence[RowWrite], *, if_absent: bool,
                     notify: str | None = None) -> set[str]:
        """Insert each row and its creation fact; return the ids written (``if_absent``: rows that hit a unique
        constraint are skipped).
        """
        if not writes:
            return set()
        db = unit.handle
        columns = tuple(writes[0].values)
        stmt = self.cached(("insert", table, columns, if_absent), lambda: _insert(table, columns, if_absent))
        before = db.raw.total_changes
        await db.executemany(stmt, [w.values for w in writes])
        if if_absent and db.raw.total_changes - before != len(writes):  # some rows were skipped
            ids = await self._heads_are(unit, table, writes)
        else:
            ids = {w.entity_id for w in writes}
        await db.executemany(self.insert_fact(), [w.fact for w in writes if w.entity_id in ids])
        return ids

    async def update(self, unit: Unit, table: sa.Table, writes: Sequence[RowWrite]) -> set[str]:
        """executemany reports only a total: when it falls short, the rows whose head is now this
        batch's fact are the ones updated (the writer is ours, so nothing else moved them)."""
        if not writes:
            return set()
        db = unit.handle
        guards, columns = writes[0].guards, tuple(writes[0].values)
        stmt = self.cached(("update", table, guards, columns), lambda: _update(table, guards, columns))
        before = db.raw.total_changes
        await db.executemany(stmt, [_update_params(w) for w in writes])
        if db.raw.total_changes - before == len(writes):
            ids = {w.entity_id for w in writes}
        else:
            ids = await self._heads_are(unit, table, writes)
        await db.executemany(self.insert_fact(), [w.fact for w in writes if w.entity_id in ids])
        return ids

    async def delete(self, unit: Unit, table: sa.Table, writes: Sequence[RowWrite]) -> set[str]:
        """Delete each row whose version and last fact still match, with its tombstone fact; return the ids deleted.
        """
        if not writes:
            return set()
        db = unit.handle
        stmt = self.cached(("delete", table), lambda: sa.delete(table).where(
            table.c.id == sa.bindparam("b_id"), table.c.version == sa.bindparam("b_version"),
            table.c.last_fact_id == sa.bindparam("b_last_fact_id")))
        before = db.raw.total_changes
        await db.executemany(stmt, [{"b_id": w.entity_id, "b_version": w.expect["version"],
                                     "b_last_fact_id": w.expect["last_fact_id"]} for w in writes])
        ids = {w.entity_id for w in writes}
        if db.raw.total_changes - before != len(writes):
            ids -= {r["id"] for r in await self.rows(unit, table, ("id",), sorted(ids))}
        await db.executemany(self.insert_fact(), [w.fact for w in writes if w.entity_id in ids])
        return ids

    async def _heads_are(self, unit: Unit, table: sa.Table, writes: Sequence[RowWrite]) -> set[str]:
        """The ids whose row now projects the fact planned for it: exactly the rows the batch wrote."""
        heads = await self.rows(unit, table, ("id", "last_fact_id"), [w.entity_id for w in writes])
        head_of = {r["id"]: r["last_fact_id"] for r in heads}
        return {w.entity_id for w in writes if head_of.get(w.entity_id) == w.fact["id"]}

    async def maintain(self) -> None:
        """Checkpoint and truncate the WAL (outside any transaction)."""
        fairy = await self.engine.raw_connection()
        try:
            await _driver(fairy).execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            await self.release(fairy)


    # -- verify's reads ------------------------------------------------------------------------------
    @asynccontextmanager
    async def lenient(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """The connection's own text factory is restored after (only damage stores such text, L12b)."""
        raw = _driver(await conn.get_raw_connection())
        saved = raw.text_factory
        raw.text_factory = sqlite_screen.lenient_text
        try:
            yield
        finally:
            raw.text_factory = saved

    def undecodable(self, exc: BaseException) -> bool:
        return sqlite_screen.undecodable(exc)

    async def batches(self, conn: AsyncConnection, query: sa.Select[Any], size: int
                      ) -> AsyncGenerator[Sequence[Sequence[Any]], None]:
        """Straight from aiosqlite: no result objects."""
        cursor = await _driver(await conn.get_raw_connection()).execute(*standalone(query))
        try:
            while batch := await cursor.fetchmany(size):
                yield batch
        finally:
            await cursor.close()

    def file_screen(self, bound: AsyncConnection | None) -> SQLiteFile | None:
        path = self.engine.url.database
        if bound is not None or not path or path == ":memory:":
            return None  # no file, or a bound transaction whose writes only its connection sees
        return SQLiteFile(os.path.abspath(path))


class SQLiteFile:
    """verify's view of a database file: ranges screened by :func:`.sqlite_screen.screen_file` on a
    read-only connection of their own, in a thread here or in a worker process (``FileScreen``)."""

    worker: tuple[str, tuple[str, ...]] = (sqlite_screen.WORKER, (os.path.dirname(os.path.abspath(sqlite_screen.__file__)),))

    def __init__(self, path: str) -> None:
        self.path = path

    def job(self, spec: tuple[Any, ...], facts: sa.Select[Any], rows: sa.Select[Any]) -> tuple[Any, ...]:
        """The picklable job for one screening process: the file, the screen's spec and the two queries as SQL."""
        return (self.path, spec, standalone(facts), standalone(rows))

    def screen(self, job: tuple[Any, ...]) -> tuple[int, int, list[Any]]:
        """Run one screening job on the file; SQLite errors become statebook's storage errors."""
        try:
            return sqlite_screen.screen_file(*job)
        except sqlite3.Error as exc:  # e.g. a read-only open refused
            raise translated(exc, job[2][0]) from exc


_QMARK = sqlite.dialect(paramstyle="qmark")


def standalone(query: sa.Select[Any]) -> tuple[str, list[Any]]:
    """``query`` as SQL and positional parameters for a bare ``sqlite3`` (or aiosqlite) cursor."""
    compiled = query.compile(dialect=_QMARK)
    return compiled.string, [compiled.params[name] for name in compiled.positiontup or ()]


_QUEUES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _WriterQueue]] = weakref.WeakKeyDictionary()

WAIT_SECONDS = BUSY_TIMEOUT_MS / 1000
"""How long a writer waits for its turn: SQLite's own busy timeout, so a writer blocked by another writer of
the same process fails as it would on SQLite's lock (``StorageUnavailable``), never hangs."""


class _WriterQueue:
    """An asyncio lock that the task holding it may enter again (a nested unit of the same writer
    then proceeds to SQLite's own lock, as it would without the queue, instead of deadlocking)."""

    def __init__(self, database: str) -> None:
        self.database = database
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None

    async def enter(self) -> bool:
        """Wait for this task's turn; False when the task already holds it (then leave() does nothing)."""
        me = asyncio.current_task()
        if me is not None and me is self._holder:
            return False
        try:
            async with asyncio.timeout(WAIT_SECONDS):
                await self._lock.acquire()
        except TimeoutError:
            raise StorageUnavailable(
                f"SQLite: {self.database} stayed locked by another writer of this process for {WAIT_SECONDS:g} s"
            ) from None
        self._holder = me
        return True

    def leave(self, entered: bool) -> None:
        if entered:
            self._holder = None
            self._lock.release()

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        entered = await self.enter()
        try:
            yield
        finally:
            self.leave(entered)


class _IdList(sa.types.TypeDecorator[Any]):
    """A list of ids bound as one JSON text, which ``json_each`` reads back as rows."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else dumps(list(value))


@compiles(IdsIn, "sqlite")
def _ids_in(element: IdsIn, compiler: Any, **kw: Any) -> str:
    """``queries.ids_in`` as ``IN (SELECT value FROM json_each(:ids))``: SQLite has no array parameter, and an
    expanded ``IN (?, ?, ...)`` would compile one statement per list length."""
    listed: sa.Select[Any] = sa.select(sa.column("value")).select_from(
        sa.func.json_each(sa.bindparam(element.name, type_=_IdList())))
    text: str = compiler.process(element.column.in_(listed), **kw)
    return text


def _insert(table: sa.Table, columns: tuple[str, ...], if_absent: bool) -> Any:
    stmt = sqlite.insert(table).values({c: sa.bindparam(c, type_=table.c[c].type) for c in columns})
    return stmt.on_conflict_do_nothing() if if_absent else stmt


def _update(table: sa.Table, guards: tuple[str, ...], columns: tuple[str, ...]) -> Any:
    """The compare-and-set UPDATE of one row: version, status, chain head and guards still as read."""
    return (
        sa.update(table)
        .where(
            table.c.id == sa.bindparam("b_id"),
            table.c.version == sa.bindparam("b_version"),
            table.c.status == sa.bindparam("b_status"),
            table.c.last_fact_id == sa.bindparam("b_last_fact_id"),
            table.c.chain_hash == sa.bindparam("b_chain_hash"),
            # NULL-safe: a guard may expect "still unset" (SQLite IS).
            *(table.c[g].is_not_distinct_from(sa.bindparam(f"b_{g}", type_=table.c[g].type)) for g in guards),
        )
        .values({c: sa.bindparam(f"n_{c}", type_=table.c[c].type) for c in columns})
    )


def _update_params(w: RowWrite) -> dict[str, Any]:
    params = {f"n_{c}": v for c, v in w.values.items()}
    params.update({f"b_{k}": v for k, v in w.expect.items()})
    params["b_id"] = w.entity_id
    return params


def _driver(fairy: Any) -> Any:
    """aiosqlite's connection under a pooled one (SQLAlchemy types it Optional: None once it is closed)."""
    driver = fairy.driver_connection
    assert driver is not None, "the connection was closed"
    return driver


register_backend("sqlite", SQLiteStore)
