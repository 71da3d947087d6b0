"""Connect to SQLite or PostgreSQL with the behaviour statebook relies on, and build the schema.

SQLite: WAL, ``busy_timeout``, foreign keys, ``synchronous=NORMAL``, and every transaction starts
with ``BEGIN IMMEDIATE`` — with a deferred BEGIN a read-then-write transaction fails at once with
"database is locked" whatever the busy timeout. The database file is created with mode 0600.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.util import await_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from statebook.lifecycle import Book, Clock, Registry
from statebook.lifecycle.clock import SYSTEM_CLOCK
from statebook.lifecycle.inputs import DEFAULT_LIMITS, Limits
from statebook.lifecycle.schema import metadata
from statebook.lifecycle.book import READ_ONLY_OPTION
from statebook.lifecycle.codec import dumps
from statebook.lifecycle.chain import ChainKeyRequired, chain_table, key_chain
from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.errors import StorageUnavailable
from statebook.lifecycle.schema import check_statuses, create_tables

from .errors import ConfigError
from .extras import require
from .migrations import HEAD, LEGACY_VERSION, Stamp, read_stamp, write_head
from .registry import builtin_registry
from . import postgres as _postgres  # noqa: F401  (registers the storage backend)
from .sqlite import BUSY_TIMEOUT_MS  # one value for the connections and the writer queue (and registers it)

DEFAULT_URL = "sqlite:///./statebook.db"


def normalize_url(url: str | None = None) -> str:
    """An async SQLAlchemy URL from a user's URL, a bare file path, or ``$STATEBOOK_DB``.

    >>> normalize_url("postgresql://u@h/db")
    'postgresql+asyncpg://u@h/db'
    """
    raw = url or os.environ.get("STATEBOOK_DB") or DEFAULT_URL
    if "://" not in raw:
        raw = f"sqlite:///{raw}"
    try:
        parsed = make_url(raw)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"malformed database URL {raw!r}: {exc}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
        if not parsed.database or parsed.database == ":memory:":
            raise ConfigError("statebook needs a SQLite file, e.g. sqlite:///./statebook.db (not :memory:)")
    elif backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ConfigError(f"unsupported database {backend!r} in {raw!r}; use sqlite:///PATH or postgresql://...")
    return parsed.render_as_string(hide_password=False)


def _prepare_sqlite_file(path: str, *, must_exist: bool) -> None:
    file = Path(path)
    if file.is_dir():  # SQLite alone would say only "unable to open database file"
        raise ConfigError(f"the SQLite database path {path} is a directory; name a file in it, e.g. "
                          f"sqlite:///{file / 'statebook.db'}")
    if file.exists():
        return
    if must_exist:
        raise ConfigError(f"database file {path} does not exist")
    if not file.parent.exists():
        raise ConfigError(f"directory {file.parent} for the database file does not exist")
    fd = os.open(file, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)


def connect(url: str | None = None, *, must_exist: bool = False, pool_size: int = 10,
            idle_transaction_seconds: float | None = None) -> AsyncEngine:
    """An async engine configured for statebook. Nothing is read or written yet.

    ``idle_transaction_seconds`` (PostgreSQL; ignored on SQLite, whose writer is one process): the server ends
    a session of this engine that sits inside a transaction, waiting for its client, for longer. A process
    frozen in the middle of a transaction (SIGSTOP, a paused VM) otherwise keeps its row locks for as long as
    it is frozen, and whoever took over its work waits behind them."""
    full = normalize_url(url)
    parsed = make_url(full)
    if parsed.get_backend_name() == "sqlite":
        _prepare_sqlite_file(parsed.database or "", must_exist=must_exist)
        # No pool reset on return: a Connection rolls back its own open transaction when it closes,
        # and the driver runs in autocommit mode otherwise, so the reset's ROLLBACK (a thread
        # hand-off per checkout) has nothing to undo.
        engine = create_async_engine(
            full, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000}, json_serializer=dumps, pool_reset_on_return=None
        )
        _configure_sqlite(engine)
        return engine
    _require_asyncpg()
    _check_postgres_options(parsed)
    connect_args: dict[str, Any] = {}
    if idle_transaction_seconds is not None:
        milliseconds = max(1, round(idle_transaction_seconds * 1000))
        connect_args["server_settings"] = {"idle_in_transaction_session_timeout": str(milliseconds)}
    engine = create_async_engine(full, pool_size=pool_size, max_overflow=pool_size * 2, json_serializer=dumps,
                                 connect_args=connect_args)
    _name_the_server(engine, parsed)
    return engine


def _name_the_server(engine: AsyncEngine, parsed: sa.engine.URL) -> None:
    """A connection that cannot be made says where it was going: host and port (never the password)."""
    host = parsed.host or str(parsed.query.get("host") or "") or "localhost"
    where = f"{host}:{parsed.port or 5432}"
    database = f" (database {parsed.database}{f', user {parsed.username}' if parsed.username else ''})"

    @sa.event.listens_for(engine.sync_engine, "do_connect")
    def _connect(dialect, _record, cargs, cparams):  # type: ignore[no-untyped-def]
        try:
            return dialect.connect(*cargs, **cparams)
        except OSError as exc:  # refused, unknown host, unreachable network, timed out
            raise StorageUnavailable(f"cannot connect to PostgreSQL at {where}{database}: {_why(exc)}",
                                     orig=exc) from exc


def _why(exc: OSError) -> str:
    import socket

    if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in str(exc):
        return "connection refused (is the server running and accepting TCP connections on that port?)"
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc.strerror or exc})"
    if isinstance(exc, TimeoutError):
        return "no answer before the connection timed out"
    return exc.strerror or str(exc) or type(exc).__name__


_DIALECT_OPTIONS = frozenset({"prepared_statement_cache_size", "async_fallback"})
"""URL query options SQLAlchemy's asyncpg dialect reads itself; every other one is passed to asyncpg.connect."""


