"""The storage port: what a backend implements, on one page (specs/lifecycle.md L17).

The engine decides everything — policy checks, the compare-and-set conditions, each fact and the
row it projects — and hands the plan to the book's :class:`Store`. A backend (``statebook.adapters.sqlite``,
``statebook.adapters.postgres``) turns plans into statements; every line of dialect-specific SQL
lives there, never in ``lifecycle/``, ``outbox/`` or ``scheduler/``. A single command is a batch of
one: create, transition, batches, purge and idempotent replay all pass through the same methods.
Plans are plain values (:class:`RowWrite`), so a backend needs no knowledge of lifecycles.

:class:`Store`, the write port (ten members):

- ``unit``: a write unit (:class:`Unit`): joins the bound transaction, or runs one of its own.
- ``reader``: a unit for reads only: the bound transaction, or one consistent snapshot.
- ``begin``: a SQLAlchemy connection in a new write transaction of the backend (``Book.begin``).
- ``histories``: which ids already have facts (a purged id is never reused).
- ``rows``: columns of the rows with the given ids, locked as :data:`Lock` says.
- ``facts_by_key``: the facts that (entity id, idempotency key) pairs produced (idempotent replay).
- ``insert``: new rows and their creation facts; a unique clash is skipped (``if_absent``) or raises.
- ``update``: compare-and-set updates (version, status, chain head, guards) and the facts of the rows updated.
- ``delete``: the same compare-and-set as a DELETE (purge), with the tombstone facts.
- ``select``: the rows of a dialect-neutral query, compiled once and kept.

:class:`Reads`, verify's and audit's reads (a protocol of its own: ``sweep.py``, ``chain.py``, ``replay.py``,
``facts.tail``):

- ``snapshot``: a read transaction in which every cursor sees one snapshot.
- ``lenient`` / ``undecodable``: read text that is not UTF-8 (only damage stores it), and tell that failure.
- ``batches``: a query's rows streamed as tuples, about ``size`` at a time.
- ``in_id_order``: a column to order by so that ids sort in code point order.
- ``file_screen``: a database file verify may screen on connections of its own, or None.
- ``tail_query``: facts committed after a cursor, in an order no later commit can jump ahead of.
- ``settle``: wait until no running writer can still commit a fact below the highest committed seq.

:class:`Upkeep`, besides reads and writes (either may do nothing):

- ``notify``: tell listeners on a channel, once the unit commits.
- ``maintain``: periodic housekeeping (SQLite: a WAL checkpoint).

Query building that every backend shares is not a port member: ``queries.ids_in`` and
``queries.lock_rows`` are plain functions (each backend compiles ``ids_in`` to its own SQL).
A backend registers one object implementing all three protocols (:func:`register_backend`); the
accessors :func:`store_for`, :func:`reads_for` and :func:`upkeep_for` find it.

A :class:`Unit` is one transaction of the engine's statements (or, on PostgreSQL, a single
statement in autocommit). A backend serialises its own writers where its database needs it
(SQLite: one writer queue per database file, shared by every part of the process).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol
import weakref

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from .facts import Cursor

Lock = Literal["wait", "skip_locked"] | None
"""How a read that precedes writes holds its rows: ``wait`` for them, ``skip_locked`` rows another
transaction holds, or None (no row locks). SQLite's single writer makes every choice ``None``."""


@dataclass(frozen=True)
class RowWrite:
    """One planned row write and the fact that records it.

    ``values`` are the row's new column values (insert: every column; update: the patch and the
    lifecycle columns), ``expect`` the compare-and-set condition: ``version``, ``status``,
    ``last_fact_id``, ``chain_hash`` and the guarded columns as the plan read them (empty for an
    insert; a delete compares ``version`` and ``last_fact_id``).
    ``fact`` is the stored form of the fact (``facts.stored_values``).
    """

    entity_id: str
    values: Mapping[str, Any]
    fact: Mapping[str, Any]
    expect: Mapping[str, Any] = field(default_factory=dict)
    guards: tuple[str, ...] = ()


