"""Who may evaluate schedules: a lease row with a heartbeat and a fencing epoch, and a liveness signal (S10, S14-S17).

``scheduler_leases`` holds one row: holder, epoch, heartbeat time (from the book's clock). The
leader renews it on every tick. A standby takes it over, with a compare-and-set that bumps the epoch,
once the holder released it, or died — its liveness signal (``adapters/liveness.py``: a session
advisory lock on PostgreSQL, the daemon file lock on SQLite) is gone — or its heartbeat is older than
the lease (it is frozen, or cut off). Every transaction that writes for a fire first *fences*: it
reads the row (PostgreSQL: ``FOR SHARE``, held to the commit, so a takeover waits for it; SQLite: the
transaction already holds the write lock) and rolls back unless this daemon still holds it at its
epoch — a leader that wakes up after losing the lease writes nothing. A leader whose own liveness
signal ends stops leading, and fences nothing more, before a standby can take over.
``scheduler_daemons`` holds every daemon's heartbeat; the leader reaps runs of stale ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from statebook.lifecycle import Book
from statebook.scheduler.errors import LeadershipLost
from statebook.scheduler.schema import scheduler_daemons, scheduler_leases

from .errors import ConfigError
from .liveness import WATCH_SECONDS, Liveness, SessionLock, SqliteDaemonLock
from .pgnotify import asyncpg_dsn

__all__ = ["LeaseLeader", "SqliteDaemonLock", "leadership_for"]

log = logging.getLogger("statebook.leader")

LEASE = "scheduler"
TAKEOVER_LOCK_TIMEOUT_MS = 2000
"""PostgreSQL: how long a takeover waits for a fence still holding the row (a leader frozen mid-fire)"""
WATCH_PAUSE = 0.2
"""The watcher's pause after a wake whose takeover has not happened yet (doubling up to WATCH_SECONDS)"""

FIRST, RELEASED, GONE, STALE, OWN = "first", "released", "holder_gone", "stale", "own"
"""Why a lease was taken: none before, its holder released it, died, went silent; or it was ours"""