def _check_postgres_options(parsed: sa.engine.URL) -> None:
    """Refuse a URL option asyncpg.connect does not take (it would fail at the first connection with a
    TypeError); name the ones it does."""
    import inspect

    import asyncpg

    known = set(inspect.signature(asyncpg.connect).parameters) - {"dsn", "connection_class", "record_class"}
    for key in parsed.query:
        if key not in known and key not in _DIALECT_OPTIONS:
            hint = "; for TLS use ssl=require (asyncpg has no sslmode)" if key == "sslmode" else ""
            raise ConfigError(f"the database URL's option {key!r} is not one asyncpg takes{hint}; "
                              f"options: {', '.join(sorted(known | _DIALECT_OPTIONS))}")


def _require_asyncpg() -> None:
    # SQLAlchemy imports the driver inside create_async_engine, with a bare ImportError: say what to install first
    require("asyncpg", extra="postgres", feature="a postgresql:// database")


def _configure_sqlite(engine: AsyncEngine) -> None:
    @sa.event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_conn.cursor()
        for pragma in (
            "PRAGMA journal_mode=WAL",
            f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
            "PRAGMA foreign_keys=ON",
            "PRAGMA synchronous=NORMAL",
        ):
            cursor.execute(pragma)
        cursor.close()

    @sa.event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(dbapi_conn, _record, _proxy):  # type: ignore[no-untyped-def]
        # SQLite engines skip the pool's reset (see connect()). A task cancelled while its BEGIN ran in
        # aiosqlite's thread can leave a pooled connection inside a transaction, holding the write lock:
        # such a connection is discarded here (closing it releases the lock) and the pool hands out another.
        if dbapi_conn.driver_connection.in_transaction:
            raise sa.exc.DisconnectionError("a pooled SQLite connection was left inside a transaction")

    @sa.event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn):  # type: ignore[no-untyped-def]
        # Read-only connections (Book.read) take a deferred BEGIN: in WAL mode they never wait for writers.
        readonly = conn.get_execution_options().get(READ_ONLY_OPTION)
        # Straight to aiosqlite: one thread hand-off instead of the adapter's cursor/execute/close.
        await_(conn.connection.driver_connection.execute("BEGIN" if readonly else "BEGIN IMMEDIATE"))


def upgrade_command(app: str | None = None, *, custom: bool = False) -> str:
    """The command that upgrades the schema: ``statebook db upgrade``, with ``--app`` for an application's
    registry (``custom``: a registry was given and ``app`` is None, its module:attr unknown here; ``app=""``
    says the built-in registry runs)."""
    if app:
        return f"statebook --app {app} db upgrade"
    return "statebook --app MODULE:ATTR db upgrade" if custom and app is None else "statebook db upgrade"


