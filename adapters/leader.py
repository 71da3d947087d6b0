"""Who may evaluate schedules: a lease row with a heartbeat and a fencing epoch (S10, S14-S17).

``scheduler_leases`` holds one row: holder, epoch, heartbeat time (from the book's clock). The
leader renews it on every tick; a standby takes it over once the heartbeat is older than the lease,
with a compare-and-set that bumps the epoch. Every transaction that writes for a fire first
*fences*: it reads the row (PostgreSQL: ``FOR SHARE``, held to the commit, so a takeover waits for
it; SQLite: the transaction already holds the write lock) and rolls back unless this daemon still
holds it at its epoch — a leader that wakes up after losing the lease writes nothing.
``scheduler_daemons`` holds every daemon's heartbeat; the leader reaps runs of stale ones.

SQLite also keeps its one-daemon file lock, ``<db>.daemon.lock`` (the lease runs there too, same code).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from statebook.lifecycle import Book
from statebook.scheduler.errors import LeadershipLost
from statebook.scheduler.schema import scheduler_daemons, scheduler_leases

from .errors import ConfigError

log = logging.getLogger("statebook.leader")

LEASE = "scheduler"
TAKEOVER_LOCK_TIMEOUT_MS = 2000
"""PostgreSQL: how long a takeover waits for a fence still holding the row (a leader frozen mid-fire)"""


class LeaseLeader:
    """The :class:`statebook.scheduler.leadership.Leader` of one daemon, on either backend."""

    def __init__(self, book: Book, daemon_id: str, *, lease_seconds: float, name: str = LEASE,
                 daemon_lock: SqliteDaemonLock | None = None) -> None:
        self.book = book
        self.daemon_id = daemon_id
        self.lease_seconds = lease_seconds
        self.name = name
        self.epoch: int | None = None
        """the epoch this daemon leads under; None while standing by"""
        self.valid_until = float("-inf")
        """the clock time until which the last renewal (or takeover) keeps the lease this daemon's"""
        self._lock = daemon_lock
        self._postgres = book.dialect == "postgresql"

    # -- the tick ---------------------------------------------------------------------------
    async def is_leader(self) -> bool:
        """Renew this daemon's heartbeat and lease, or take over a stale lease; True while this daemon leads. A
        database error counts as not leading.
        """
        now = self.book.clock.now()
        try:
            if await self._heartbeat(now):
                return True
            if self.epoch is not None:
                log.warning("daemon %s lost scheduler leadership (epoch %d was taken over)", self.daemon_id, self.epoch,
                            extra={"event": "leadership", "daemon_id": self.daemon_id, "epoch": self.epoch,
                                   "leader": False})
                self.epoch = None
            return await self._take_over(now)
        except Exception as exc:  # noqa: BLE001 - no answer from the database: stand by this tick, fences decide
            log.warning("leadership check failed (%s); standing by this tick", exc)
            return False

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
        """Take the lease if nobody holds it or its heartbeat is stale: a compare-and-set on the epoch."""
        lease = scheduler_leases
        cutoff = now - self.lease_seconds
        try:
            async with self.book.begin() as tx:
                assert tx.conn is not None
                if self._postgres:  # a fence of a frozen leader holds the row: try again next tick
                    await tx.conn.execute(sa.text(f"SET LOCAL lock_timeout = {TAKEOVER_LOCK_TIMEOUT_MS}"))
                row = (await tx.conn.execute(sa.select(lease).where(lease.c.name == self.name))).first()
                if row is None:
                    epoch = 1
                    await tx.conn.execute(sa.insert(lease).values(
                        name=self.name, holder=self.daemon_id, epoch=epoch, heartbeat_at=now, acquired_at=now))
                elif row.heartbeat_at >= cutoff:
                    return False  # a live leader
                else:
                    epoch = row.epoch + 1
                    moved = await tx.conn.execute(
                        sa.update(lease).where(lease.c.name == self.name, lease.c.epoch == row.epoch,
                                               lease.c.heartbeat_at < cutoff)
                        .values(holder=self.daemon_id, epoch=epoch, heartbeat_at=now, acquired_at=now))
                    if moved.rowcount != 1:
                        return False  # renewed or taken by someone else meanwhile
        except IntegrityError:
            return False  # another daemon inserted the first lease row first
        previous = f" from {row.holder} (heartbeat {now - row.heartbeat_at:.1f}s old)" if row is not None else ""
        log.info("daemon %s took the scheduler lease at epoch %d%s", self.daemon_id, epoch, previous,
                 extra={"event": "leadership", "daemon_id": self.daemon_id, "epoch": epoch, "leader": True})
        self.epoch = epoch
        self.valid_until = now + self.lease_seconds
        return True

    # -- inside a fire's transaction ------------------------------------------------------------
    async def fence(self, tx: Book) -> int | None:
        """Check, inside ``tx``, that this daemon still holds the lease and return its epoch; raises
        ``LeadershipLost`` when it does not, so nothing is written.
        """
        lease = scheduler_leases
        assert tx.conn is not None
        if self.epoch is None:
            raise LeadershipLost(f"daemon {self.daemon_id} does not hold the scheduler lease; nothing written")
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
        """True while the lease held is valid at ``now`` (no database round trip)."""
        return self.epoch is not None and now < self.valid_until

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
        """At a clean stop: give the lease up (a standby takes it on its next tick) and drop the heartbeat."""
        lease, d = scheduler_leases, scheduler_daemons
        try:
            async with self.book.begin() as tx:
                assert tx.conn is not None
                if self.epoch is not None:
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
            if self._lock is not None:
                self._lock.release()


class SqliteDaemonLock:
    """An exclusive lock file next to the database; a second daemon on the same file refuses to start."""

    def __init__(self, db_path: str) -> None:
        # realpath, not abspath: a symlink (to the file or to a directory on its path) names the same
        # database, so it must name the same lock.
        self.path = f"{os.path.realpath(db_path)}.daemon.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the exclusive lock file; raises ``ConfigError`` naming the holder when another daemon runs on the
        same SQLite file.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise ConfigError(
                f"another statebook daemon is already running on this database (lock {self.path}"
                f"{', pid ' + holder if holder else ''}); stop it first or use a different --db"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release and close the lock file (idempotent)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
            self._fd = None


def leadership_for(book: Book, daemon_id: str, *, lease_seconds: float) -> LeaseLeader:
    """The leadership of a daemon on this database (SQLite: the file lock is taken here, or ConfigError)."""
    lock = None
    if book.dialect != "postgresql":
        database = make_url(str(book.engine.url)).database
        if not database:
            raise ConfigError("the scheduler needs a SQLite file database")
        lock = SqliteDaemonLock(database)
        lock.acquire()
    return LeaseLeader(book, daemon_id, lease_seconds=lease_seconds, daemon_lock=lock)
