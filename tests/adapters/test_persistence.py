"""The backends' shared driver layer (adapters/persistence.py) and their units of work, on both backends.

Hot-path statements are compiled once by SQLAlchemy and run on the asyncpg / aiosqlite connection under
a SQLAlchemy connection. These tests hold the layer to its promises: one compiled shape per statement and
dialect, values bound in a statement sent with it, exact row counts, driver errors raised as statebook's own (L18),
statements joining the transaction of the connection they came from, and — on PostgreSQL — an autocommit
connection that a cancelled or broken statement leaves out of the pool rather than handed out again.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from statebook.adapters.db import connect
from statebook.adapters.registry import builtin_registry
from statebook.adapters.persistence import Driver
from statebook.adapters.postgres import PostgresStore
from statebook.adapters.postgres_batches import constant_keys
from statebook.adapters.sqlite import SQLiteStore, _insert
from statebook.lifecycle import Book
from statebook.lifecycle.errors import ConstraintViolation, StorageError
from statebook.lifecycle.book import READ_ONLY_OPTION
from statebook.lifecycle.store import store_for


@asynccontextmanager
async def autocommit(book: Book) -> AsyncIterator[Driver]:
    """A driver on a bare pooled connection outside any transaction (the store's reader unit)."""
    async with book.store.reader(None) as unit:
        yield unit.handle


@asynccontextmanager
async def transaction(book: Book) -> AsyncIterator[Driver]:
    """The store's own write unit (BEGIN ... COMMIT on a bare pooled connection)."""
    async with book.store.own_unit(False) as unit:
        yield unit.handle


async def driver(conn: Any) -> Driver:
    """The driver of a SQLAlchemy connection, joined to its transaction (as a bound unit is)."""
    store = store_for(conn.engine)
    return Driver(store, await store.joined(conn))


_STORES = {"postgresql": PostgresStore(SimpleNamespace(dialect=PGDialect_asyncpg())),  # type: ignore[arg-type]
           "sqlite": SQLiteStore(SimpleNamespace(dialect=SQLiteDialect_aiosqlite()))}  # type: ignore[arg-type]
"""Stores over bare dialects: enough to compile shapes (no connection is made)."""


def shape(dialect: Any, statement: Any) -> Any:
    return _STORES[dialect.name].shape(statement)

META = sa.MetaData()
notes = sa.Table(
    "driver_notes",
    META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("tag", sa.Text, unique=True),
    sa.Column("body", sa.JSON),
)
COLUMNS = ("id", "tag", "body")


def insert_note() -> Any:
    """INSERT one note; parameters ``b_id``, ``b_tag``, ``b_body`` (built per test: see test_shape_*)."""
    return sa.insert(notes).values(id=sa.bindparam("b_id", type_=sa.Integer), tag=sa.bindparam("b_tag", type_=sa.Text),
                                   body=sa.bindparam("b_body", type_=sa.JSON))


def pg_insert(table: sa.Table, columns: tuple[str, ...]) -> Any:
    from sqlalchemy.dialects import postgresql

    return postgresql.insert(table).values({c: sa.bindparam(c, type_=table.c[c].type) for c in columns}).on_conflict_do_nothing()


def note(n: int, tag: str | None = None, body: Any = None) -> dict[str, Any]:
    return {"b_id": n, "b_tag": tag or f"t{n}", "b_body": body if body is not None else [n]}


async def prepared(url: str) -> AsyncEngine:
    """An engine with ONE pooled connection over a fresh, empty notes table."""
    engine = connect(url, pool_size=1)
    async with engine.begin() as conn:
        await conn.run_sync(META.drop_all)
        await conn.run_sync(META.create_all)
    return engine


async def dropped(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(META.drop_all)
    await engine.dispose()


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = await prepared(db_url)
    try:
        yield engine
    finally:
        await dropped(engine)


@pytest.fixture
async def pg_book(pg_url: str) -> AsyncIterator[Book]:
    """A book over PostgreSQL whose pool holds one connection (the autocommit tests watch which one)."""
    engine = await prepared(pg_url)
    try:
        yield Book(engine, builtin_registry())
    finally:
        await dropped(engine)


@pytest.fixture
async def watcher(pg_url: str) -> AsyncIterator[AsyncEngine]:
    """A second engine: looks at the server (pg_stat_activity) and terminates backends."""
    engine = connect(pg_url, pool_size=1)
    try:
        yield engine
    finally:
        await engine.dispose()


async def peek(engine: AsyncEngine) -> dict[int, tuple[str, Any]]:
    """The committed notes, read on another connection (read-only: on SQLite it never waits for a writer)."""
    async with engine.connect() as conn:
        await conn.execution_options(**{READ_ONLY_OPTION: True})
        return {r.id: (r.tag, r.body) for r in await conn.execute(sa.select(notes))}


async def backend_pid(book: Book) -> int:
    async with autocommit(book) as db:
        ((pid,),) = await db.fetch(sa.select(sa.func.pg_backend_pid()), {})
    return pid


async def wait_until_running(watcher: AsyncEngine, pid: int, text: str) -> None:
    """Until backend ``pid`` is executing a statement containing ``text`` (a hang guard, not a timing)."""
    query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid AND state = 'active' "
                    "AND query LIKE :text")
    for _ in range(2000):
        async with watcher.connect() as conn:
            if (await conn.execute(query, {"pid": pid, "text": f"%{text}%"})).scalar_one():
                return
        await asyncio.sleep(0.01)
    pytest.fail(f"backend {pid} never ran {text!r}")


async def works(book: Book, n: int) -> None:
    """The engine serves a write through the driver and a transaction through SQLAlchemy."""
    async with autocommit(book) as db:
        assert await db.execute(insert_note(), note(n)) == 1
    async with book.engine.begin() as conn:
        assert (await conn.execute(sa.select(notes.c.tag).where(notes.c.id == n))).scalar_one() == f"t{n}"
        db = await driver(conn)
        assert await db.execute(sa.delete(notes).where(notes.c.id == sa.bindparam("b_id")), {"b_id": n}) == 1


# -- shapes -------------------------------------------------------------------------------------------
def test_shape_is_compiled_once_per_statement_and_dialect():
    """L15: each statement is compiled once per dialect — PostgreSQL gets ``$n`` placeholders and SQLite
    ``?`` ones, and neither is handed the other's — with its bind names in positional order."""
    stmt = sa.select(notes.c.id).where(notes.c.tag == sa.bindparam("b_tag"), notes.c.id > sa.bindparam("b_min"))
    on_pg = shape(PGDialect_asyncpg(), stmt)
    assert shape(PGDialect_asyncpg(), stmt) is on_pg
    on_sqlite = shape(SQLiteDialect_aiosqlite(), stmt)
    assert shape(SQLiteDialect_aiosqlite(), stmt) is on_sqlite and on_sqlite is not on_pg
    assert "$1" in on_pg.sql and "$2" in on_pg.sql and "?" not in on_pg.sql
    assert on_sqlite.sql.count("?") == 2 and "$" not in on_sqlite.sql
    assert on_pg.names == on_sqlite.names == ("b_tag", "b_min")
    assert on_pg.args({"b_min": 3, "b_tag": "x"}) == on_sqlite.args({"b_min": 3, "b_tag": "x"}) == ["x", 3]
    twin = sa.select(notes.c.id).where(notes.c.tag == sa.bindparam("b_tag"), notes.c.id > sa.bindparam("b_min"))
    assert shape(PGDialect_asyncpg(), twin) is not on_pg  # keyed by the statement object, not its text


def test_a_cached_shape_serves_only_its_own_statement(monkeypatch):
    """L15: the cache is keyed by id(statement); an entry found under another statement's id (as after the
    id was reused) is compiled afresh, never served for a statement it was not compiled from."""
    dialect = PGDialect_asyncpg()
    first = sa.select(notes.c.id).where(notes.c.id == sa.bindparam("b_id"))
    second = sa.delete(notes).where(notes.c.tag == sa.bindparam("b_tag"))
    planted = shape(dialect, first)
    monkeypatch.setitem(_STORES["postgresql"]._shapes, id(second), (first, planted))
    found = shape(dialect, second)
    assert found is not planted and found.sql.startswith("DELETE") and found.names == ("b_tag",)


async def test_constants_bound_in_a_statement_are_sent(engine: AsyncEngine):
    """L7 / L15: values written into a statement (literals, e.g. a NOTIFY channel) are sent with it, through
    their type's bind processor (a JSON literal arrives as JSON), next to the caller's parameters."""
    insert = sa.insert(notes).values(id=sa.bindparam("b_id", type_=sa.Integer), tag="constant", body={"k": [1, 2]})
    select = sa.select(notes.c.id, sa.literal(7, sa.Integer).label("seven")).where(
        notes.c.tag == "constant", notes.c.id > sa.bindparam("b_min", type_=sa.Integer))
    async with engine.begin() as conn:
        db = await driver(conn)
        assert "constant" in shape(conn.dialect, insert).constants.values()
        assert await db.execute(insert, {"b_id": 5}) == 1
        assert [tuple(r) for r in await db.fetch(select, {"b_min": 1})] == [(5, 7)]
        assert await db.fetch(select, {"b_min": 5}) == []
    assert await peek(engine) == {5: ("constant", {"k": [1, 2]})}


# -- row counts and errors ----------------------------------------------------------------------------
async def test_execute_returns_the_rows_it_wrote(engine: AsyncEngine):
    """L4 / L5: ``execute`` reports how many rows a statement wrote — an insert ON CONFLICT DO NOTHING that
    skipped counts 0 — which is what create(if_absent) and the compare-and-set decide on."""
    update = sa.update(notes).where(notes.c.id >= sa.bindparam("b_min", type_=sa.Integer)).values(tag=notes.c.tag + "!")
    delete = sa.delete(notes).where(notes.c.id == sa.bindparam("b_id", type_=sa.Integer))
    async with engine.begin() as conn:
        db = await driver(conn)
        await db.executemany(insert_note(), [note(1), note(2), note(3)])
        await db.executemany(insert_note(), [])
        if_absent = _insert(notes, COLUMNS, True) if conn.dialect.name == "sqlite" else pg_insert(notes, COLUMNS)
        assert await db.execute(if_absent, {"id": 1, "tag": "t9", "body": [9]}) == 0
        assert await db.execute(if_absent, {"id": 4, "tag": "t4", "body": [4]}) == 1
        assert await db.execute(update, {"b_min": 3}) == 2
        assert await db.execute(update, {"b_min": 99}) == 0
        assert await db.execute(delete, {"b_id": 1}) == 1
    assert await peek(engine) == {2: ("t2", [2]), 3: ("t3!", [3]), 4: ("t4!", [4])}


async def test_driver_errors_are_statebook_errors(engine: AsyncEngine, backend: str):
    """L5 / L18: a constraint violation from the driver is raised as ConstraintViolation (the
    driver's exception in ``orig``) and rolls back everything its transaction wrote; another failure is a
    StorageError. The pool's one connection serves the next transaction."""
    with pytest.raises(ConstraintViolation) as excinfo:
        async with engine.begin() as conn:
            db = await driver(conn)
            await db.execute(insert_note(), note(1))
            await db.executemany(insert_note(), [note(2), note(3, tag="t1")])
    if backend == "postgres":
        import asyncpg

        assert isinstance(excinfo.value.orig, asyncpg.exceptions.UniqueViolationError)
    else:
        assert isinstance(excinfo.value.orig, sqlite3.IntegrityError)
    assert await peek(engine) == {}
    with pytest.raises(ConstraintViolation):
        async with engine.begin() as conn:
            db = await driver(conn)
            await db.execute(insert_note(), note(1))
            await db.fetch(insert_note().returning(notes.c.id), note(1))
    with pytest.raises(StorageError) as excinfo:
        async with engine.begin() as conn:
            await (await driver(conn)).fetch(sa.text("SELECT * FROM driver_no_such_table"), {})
    assert not isinstance(excinfo.value, ConstraintViolation)
    assert await peek(engine) == {}
    async with engine.begin() as conn:
        await (await driver(conn)).execute(insert_note(), note(1))
        await conn.execute(sa.insert(notes).values(id=2, tag="t2"))
    assert set(await peek(engine)) == {1, 2}


# -- transactions -------------------------------------------------------------------------------------
@pytest.mark.parametrize("first", ["driver", "sqlalchemy"])
async def test_driver_statements_join_the_transaction_of_their_connection(engine: AsyncEngine, first: str):
    """L5: ``driver(conn)`` inside a transaction runs its statements in that transaction — also when the
    driver's is the first statement, before SQLAlchemy has sent the BEGIN it defers on PostgreSQL — so they
    stay invisible to other connections until the commit and are undone by a rollback, together with the
    SQLAlchemy statements around them."""
    with pytest.raises(RuntimeError, match="rolled back"):
        async with engine.begin() as conn:
            if first == "sqlalchemy":
                await conn.execute(sa.insert(notes).values(id=10, tag="before"))
            db = await driver(conn)
            assert await db.execute(insert_note(), note(1)) == 1
            await conn.execute(sa.insert(notes).values(id=11, tag="after"))
            assert await peek(engine) == {}
            raise RuntimeError("rolled back")
    assert await peek(engine) == {}
    async with engine.begin() as conn:
        db = await driver(conn)
        await db.execute(insert_note(), note(1))
        await conn.execute(sa.insert(notes).values(id=11, tag="after"))
        assert await peek(engine) == {}
    assert set(await peek(engine)) == {1, 11}


async def test_autocommit_runs_each_statement_on_its_own(engine: AsyncEngine):
    """L5: the store's reader unit yields a driver outside any transaction — what it wrote is committed before
    the block ends, and a failing statement after it takes nothing back."""
    book = Book(engine, builtin_registry())
    async with autocommit(book) as db:
        assert await db.execute(insert_note(), note(1)) == 1
        assert await peek(engine) == {1: ("t1", [1])}
    with pytest.raises(ConstraintViolation):
        async with autocommit(book) as db:
            await db.execute(insert_note(), note(2))
            await db.execute(insert_note(), note(3, tag="t1"))
    assert set(await peek(engine)) == {1, 2}


async def test_book_transaction_commits_or_rolls_back_as_one(engine: AsyncEngine):
    """L5: the store's own unit (an unbound book's own unit of work on a bare driver connection) keeps its
    statements invisible until COMMIT, and any exception rolls them all back — after which the next
    transaction runs (on SQLite the write lock was let go)."""
    book = Book(engine, builtin_registry())
    async with transaction(book) as db:
        await db.execute(insert_note(), note(1))
        await db.execute(insert_note(), note(2))
        assert await peek(engine) == {}
    assert set(await peek(engine)) == {1, 2}
    with pytest.raises(ConstraintViolation):
        async with transaction(book) as db:
            await db.execute(insert_note(), note(3))
            await db.execute(insert_note(), note(4, tag="t1"))
    with pytest.raises(RuntimeError, match="caller"):
        async with transaction(book) as db:
            await db.execute(insert_note(), note(5))
            raise RuntimeError("caller")
    assert set(await peek(engine)) == {1, 2}
    async with transaction(book) as db:
        await db.execute(insert_note(), note(6))
    assert set(await peek(engine)) == {1, 2, 6}


# -- PostgreSQL: the autocommit connection and the pool -------------------------------------------------
@pytest.mark.postgres
async def test_autocommit_drops_a_cancelled_connection(pg_book: Book, watcher: AsyncEngine):
    """L5 / L15: a statement cancelled while the server runs it (as by asyncio.wait_for) does not put its
    connection back in the pool: the pool hands out a new connection and the engine keeps working."""
    before = await backend_pid(pg_book)

    async def sleeper() -> None:
        async with autocommit(pg_book) as db:
            await db.fetch(sa.select(sa.func.pg_sleep(10)), {})

    task = asyncio.create_task(sleeper())
    await wait_until_running(watcher, before, "pg_sleep")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pg_book.engine.pool.checkedout() == 0
    assert await backend_pid(pg_book) != before
    await works(pg_book, 1)


@pytest.mark.postgres
async def test_book_transaction_cancelled_writes_nothing_and_drops_its_connection(pg_book: Book, watcher: AsyncEngine):
    """L5: a unit of work cancelled in the middle of a statement commits nothing of what it wrote before,
    and its connection is not handed out again."""
    before = await backend_pid(pg_book)

    async def unit() -> None:
        async with transaction(pg_book) as db:
            await db.execute(insert_note(), note(1))
            await db.fetch(sa.select(sa.func.pg_sleep(10)), {})

    task = asyncio.create_task(unit())
    await wait_until_running(watcher, before, "pg_sleep")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pg_book.engine.pool.checkedout() == 0
    assert await peek(pg_book.engine) == {}
    assert await backend_pid(pg_book) != before
    await works(pg_book, 2)


@pytest.mark.postgres
async def test_connections_beyond_the_pool_close_cleanly_when_they_come_back(pg_book: Book, watcher: AsyncEngine,
                                                                            caplog):
    """L5: more units at once than the pool keeps (its one connection and two overflow ones): the overflow
    connections are closed as they come back — I/O, run in SQLAlchemy's greenlet — with no error logged
    and no connection left open on the server."""
    pids: list[int] = []

    async def hold(unit) -> None:
        async with unit(pg_book) as db:
            ((pid,),) = await db.fetch(sa.select(sa.func.pg_backend_pid()), {})
            pids.append(pid)
            for _ in range(500):
                if len(pids) == 3:
                    break
                await asyncio.sleep(0.01)

    await asyncio.gather(hold(autocommit), hold(transaction), hold(autocommit))
    assert len(set(pids)) == 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert pg_book.engine.pool.checkedout() == 0
    query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(:pids)")
    async with watcher.connect() as conn:
        assert (await conn.execute(query, {"pids": pids})).scalar_one() == 1  # the one the pool keeps
    await works(pg_book, 1)


@pytest.mark.postgres
async def test_a_book_transaction_cancelled_in_a_sqlalchemy_statement_raises_cancelled(pg_book: Book,
                                                                                       watcher: AsyncEngine):
    """L5: ``Book.begin()`` cancelled while one of the caller's own SQLAlchemy statements runs: the caller
    gets CancelledError (not a PendingRollbackError or MissingGreenlet from the connection SQLAlchemy
    invalidated), nothing it wrote before commits, and the book keeps working."""
    before = await backend_pid(pg_book)

    async def unit() -> None:
        async with pg_book.begin() as tx:
            assert tx.conn is not None
            await tx.conn.execute(insert_note(), note(1))
            await tx.conn.execute(sa.select(sa.func.pg_sleep(10)))

    task = asyncio.create_task(unit())
    await wait_until_running(watcher, before, "pg_sleep")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pg_book.engine.pool.checkedout() == 0
    assert await peek(pg_book.engine) == {}
    await works(pg_book, 2)


@pytest.mark.postgres
async def test_autocommit_cancelled_by_wait_for_leaves_a_working_pool(pg_book: Book):
    """L5: the same through asyncio.wait_for's timeout: the caller gets TimeoutError, later operations on
    the engine (driver and SQLAlchemy) work."""
    async def sleeper() -> None:
        async with autocommit(pg_book) as db:
            await db.fetch(sa.select(sa.func.pg_sleep(10)), {})

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(sleeper(), 0.5)
    assert pg_book.engine.pool.checkedout() == 0
    for n in range(3):
        await works(pg_book, n)


async def broken_statement(book: Book, watcher: AsyncEngine) -> int:
    """Check out the autocommit connection, have the server terminate it, and once the driver has noticed,
    send a statement on it (which raises). The terminated backend's pid."""
    async with autocommit(book) as db:
        ((pid,),) = await db.fetch(sa.select(sa.func.pg_backend_pid()), {})
        async with watcher.connect() as conn:
            assert (await conn.execute(sa.select(sa.func.pg_terminate_backend(pid)))).scalar_one()
        for _ in range(2000):
            if db.raw.is_closed():
                break
            await asyncio.sleep(0.01)
        await db.fetch(sa.select(sa.literal(1)), {})
    pytest.fail("a statement on a closed connection succeeded")


@pytest.mark.postgres
async def test_autocommit_drops_a_broken_connection(pg_book: Book, watcher: AsyncEngine):
    """L5 / L15: a connection the server closed fails the statement sent on it, and is dropped: the next
    operation gets a new connection instead of the dead one."""
    before = await backend_pid(pg_book)
    with pytest.raises(Exception):  # noqa: B017 - asyncpg's InterfaceError today (not translated by the driver)
        await broken_statement(pg_book, watcher)
    assert pg_book.engine.pool.checkedout() == 0
    assert await backend_pid(pg_book) != before
    await works(pg_book, 1)


@pytest.mark.postgres
async def test_autocommit_keeps_its_connection_after_a_statement_error(pg_book: Book):
    """L5: an error the statement itself caused (here a unique violation) leaves the connection sound: it
    goes back to the pool and serves the next operation."""
    before = await backend_pid(pg_book)
    async with autocommit(pg_book) as db:
        await db.execute(insert_note(), note(1))
    with pytest.raises(ConstraintViolation):
        async with autocommit(pg_book) as db:
            await db.execute(insert_note(), note(1))
    assert await backend_pid(pg_book) == before
    await works(pg_book, 2)


def test_constant_keys_need_the_same_type_and_value_and_skip_json_containers():
    """L15: a batch column is sent once only when every row holds the same value of the same type;
    1 and True (equal in Python, different in SQL and JSON) and dicts/lists never count as constant,
    and the keys named varying are always sent per row."""

    rows = [
        {"id": "a", "n": 1, "flag": 1, "note": None, "doc": {"x": 1}, "at": 2.5, "s": "k"},
        {"id": "b", "n": 1, "flag": True, "note": None, "doc": {"x": 1}, "at": 2.5, "s": "k"},
        {"id": "c", "n": 1, "flag": 1, "note": None, "doc": {"x": 1}, "at": 2.5, "s": "other"},
    ]
    keys = tuple(rows[0])
    assert constant_keys(rows, keys, frozenset({"id"})) == {"n", "note", "at"}
    assert constant_keys(rows[:1], keys, frozenset({"id"})) == {"n", "flag", "note", "at", "s"}