def _refusal(stamp: Stamp, command: str) -> ConfigError:
    if stamp.kind == "empty":
        return ConfigError(f"the database has no statebook schema; run: {command}")
    if stamp.kind == "legacy" and stamp.legacy_version != LEGACY_VERSION:
        return ConfigError(f"the database has the pre-migration schema version {stamp.legacy_version}, which no "
                           f"migration adopts (only {LEGACY_VERSION}); create a new database")
    if stamp.kind == "legacy":
        return ConfigError(f"the database has the pre-migration schema (version {stamp.legacy_version}), this "
                           f"statebook expects revision {HEAD}; run: {command}")
    if stamp.kind == "foreign":
        return ConfigError("the database has statebook tables but no schema stamp this statebook knows; "
                           "use a database written by statebook")
    from .migrations import revisions

    if stamp.revision in revisions():
        return ConfigError(f"the database is at schema revision {stamp.revision}, this statebook expects {HEAD}; "
                           f"run: {command}")
    return ConfigError(f"the database is at schema revision {stamp.revision}, newer than this statebook "
                       f"(expects {HEAD}); upgrade statebook")


def ensure_schema(conn: sa.Connection, registry: Registry, *, create: bool, command: str) -> None:
    """Refuse a database whose schema is not the one this statebook expects; with ``create``, build it.

    Run it with ``await conn.run_sync(ensure_schema, registry, ...)``. An empty database with ``create``
    gets ``create_all`` of the registry's schema and :data:`~.migrations.HEAD` in the version table; a
    database at HEAD has its status CHECKs checked against ``registry`` (and, with ``create``, its
    missing lifecycle tables created). Anything else is a one-line :class:`ConfigError` naming ``command``.
    """
    stamp = read_stamp(conn)
    if stamp.kind == "empty" and create:
        create_tables(conn, registry)
        write_head(conn)
        return
    if stamp.kind != "revision" or stamp.revision != HEAD:
        raise _refusal(stamp, command)
    check_statuses(conn, registry, f": {command}")
    if create:
        create_tables(conn, registry)


async def create_schema(engine: AsyncEngine, clock: Clock = SYSTEM_CLOCK, *, registry: Registry | None = None,
                        app: str | None = None) -> None:
    """Create the schema of an empty database, or check an existing one (:func:`ensure_schema`).

    The status CHECKs and partial-index predicates follow ``registry`` (default: the built-in one),
    whose own tables are created too. An existing table whose CHECK refuses a status the registry
    declares raises :class:`~statebook.lifecycle.errors.SchemaMismatch`, before anything moves; a
    database at another revision is refused with the upgrade command. ``clock`` is kept for callers of
    the version that stamped a time.
    """
    custom = registry is not None
    registry = registry if registry is not None else builtin_registry()
    async with engine.begin() as conn:
        await conn.run_sync(ensure_schema, registry, create=True, command=upgrade_command(app, custom=custom))


_OWNED_SEQUENCES = sa.text(
    "SELECT s.relname FROM pg_class s JOIN pg_depend d ON d.objid = s.oid AND d.classid = 'pg_class'::regclass "
    "JOIN pg_class t ON t.oid = d.refobjid WHERE s.relkind = 'S' AND t.relname = ANY(:names) "
    "AND pg_table_is_visible(t.oid)"
)


async def reset_schema(engine: AsyncEngine) -> None:
    """Delete every row of every statebook table (tests and benchmarks only); the version table stays.

    On PostgreSQL the rows are deleted and the tables' sequences restarted, as ``TRUNCATE ... RESTART
    IDENTITY`` would, at a fraction of its cost on small tables (a TRUNCATE makes new files for every table
    and waits for an exclusive lock on each). Should another table's foreign key refuse the deletes, it
    falls back to ``TRUNCATE ... CASCADE``."""
    tables = metadata.sorted_tables
    async with engine.begin() as conn:
        if engine.dialect.name != "postgresql":
            for table in reversed(tables):
                await conn.execute(sa.delete(table))
            return
        try:
            async with conn.begin_nested():
                for table in reversed(tables):
                    await conn.execute(sa.delete(table))
        except sa.exc.IntegrityError:  # a table outside statebook's references these rows: empty it too
            names = ", ".join(t.name for t in tables)
            await conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
            return
        for (sequence,) in await conn.execute(_OWNED_SEQUENCES, {"names": [t.name for t in tables]}):
            await conn.exec_driver_sql(f'ALTER SEQUENCE "{sequence}" RESTART')


