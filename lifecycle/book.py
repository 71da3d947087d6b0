"""``Book``: the handle domain functions take — a database, the registry and the clock.

A book made from an engine opens its own transaction per operation. ``async with book.begin() as
tx`` yields a book bound to one open transaction: every operation given ``tx`` joins it, so an
application commits its own rows and a status change atomically.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from .clock import SYSTEM_CLOCK, Clock
from .driver import Driver, driver
from .policy import Lifecycle, Registry


log = logging.getLogger("statebook.lifecycle")

READ_ONLY_OPTION = "statebook_read_only"
"""Execution option marking a connection that only reads (SQLite then uses a deferred BEGIN)."""


@dataclass(frozen=True)
class Book:
    """Database handle + registry + clock. Cheap to copy; holds no connection unless bound."""

    engine: AsyncEngine
    registry: Registry
    clock: Clock = SYSTEM_CLOCK
    conn: AsyncConnection | None = None
    on_commit: list[Callable[[str], None]] = field(default_factory=list, compare=False)
    """Callbacks run with an entity type after a transaction that wrote it commits (wake-ups)."""

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def policy(self, entity_type: str) -> Lifecycle:
        return self.registry.get(entity_type)

    def with_clock(self, clock: Clock) -> Book:
        return replace(self, clock=clock)

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[Book]:
        """A book bound to one transaction; joins the current one when already bound."""
        if self.conn is not None:
            if self.conn.in_transaction():
                yield self
                return
            async with self.conn.begin():
                yield self
            return
        touched: set[str] = set()
        async with self.engine.begin() as conn:
            bound = replace(self, conn=conn)
            conn.info["statebook.touched"] = touched
            yield bound
        for entity_type in touched:
            self.committed(entity_type)

    def committed(self, entity_type: str) -> None:
        """Run the ``on_commit`` callbacks for a committed write of ``entity_type``."""
        for callback in self.on_commit:
            try:
                callback(entity_type)
            except Exception:  # noqa: BLE001 - the commit happened; a wake-up hook must not undo that
                log.exception("on_commit callback %r failed for %s", callback, entity_type)

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Driver]:
        """The driver of a pooled connection outside any transaction, for a write that is ONE
        statement (atomic by itself): it runs without BEGIN/COMMIT round trips."""
        if self.dialect != "postgresql":
            async with self.engine.connect() as conn:
                yield await driver(conn)
            return
        # A bare pool checkout (no Connection object): a quarter of engine.connect()'s CPU. Nothing
        # is begun, so asyncpg runs the statement outside any transaction.
        fairy = await self.engine.raw_connection()
        try:
            yield Driver(self.engine.dialect, fairy.driver_connection)
        except BaseException as exc:
            # A cancelled statement or a lost connection leaves the connection unusable: drop it.
            if not isinstance(exc, Exception) or fairy.driver_connection.is_closed():
                fairy.invalidate()
            raise
        finally:
            fairy.close()

    @asynccontextmanager
    async def unit(self) -> AsyncIterator[Unit]:
        """The engine's writes in one transaction: the bound one (joined), or their own
        (:meth:`transaction`). ``on_commit`` runs for the entity types added to ``unit.wrote`` once
        they are committed."""
        if self.conn is not None:
            async with self.begin() as tx:
                assert tx.conn is not None
                work = Unit(await driver(tx.conn))
                yield work
                for entity_type in work.wrote:
                    mark_touched(tx.conn, entity_type)
            return
        async with self.transaction() as db:
            work = Unit(db)
            yield work
        for entity_type in work.wrote:
            self.committed(entity_type)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Driver]:
        """A write transaction of the engine's own statements on a bare pooled driver connection.

        For units of work statebook runs on an unbound book: BEGIN (``BEGIN IMMEDIATE`` on SQLite),
        the statements, COMMIT — without SQLAlchemy's Connection and transaction objects around them.
        Any exception rolls back. The caller runs :meth:`committed` after it, as it has written.
        """
        if self.conn is not None:
            raise RuntimeError("Book.transaction() is for unbound books; a bound book joins its transaction")
        fairy = await self.engine.raw_connection()
        db = Driver(self.engine.dialect, fairy.driver_connection)
        broken = False
        try:
            await db.begin()
            try:
                yield db
            except BaseException:
                try:
                    await db.rollback()
                except BaseException:
                    broken = True
                raise
            await db.commit()
        except BaseException as exc:
            broken = broken or not isinstance(exc, Exception) or db.closed()
            raise
        finally:
            if broken:
                fairy.invalidate()
            if db.postgresql:
                fairy.close()
            else:  # the adapter's reset (if the engine has one) needs SQLAlchemy's greenlet
                await greenlet_spawn(fairy.close)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A connection for reads: the bound one, or a fresh one."""
        if self.conn is not None:
            yield self.conn
            return
        async with self.engine.connect() as conn:
            await conn.execution_options(**{READ_ONLY_OPTION: True})
            yield conn


@dataclass
class Unit:
    """One unit of the engine's writes (:meth:`Book.unit`): its driver and the entity types written."""

    db: Driver
    wrote: set[str] = field(default_factory=set)


def mark_touched(conn: AsyncConnection, entity_type: str) -> None:
    touched: Any = conn.info.get("statebook.touched")
    if touched is not None:
        touched.add(entity_type)
