"""The storage adapter: URLs, SQLite connection behaviour, schema versioning."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from statebook.adapters.migrations import HEAD, VERSION_TABLE
import sqlalchemy as sa

from statebook.adapters.db import connect, normalize_url, open_book
from statebook.adapters.errors import ConfigError
from statebook.lifecycle import Actor, FakeClock, Reason, create, history


def test_urls_are_normalised_for_async_drivers():
    assert normalize_url("postgresql://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert normalize_url("/tmp/x.db") == "sqlite+aiosqlite:////tmp/x.db"


@pytest.mark.parametrize("url", ["mysql://u@h/db", "sqlite:///:memory:", "postgresql://u@h:notaport/db"])
def test_bad_urls_are_config_errors(url):
    with pytest.raises(ConfigError):
        connect(url)


def test_missing_sqlite_file_is_refused_when_it_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        connect(f"sqlite:///{tmp_path / 'absent.db'}", must_exist=True)
    assert not (tmp_path / "absent.db").exists()


async def test_sqlite_pragmas_and_file_mode(tmp_path):
    """L15: WAL, busy timeout, foreign keys; the file is private (0600)."""
    path = tmp_path / "s.db"
    book = await open_book(f"sqlite:///{path}")
    try:
        async with book.engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
            assert (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar() == 5000
            assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
            assert (await conn.exec_driver_sql("PRAGMA synchronous")).scalar() == 1  # NORMAL
    finally:
        await book.engine.dispose()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


async def test_sqlite_reads_do_not_wait_for_a_writer(tmp_path):
    """L15: with another connection holding the write lock, a read (history) still answers at once."""
    path = tmp_path / "r.db"
    clock = FakeClock()
    book = await open_book(f"sqlite:///{path}", clock=clock)
    try:
        out = await create(
            book, "dispatch",
            values=dict(kind="k", deliver_to="x", payload={}, next_attempt_at=clock.now(), created_at=clock.now()),
            status="pending", reason=Reason("dispatch.pending.enqueued"), actor=Actor("system"),
        )
        holder = sqlite3.connect(path, timeout=0.1, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            facts = await history(book, "dispatch", out.entity_id)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert [f.status for f in facts] == ["pending"]
    finally:
        await book.engine.dispose()


async def test_the_head_revision_is_recorded_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'v.db'}"
    for _ in range(2):
        book = await open_book(url)
        async with book.read() as conn:
            versions = (await conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}"))).scalars().all()
        await book.engine.dispose()
    assert versions == [HEAD]


async def test_a_database_at_an_older_revision_is_refused_with_what_to_do(tmp_path):
    """An older revision is named with the command that upgrades it, not half-used."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    book = await open_book(url)
    async with book.engine.begin() as conn:
        await conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '0001'"))
    await book.engine.dispose()
    with pytest.raises(ConfigError, match=f"revision 0001, this statebook expects {HEAD}; run: statebook db upgrade"):
        await open_book(url)


async def test_sqlite_connections_return_to_the_pool_outside_any_transaction(tmp_path):
    """SQLite engines skip the pool's reset ROLLBACK: every way a unit of work ends (commit, an
    error, a read) must still hand the connection back with no transaction open."""
    engine = connect(f"sqlite:///{tmp_path / 'pool.db'}", pool_size=1)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql("CREATE TABLE t (x INTEGER PRIMARY KEY)")
        for n in range(3):
            with pytest.raises(RuntimeError):
                async with engine.begin() as conn:
                    await conn.exec_driver_sql(f"INSERT INTO t VALUES ({n})")
                    raise RuntimeError("the caller fails mid-transaction")
            async with engine.connect() as conn:  # a read, closed without commit
                await conn.exec_driver_sql("SELECT count(*) FROM t")
            fairy = await engine.raw_connection()  # the pool's one connection
            try:
                assert fairy.driver_connection.in_transaction is False
            finally:
                fairy.close()
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT count(*) FROM t")).scalar() == 0
    finally:
        await engine.dispose()


def test_a_postgres_url_option_asyncpg_does_not_take_is_refused_before_connecting():
    """C4: ``?sslmode=`` (libpq's spelling) was a TypeError at the first connection; now a ConfigError naming it."""
    from statebook.adapters.db import connect
    from statebook.adapters.errors import ConfigError

    with pytest.raises(ConfigError, match="'sslmode' is not one asyncpg takes; for TLS use ssl=require"):
        connect("postgresql://u@127.0.0.1:1/x?sslmode=require")
    engine = connect("postgresql://u@127.0.0.1:1/x?ssl=require&command_timeout=5")  # asyncpg's own options pass
    assert engine.url.query == {"ssl": "require", "command_timeout": "5"}
