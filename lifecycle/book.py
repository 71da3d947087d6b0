"""``Book``: the handle domain functions take — a database (its backend's :class:`~.store.Store`,
:class:`~.store.Reads` and :class:`~.store.Upkeep`), the registry and the clock.

A book made from an engine runs each operation in its own transaction. ``async with book.begin() as
tx`` yields a book bound to one open transaction: every operation given ``tx`` joins it, so an
application commits its own rows (``tx.conn``) and a status change atomically.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import TYPE_CHECKING

from sqlalchemy.exc import PendingRollbackError

from .clock import SYSTEM_CLOCK, Clock
from .chain import write_refusal
from .chainkey import ChainKey
from .errors import StorageUnavailable
from .inputs import DEFAULT_LIMITS, Limits
from .policy import Lifecycle, Registry
from .store import Reads, Store, Upkeep, reads_for, store_for, upkeep_for

if TYPE_CHECKING:  # sqlalchemy.ext.asyncio pulls in the ORM (~60 ms): the engine's opener imports it
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger("statebook.lifecycle")

READ_ONLY_OPTION = "statebook_read_only"
"""Execution option marking a connection that only reads (SQLite then uses a deferred BEGIN)."""
TOUCHED = "statebook.touched"
"""``conn.info`` key: the entity types a bound transaction wrote (for ``on_commit``)."""


@dataclass(frozen=True)
class Book:
    """Database handle + registry + clock. Cheap to copy; holds no connection unless bound."""

    engine: AsyncEngine
    registry: Registry
    clock: Clock = SYSTEM_CLOCK
    conn: AsyncConnection | None = None
    on_commit: list[Callable[[str], None]] = field(default_factory=list, compare=False)
    """Callbacks run with an entity type after a transaction that wrote it commits (wake-ups)."""
    limits: Limits = field(default=DEFAULT_LIMITS, compare=False)
    """Bounds on the JSON a command may store (:mod:`.inputs`)."""
    chain_key: ChainKey | None = field(default=None, compare=False, repr=False)
    """The key of a keyed chain (:mod:`.chain`): every fact this book writes is hashed with HMAC-SHA256
    under it, and verify requires it of every fact after the database's switch-over."""
    keyed_with: str | None = field(default=None, compare=False)
    """The id of the key the database's chain is keyed with, as ``open_book`` read its switch-over record
    (None: not keyed, or a Book made directly, which nobody read it for). A write needs that key."""

    @property
    def chain_secret(self) -> bytes | None:
        """The chain key's bytes, for the hash of each fact written (None: a plain chain). Raises
        ``ChainKeyRequired`` (or ``ChainKeyMismatch``) when the database's chain is keyed with a key this book
        does not hold: the engine plans every fact with it, so such a book writes nothing."""
        key = self.chain_key
        if self.keyed_with is not None and (key is None or key.id != self.keyed_with):
            raise write_refusal(self.keyed_with, None if key is None else key.id)
        return None if key is None else key.secret

    def with_chain_key(self, key: ChainKey | None) -> Book:
        """This book writing (and verifying) with ``key``; see :func:`.chain.key_chain` for the switch-over."""
        return replace(self, chain_key=key)

    @cached_property
    def store(self) -> Store:
        """The write port of this book's engine (one backend per engine)."""
        return store_for(self.engine)

    @cached_property
    def reads(self) -> Reads:
        """verify's and audit's reads of this book's engine."""
        return reads_for(self.engine)

    @cached_property
    def upkeep(self) -> Upkeep:
        """The notify and maintain of this book's engine."""
        return upkeep_for(self.engine)

    @property
    def dialect(self) -> str:
        """The backend's name, for messages; code branches on the store, never on this."""
        return self.engine.dialect.name

    def policy(self, entity_type: str) -> Lifecycle:
        """The lifecycle registered for ``entity_type``; raises ``UnknownEntityType`` naming the known types."""
        return self.registry.get(entity_type)

    def with_clock(self, clock: Clock) -> Book:
        """This book reading time from ``clock`` instead (for tests and replays)."""
        return replace(self, clock=clock)

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[BoundBook]:
        """A book bound to one transaction; joins the current one when already bound.

        ``on_commit`` runs once the transaction has committed, for each entity type it wrote.
        """
        if self.conn is not None:
            if self.conn.in_transaction():
                yield self.bound(self.conn)
                return
            async with self.conn.begin():
                yield self.bound(self.conn)
            return
        touched: set[str] = set()
        try:
            async with self.store.begin() as conn:
                conn.info[TOUCHED] = touched
                try:
                    yield self.bound(conn)
                finally:
                    if not conn.invalidated:  # a statement cancelled mid-flight invalidates the connection,
                        conn.info.pop(TOUCHED, None)  # and touching its info would reconnect (outside any greenlet)
        except PendingRollbackError as exc:
            # The connection was lost (invalidated) inside the transaction: the server rolled it back.
            raise StorageUnavailable("the connection was lost inside the transaction; nothing of it was committed: "
                                     "retry", orig=exc) from exc
        for entity_type in touched:
            self.committed(entity_type)

    def bound(self, conn: AsyncConnection) -> BoundBook:
        """This book bound to ``conn`` (an open transaction's connection); ``begin()`` is the usual way."""
        if isinstance(self, BoundBook) and self.conn is conn:
            return self
        return BoundBook(**{name: getattr(self, name) for name in _UNBOUND}, conn=conn)

    def committed(self, entity_type: str) -> None:
        """Run the ``on_commit`` callbacks for a committed write of ``entity_type``."""
        for callback in self.on_commit:
            try:
                callback(entity_type)
            except Exception:  # noqa: BLE001 - the commit happened; a wake-up hook must not undo that
                log.exception("on_commit callback %r failed for %s", callback, entity_type)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A SQLAlchemy connection for reads: the bound one, or a fresh one (never takes a write lock)."""
        if self.conn is not None:
            yield self.conn
            return
        async with self.engine.connect() as conn:
            await conn.execution_options(**{READ_ONLY_OPTION: True})
            yield conn


@dataclass(frozen=True)
class BoundBook(Book):
    """A book bound to one open transaction, as ``async with book.begin() as tx`` gives it: ``tx.conn`` is
    that transaction's SQLAlchemy connection (never None), for the application's own rows."""

    conn: AsyncConnection = field(kw_only=True)


_UNBOUND = tuple(f.name for f in fields(Book) if f.init and f.name != "conn")