async def open_book(
    url: str | None = None,
    *,
    registry: Registry | None = None,
    clock: Clock | None = None,
    create: bool = True,
    must_exist: bool = False,
    limits: Limits | None = None,
    chain_key: ChainKey | None = None,
    app: str | None = None,
    writes: bool | None = None,
    idle_transaction_seconds: float | None = None,
) -> Book:
    """Connect, create the schema when asked, and return a :class:`Book` over ``registry``.

    ``chain_key`` (settings ``[audit] chain_key``) keys the fact chain (specs/audit.md). A book that
    ``writes`` (default: ``create``) is a writer: given the key, it records the switch-over if the database
    has none, and a database keyed with another key raises :class:`~statebook.lifecycle.chain.ChainKeyMismatch`;
    without a key, a database whose chain is keyed raises :class:`~statebook.lifecycle.chain.ChainKeyRequired`
    (naming how to give the key). Either refusal comes before anything is written. A reader writes nothing;
    should it write anyway, the book refuses as the writer would have (``Book.keyed_with``).

    ``limits`` bounds the JSON its commands may store (default :class:`Limits`; the settings'
    ``[limits]`` section gives one). ``registry`` defaults to the built-in one. Either way its statuses are checked against the
    database's tables first (:class:`~statebook.lifecycle.errors.SchemaMismatch` names what to migrate).
    A database at another schema revision is refused with the command that upgrades it (``app``, the
    registry's module:attr, goes into that command). ``idle_transaction_seconds``: see :func:`connect` (the
    daemon gives its scheduler lease).
    """
    engine = connect(url, must_exist=must_exist, idle_transaction_seconds=idle_transaction_seconds)
    command = upgrade_command(app, custom=registry is not None)
    registry = registry if registry is not None else builtin_registry()
    writes = create if writes is None else writes
    try:
        if create:
            async with engine.begin() as conn:  # a refusal below rolls back whatever the schema step did
                await conn.run_sync(ensure_schema, registry, create=True, command=command)
                keyed_with = await _keyed_with(conn, chain_key, writes)
        else:
            async with engine.connect() as conn:
                await conn.execution_options(**{READ_ONLY_OPTION: True})  # SQLite: no write lock for a look
                await conn.run_sync(ensure_schema, registry, create=False, command=command)
                keyed_with = await _keyed_with(conn, chain_key, writes)
        book = Book(engine, registry, clock or SYSTEM_CLOCK, limits=limits if limits is not None else DEFAULT_LIMITS,
                    chain_key=chain_key, keyed_with=keyed_with)
        if chain_key is not None and writes:
            book = replace(book, keyed_with=(await key_chain(book)).key_id)
    except BaseException:
        await engine.dispose()
        raise
    return book


KEY_HINT = ("give it as [audit] chain_key = {file = \"PATH\"} (or {env = \"VAR\"}) in the settings: --config FILE, or "
            "./statebook.toml; or set STATEBOOK_AUDIT__CHAIN_KEY__FILE (or STATEBOOK_AUDIT__CHAIN_KEY__ENV)")
"""How an operator gives the chain key, for the refusal of a writer without it."""


async def _keyed_with(conn: AsyncConnection, key: ChainKey | None, writes: bool) -> str | None:
    """The id of the key the database's chain is keyed with (its switch-over record), or None. A writer without
    a key is refused here, before it writes."""
    keyed_with = (await conn.execute(sa.select(chain_table.c.key_id).where(chain_table.c.id == 1))).scalar()
    if keyed_with is not None and key is None and writes:
        raise ChainKeyRequired(
            f"this database's fact chain is keyed (key id {keyed_with}), so writing to it needs the chain key: "
            f"{KEY_HINT}; nothing was written")
    return keyed_with
