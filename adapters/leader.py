"""Who may evaluate schedules.

PostgreSQL: the daemon holding a session-level advisory lock on a dedicated connection is the
leader; a standby retries on every tick and takes over when the leader's session ends (its lock is
released by the server when the connection dies). SQLite: one daemon per database file, enforced
by an exclusive ``fcntl`` lock on ``<db>.daemon.lock`` held for the daemon's lifetime.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .errors import ConfigError

log = logging.getLogger("statebook.leader")

ADVISORY_KEY = 0x5741_7EB0_0C  # "statebook scheduler"; any constant shared by every daemon


class PostgresLeader:
    """``is_leader()`` tries ``pg_try_advisory_lock`` until it holds it, then checks the session lives."""

    def __init__(self, engine: AsyncEngine, key: int = ADVISORY_KEY) -> None:
        self.engine = engine
        self.key = key
        self._conn: AsyncConnection | None = None
        self.holding = False

    async def is_leader(self) -> bool:
        try:
            if self._conn is None:
                self._conn = await self.engine.connect()
                await self._conn.execution_options(isolation_level="AUTOCOMMIT")
            if self.holding:
                await self._conn.execute(sa.text("SELECT 1"))
                return True
            got = (await self._conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key})).scalar()
            if got:
                log.info("acquired scheduler leadership (advisory lock %d)", self.key)
            self.holding = bool(got)
            return self.holding
        except Exception as exc:  # noqa: BLE001 - a lost session means lost leadership; retry next tick
            log.warning("leadership session failed (%s); standing by", exc)
            await self.release()
            return False

    async def release(self) -> None:
        """Drop the dedicated session: the server releases the lock when the session ends.

        ``close()`` alone would return the connection to the pool with the session (and the lock) alive.
        """
        self.holding = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.invalidate()
            with contextlib.suppress(Exception):
                await conn.close()


class SqliteDaemonLock:
    """An exclusive lock file next to the database; a second daemon on the same file refuses to start."""

    def __init__(self, db_path: str) -> None:
        # realpath, not abspath: a symlink (to the file or to a directory on its path) names the same
        # database, so it must name the same lock.
        self.path = f"{os.path.realpath(db_path)}.daemon.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
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
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
            self._fd = None

    async def is_leader(self) -> bool:
        return self._fd is not None


def leadership_for(engine: AsyncEngine) -> Any:
    """The leadership object for this database (SQLite: the lock is taken here, or ConfigError)."""
    if engine.dialect.name == "postgresql":
        return PostgresLeader(engine)
    database = make_url(str(engine.url)).database
    if not database:
        raise ConfigError("the scheduler needs a SQLite file database")
    lock = SqliteDaemonLock(database)
    lock.acquire()
    return lock