@dataclass
class Unit:
    """One unit of the engine's work: a backend's open transaction (``handle``) and what it wrote.

    ``wrote`` collects entity types; the Book runs its ``on_commit`` callbacks for them once the
    unit's transaction has committed (wake-ups that must never fire for a rolled-back write).
    """

    handle: Any
    wrote: set[str] = field(default_factory=set)


class Store(Protocol):
    """The write port: what the engine needs of a database. See the module docstring."""

    def unit(
        self, bound: AsyncConnection | None, *, one_statement: bool = False
    ) -> AbstractAsyncContextManager[Unit]:
        """A write unit: joins ``bound``'s transaction, or runs its own (committed on exit, rolled
        back on an exception). ``one_statement`` promises a single statement (PostgreSQL may run it
        in autocommit)."""

    def reader(self, bound: AsyncConnection | None) -> AbstractAsyncContextManager[Unit]:
        """A unit for reads only: ``bound``'s transaction, or one consistent snapshot."""

    def begin(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A SQLAlchemy connection in a new write transaction of this backend (``Book.begin``)."""

    async def histories(self, unit: Unit, entity_type: str, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` that already have facts (a purged history: never reused)."""

    async def rows(
        self, unit: Unit, table: sa.Table, columns: Sequence[str], ids: Sequence[str], *, lock: Lock = None
    ) -> list[dict[str, Any]]:
        """``columns`` of the rows whose id is in ``ids`` (any order)."""

    async def facts_by_key(
        self, unit: Unit, entity_type: str, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """The facts that (entity id, idempotency key) pairs produced: id, status, version, digest."""

    async def insert(
        self, unit: Unit, table: sa.Table, writes: Sequence[RowWrite], *, if_absent: bool,
        notify: str | None = None,
    ) -> set[str]:
        """Insert rows and their creation facts; the ids inserted. ``notify`` names a channel told
        each new id on commit (PostgreSQL ``NOTIFY``; nothing on SQLite)."""

    async def update(self, unit: Unit, table: sa.Table, writes: Sequence[RowWrite]) -> set[str]:
        """Compare-and-set updates and the facts of the rows updated; the ids updated."""

    async def delete(self, unit: Unit, table: sa.Table, writes: Sequence[RowWrite]) -> set[str]:
        """Compare-and-set deletes and their tombstone facts; the ids deleted."""

    async def select(self, unit: Unit, query: sa.Select[Any], params: Mapping[str, Any] | None = None, *,
                     lock: Lock = None) -> list[dict[str, Any]]:
        """Rows of a dialect-neutral query as mappings; ``lock`` applies to the rows read. The query
        is compiled once and kept: build it once (with bind parameters), not per call."""


class Reads(Protocol):
    """verify's and audit's reads: how to read a whole history consistently, fast, and damaged."""

    def snapshot(self, conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """A read transaction on ``conn`` (not in one yet) in which every cursor sees one snapshot."""

    def lenient(self, conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """Meanwhile ``conn`` reads text that is not UTF-8 with U+FFFD for the bad bytes (no-op where none is stored)."""

    def undecodable(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a read that failed on text that is not UTF-8 (read again under :meth:`lenient`)."""

    def batches(self, conn: AsyncConnection, query: sa.Select[Any], size: int
                ) -> AsyncGenerator[Sequence[Sequence[Any]], None]:
        """The rows of ``query`` as tuples, about ``size`` at a time, streamed inside ``conn``'s transaction."""

    def in_id_order(self, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        """``column`` to order by so that text sorts in code point order (Python's)."""

    def file_screen(self, bound: AsyncConnection | None) -> FileScreen | None:
        """The database file that verify may screen on connections of its own, or None (unbound SQLite file only)."""

    def tail_query(self, cursor: Cursor, limit: int) -> sa.Select[Any]:
        """Facts committed after ``cursor``, in an order no later commit can jump ahead of (``facts.tail``)."""

    async def settle(self, timeout: float) -> None:
        """Return once every fact with a seq up to the highest committed before the call is final: no writer
        still running can commit one below it. PostgreSQL draws a seq at insert and commits in any order, so
        it waits for the transactions running now to end (``StorageUnavailable`` after ``timeout`` seconds);
        SQLite's single writer draws seqs above everything committed, so it returns at once. A checkpoint
        and the keyed chain's switch-over pin the facts up to a seq: they settle first (:mod:`.chain`)."""


class Upkeep(Protocol):
    """What a backend does besides reads and writes; either may do nothing."""

    async def notify(self, unit: Unit | None, channel: str, payload: str) -> None:
        """Tell listeners on ``channel`` (after ``unit`` commits, or now). No-op without LISTEN."""

    async def maintain(self) -> None:
        """Periodic housekeeping the backend needs (SQLite: a WAL checkpoint)."""


class Backend(Store, Reads, Upkeep, Protocol):
    """One backend: the object :func:`register_backend` makes per engine implements all three protocols."""


class FileScreen(Protocol):
    """A database file whose ranges verify screens off the book's connection: in a thread of this
    process, and in worker processes (``screen.Worker``) that import only what :attr:`worker` names."""

    path: str
    """The file, for messages."""

    worker: tuple[str, tuple[str, ...]]
    """``("module:function", directories)``: what a worker process imports (after appending the
    directories to ``sys.path``, standard library only) and calls with each :meth:`job`."""

    def job(self, spec: tuple[Any, ...], facts: sa.Select[Any], rows: sa.Select[Any]) -> tuple[Any, ...]:
        """The arguments (plain data) that screen one range: a ``Screen.spec`` and the range's two queries."""

    def screen(self, job: tuple[Any, ...]) -> tuple[int, int, list[Any]]:
        """Screen one :meth:`job` here, blocking (run it in a thread): (entities, facts, suspects).
        Raises :class:`~.errors.StorageError` when the file cannot be read on a connection of its own."""


def members(protocol: type) -> tuple[str, ...]:
    """The names a backend must implement for ``protocol`` (its methods and attributes)."""
    names = [n for n in vars(protocol) if not n.startswith("_")]
    names += [n for n in vars(protocol).get("__annotations__", {}) if n not in names]
    return tuple(names)


PROTOCOLS: tuple[type, ...] = (Store, Reads, Upkeep)

_factories: dict[str, Callable[[AsyncEngine], Backend]] = {}
_stores: weakref.WeakKeyDictionary[Any, Backend] = weakref.WeakKeyDictionary()


def missing(backend: type) -> list[str]:
    """``Protocol.member`` for each member of the three protocols that ``backend`` lacks."""
    return [f"{p.__name__}.{m}" for p in PROTOCOLS for m in members(p) if not hasattr(backend, m)]


def register_backend(dialect: str, factory: Callable[[AsyncEngine], Backend]) -> None:
    """Make ``factory`` the backend of engines of ``dialect`` (``statebook.adapters`` registers both).
    A class that lacks a member of :class:`Store`, :class:`Reads` or :class:`Upkeep` is refused, naming it."""
    if isinstance(factory, type):
        lacking = missing(factory)
        if lacking:
            raise TypeError(f"{factory.__name__} is no statebook backend: it lacks {', '.join(lacking)} "
                            "(lifecycle/store.py lists what a backend implements)")
    _factories[dialect] = factory


def _backend(engine: AsyncEngine) -> Backend:
    """The one backend object of ``engine`` (made on first use, kept while the engine lives)."""
    key = engine.sync_engine
    found = _stores.get(key)
    if found is None:
        factory = _factories.get(engine.dialect.name)
        if factory is None:
            raise LookupError(
                f"no statebook storage backend for {engine.dialect.name!r}; open the database with "
                "statebook.adapters.db.open_book or connect (SQLite and PostgreSQL are supported)"
            )
        found = _stores[key] = factory(engine)
    return found


def store_for(engine: AsyncEngine) -> Store:
    """The write port of ``engine``'s backend."""
    return _backend(engine)


def reads_for(engine: AsyncEngine) -> Reads:
    """verify's and audit's reads of ``engine``'s backend."""
    return _backend(engine)


def upkeep_for(engine: AsyncEngine) -> Upkeep:
    """The notify and maintain of ``engine``'s backend."""
    return _backend(engine)