class LeaseLeader:
    """The :class:`statebook.scheduler.leadership.Leader` of one daemon, on either backend."""

    def __init__(self, book: Book, daemon_id: str, *, lease_seconds: float, name: str = LEASE,
                 liveness: Liveness | None = None) -> None:
        self.book = book
        self.daemon_id = daemon_id
        self.lease_seconds = lease_seconds
        self.name = name
        self.epoch: int | None = None
        """the epoch this daemon leads under; None while standing by"""
        self.valid_until = float("-inf")
        """the clock time until which the last renewal (or takeover) keeps the lease this daemon's"""
        self.liveness = liveness
        """this daemon's liveness signal; None: takeovers wait for a stale heartbeat or a release"""
        self._postgres = book.dialect == "postgresql"
        self._generation = 0
        """the liveness generation this daemon took its epoch under"""
        self._seen_gone: tuple[str, int] | None = None
        """(holder, epoch) whose liveness the watcher saw end: the next tick need not probe it again"""
        self._watcher: asyncio.Task[None] | None = None

    # -- the tick ---------------------------------------------------------------------------
    async def is_leader(self) -> bool:
        """Renew this daemon's heartbeat and lease, or take the lease over (released, holder gone, or stale);
        True while this daemon leads. A database error counts as not leading.
        """
        now = self.book.clock.now()
        try:
            if not await self._hold_liveness():
                await self._heartbeat(now)  # alive, only unable to lead: its runs are not to be reaped
                return False
            if await self._heartbeat(now):
                return True
            if self.epoch is not None:
                self._lost(f"daemon {self.daemon_id} lost scheduler leadership (epoch {self.epoch} was taken over)")
            return await self._take_over(now)
        except Exception as exc:  # noqa: BLE001 - no answer from the database: stand by this tick, fences decide
            log.warning("leadership check failed (%s); standing by this tick", exc)
            return False

    async def _hold_liveness(self) -> bool:
        """(Re)take or prove this daemon's liveness signal; a leader whose signal ended, or could not be proved,
        stops leading: a standby may have taken the lease the moment it ended (a new epoch is taken below if
        nobody did)."""
        if self.liveness is None:
            return True
        try:
            held = await self.liveness.hold()
        except Exception as exc:  # noqa: BLE001 - cannot prove it is alive: it may not lead this tick
            log.warning("daemon %s cannot hold its liveness signal (%s); standing by this tick", self.daemon_id, exc)
            held = False
        if self.epoch is not None and not (held and self._signal_intact()):
            self._lost(f"daemon {self.daemon_id} lost its liveness signal while leading at epoch {self.epoch}; "
                       "it stops leading")
        return held

    def _signal_intact(self) -> bool:
        """This daemon's liveness signal stands, and is the one it took its epoch under."""
        return self.liveness is None or (self.liveness.intact() and self.liveness.generation == self._generation)

    def _lost(self, message: str) -> None:
        log.warning("%s", message, extra={"event": "leadership", "daemon_id": self.daemon_id, "epoch": self.epoch,
                                          "leader": False})
        self.epoch = None

    async def _heartbeat(self, now: float) -> bool:
        """Renew this daemon's heartbeat and, when leading, the lease; True if the lease was renewed."""
        d, lease = scheduler_daemons, scheduler_leases
        async with self.book.begin() as tx:
            assert tx.conn is not None
            beat = await tx.conn.execute(sa.update(d).where(d.c.daemon_id == self.daemon_id).values(heartbeat_at=now))
            if beat.rowcount == 0:
                await tx.conn.execute(sa.insert(d).values(daemon_id=self.daemon_id, heartbeat_at=now, started_at=now))
            if self.epoch is None:
                return False
            renewed = await tx.conn.execute(
                sa.update(lease).where(lease.c.name == self.name, lease.c.holder == self.daemon_id,
                                       lease.c.epoch == self.epoch).values(heartbeat_at=now))
        if renewed.rowcount == 1:
            self.valid_until = now + self.lease_seconds
            return True
        return False

    async def _take_over(self, now: float) -> bool:
        """Take the lease if nobody holds it or its holder is gone: a compare-and-set on the epoch."""
        lease = scheduler_leases
        cutoff = now - self.lease_seconds
        try:
            async with self.book.begin() as tx:
                assert tx.conn is not None
                if self._postgres:  # a fence of a frozen leader holds the row: try again next tick
                    await tx.conn.execute(sa.text(f"SET LOCAL lock_timeout = {TAKEOVER_LOCK_TIMEOUT_MS}"))
                row = (await tx.conn.execute(sa.select(lease).where(lease.c.name == self.name))).first()
                why: str | None
                if row is None:
                    epoch, why = 1, FIRST
                    await tx.conn.execute(sa.insert(lease).values(
                        name=self.name, holder=self.daemon_id, epoch=epoch, heartbeat_at=now, acquired_at=now))
                else:
                    why = await self._vacancy(tx.conn, row, cutoff)
                    if why is None:
                        return False  # a live leader
                    epoch = row.epoch + 1
                    guard = [lease.c.name == self.name, lease.c.epoch == row.epoch, lease.c.holder == row.holder]
                    if why == STALE:  # a renewal in between proves the holder alive after all
                        guard.append(lease.c.heartbeat_at < cutoff)
                    moved = await tx.conn.execute(sa.update(lease).where(*guard).values(
                        holder=self.daemon_id, epoch=epoch, heartbeat_at=now, acquired_at=now))
                    if moved.rowcount != 1:
                        return False  # renewed or taken by someone else meanwhile
        except IntegrityError:
            return False  # another daemon inserted the first lease row first
        log.info("%s", self._took_line(epoch, why, row, now),
                 extra={"event": "leadership", "daemon_id": self.daemon_id, "epoch": epoch, "leader": True,
                        "reason": why, "previous": row.holder if row is not None else None})
        self.epoch = epoch
        self.valid_until = now + self.lease_seconds
        self._generation = self.liveness.generation if self.liveness is not None else 0
        return True

    async def _vacancy(self, conn: Any, row: Any, cutoff: float) -> str | None:
        """Why the lease in ``row`` may be taken now, or None while its holder leads."""
        if row.holder == self.daemon_id:
            return OWN  # not leading, yet the row names this daemon: its own hold has ended (see _hold_liveness)
        d = scheduler_daemons
        if (await conn.execute(sa.select(d.c.daemon_id).where(d.c.daemon_id == row.holder))).first() is None:
            return RELEASED  # a clean stop drops the heartbeat row in the transaction that gives the lease up
        if self.liveness is not None and (
                self._seen_gone == (row.holder, row.epoch) or await self.liveness.gone(row.holder)):
            return GONE
        return STALE if row.heartbeat_at < cutoff else None

    def _took_line(self, epoch: int, why: str, row: Any, now: float) -> str:
        took = f"daemon {self.daemon_id} took the scheduler lease at epoch {epoch}"
        if why == FIRST:
            return f"{took} (no daemon held it before)"
        if why == OWN:
            return f"daemon {self.daemon_id} took the scheduler lease back at epoch {epoch} (its hold of epoch " \
                   f"{row.epoch} had ended)"
        if why == RELEASED:
            return f"{took}: {row.holder} released it (a clean stop)"
        age = f"heartbeat {now - row.heartbeat_at:.1f}s old"
        if why == GONE:
            assert self.liveness is not None
            return f"{took} from {row.holder}: {self.liveness.gone_reason}; {age}"
        return f"{took} from {row.holder}: its {age}, older than the {self.lease_seconds:g}s lease"

    # -- between ticks --------------------------------------------------------------------------
    def watch(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` (the engine's loop) the moment the lease holder's liveness signal ends, so a standby
        takes over without waiting for its next tick (PostgreSQL; a no-op where the signal cannot be waited on).
        Stopped by :meth:`release`."""
        if self.liveness is not None and self.liveness.waits and self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(wake), name="statebook-leader-watch")

    async def _watch(self, wake: Callable[[], None]) -> None:
        assert self.liveness is not None
        lease = scheduler_leases
        pause = WATCH_PAUSE
        while True:
            try:
                if self.epoch is not None:  # leading: nobody to watch (a lost lease shows on the next tick)
                    await asyncio.sleep(WATCH_SECONDS)
                    continue
                async with self.book.read() as conn:
                    row = (await conn.execute(sa.select(lease.c.holder, lease.c.epoch)
                                              .where(lease.c.name == self.name))).first()
                if row is None or row.holder == self.daemon_id:
                    await asyncio.sleep(WATCH_SECONDS)  # no holder to watch: nobody yet, or this daemon's own hold
                elif (row.holder, row.epoch) == self._seen_gone:
                    await asyncio.sleep(pause)  # woken already; the tick has not taken it (yet): its ticks retry
                    pause = min(2 * pause, WATCH_SECONDS)
                elif await self.liveness.wait_gone(row.holder):
                    self._seen_gone, pause = (row.holder, row.epoch), WATCH_PAUSE
                    log.info("daemon %s saw the liveness signal of scheduler leader %s end; waking its engine",
                             self.daemon_id, row.holder)
                    wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the ticks still take over; the watcher only hurries them
                log.warning("watching the scheduler leader failed (%s); retrying in %gs", exc, WATCH_SECONDS)
                await asyncio.sleep(WATCH_SECONDS)

    # -- inside a fire's transaction ------------------------------------------------------------
    async def fence(self, tx: Book) -> int | None:
        """Check, inside ``tx``, that this daemon still holds the lease and return its epoch; raises
        ``LeadershipLost`` when it does not, so nothing is written.
        """
        lease = scheduler_leases
        assert tx.conn is not None
        if self.epoch is None:
            raise LeadershipLost(f"daemon {self.daemon_id} does not hold the scheduler lease; nothing written")
        if not self._signal_intact():
            lost, self.epoch = self.epoch, None  # a standby may hold the lease by now, or any moment
            raise LeadershipLost(f"daemon {self.daemon_id} led at epoch {lost} but its liveness signal ended; "
                                 "nothing written, standing by")
        query = sa.select(lease.c.holder, lease.c.epoch).where(lease.c.name == self.name)
        if self._postgres:
            # The row stays share-locked to the commit, so no takeover commits in between; and if this
            # process freezes with the transaction open, the server ends the session after a lease.
            query = query.add_columns(sa.func.set_config(
                "idle_in_transaction_session_timeout", str(int(self.lease_seconds * 1000)), True,
            )).with_for_update(read=True, of=lease)
        row = (await tx.conn.execute(query)).first()
        if row is None or row.holder != self.daemon_id or row.epoch != self.epoch:
            lost, self.epoch = self.epoch, None
            now = f"held by {row.holder} at epoch {row.epoch}" if row is not None else "gone"
            raise LeadershipLost(f"daemon {self.daemon_id} led at epoch {lost} but the lease is now {now}; "
                                 "nothing written, standing by")
        return self.epoch

    def holds(self, now: float) -> bool:
        """True while the lease held is valid at ``now`` by its last renewal and this daemon's liveness signal
        still stands (no database round trip)."""
        return self.epoch is not None and now < self.valid_until and self._signal_intact()

    # -- reaping --------------------------------------------------------------------------------
    async def stale_owners(self, owners: Iterable[str]) -> set[str]:
        """The daemons among ``owners`` whose heartbeat is older than a lease: their runs may be reclaimed."""
        ids = sorted(set(owners))
        if not ids:
            return set()
        d = scheduler_daemons
        cutoff = self.book.clock.now() - self.lease_seconds
        async with self.book.read() as conn:
            rows = await conn.execute(sa.select(d.c.daemon_id).where(d.c.daemon_id.in_(ids), d.c.heartbeat_at < cutoff))
            return {r.daemon_id for r in rows}

    async def release(self) -> None:
        """At a clean stop: give the lease up and drop the heartbeat (one transaction: a standby reads the
        missing heartbeat as "released"), then the liveness signal, which wakes a waiting standby."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        lease, d = scheduler_leases, scheduler_daemons
        try:
            async with self.book.begin() as tx:
                assert tx.conn is not None
                if self.epoch is not None:
                    # a lease into the past as well: any standby (of any version) may take it at once
                    await tx.conn.execute(
                        sa.update(lease).where(lease.c.name == self.name, lease.c.holder == self.daemon_id,
                                               lease.c.epoch == self.epoch)
                        .values(heartbeat_at=self.book.clock.now() - 2 * self.lease_seconds))
                await tx.conn.execute(sa.delete(d).where(d.c.daemon_id == self.daemon_id))
            if self.epoch is not None:
                log.info("daemon %s released the scheduler lease (epoch %d)", self.daemon_id, self.epoch,
                         extra={"event": "leadership", "daemon_id": self.daemon_id, "epoch": self.epoch,
                                "leader": False})
        except Exception as exc:  # noqa: BLE001 - the lease lapses by itself
            log.warning("could not release the scheduler lease (%s); it lapses after %gs", exc, self.lease_seconds)
        finally:
            self.epoch = None
            if self.liveness is not None:
                with contextlib.suppress(Exception):
                    await self.liveness.close()


def leadership_for(book: Book, daemon_id: str, *, lease_seconds: float) -> LeaseLeader:
    """The leadership of a daemon on this database, with its liveness signal (PostgreSQL: a session advisory
    lock, taken on the first tick; SQLite: the file lock, taken here, or ConfigError)."""
    liveness: Liveness
    if book.dialect == "postgresql":
        liveness = SessionLock(asyncpg_dsn(book), daemon_id, name=LEASE)
    else:
        database = make_url(str(book.engine.url)).database
        if not database:
            raise ConfigError("the scheduler needs a SQLite file database")
        lock = SqliteDaemonLock(database)
        lock.acquire()
        liveness = lock
    return LeaseLeader(book, daemon_id, lease_seconds=lease_seconds, liveness=liveness)
