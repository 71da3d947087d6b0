"""A daemon's liveness signal beside the scheduler lease (S15): a standby that finds the holder's signal gone
knows the holder died and takes the lease at once, instead of waiting for its heartbeat to go stale.

The signal is something the operating system or the database server takes away when a process dies,
and nothing else does:

- PostgreSQL (:class:`SessionLock`): a session-level advisory lock, one key per daemon, held on a
  connection of its own (not the pool's) for the daemon's life. The server releases it the moment that
  session ends — the process was killed, or its connection dropped. A frozen process (SIGSTOP, a VM
  stall) keeps its session and its lock: then only the lease's expiry decides, and the epoch fence.
- SQLite (:class:`SqliteDaemonLock`): the one-daemon file lock (S10). Whoever holds it is the only
  daemon on the file, so any other lease holder is gone.

A standby also *waits* on the holder's lock (PostgreSQL), on a second connection, so a crash wakes it
without waiting for its next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
from typing import Any, Protocol

from .errors import ConfigError

PING_SECONDS = 5.0
"""How long a round trip on the liveness session may take before the session counts as lost"""
WATCH_SECONDS = 5.0
"""How long one wait on the holder's lock lasts before the watcher reads the lease row again"""


class Liveness(Protocol):
    """What the lease asks of a liveness signal (``adapters/leader.py``)."""

    gone_reason: str
    """How a holder whose signal is gone shows itself, for the takeover's log line"""
    waits: bool
    """Whether :meth:`wait_gone` waits for the holder's signal to go (a standby then needs no tick to notice)"""
    generation: int
    """How many times this daemon took its signal: a lease is led under one generation, a new one ends it"""

    def intact(self) -> bool:
        """This daemon's own signal still stands, as far as this process knows without a round trip."""
        ...

    async def hold(self) -> bool:
        """Take this daemon's signal, or prove it still holds it; False when it cannot now (stand by)."""
        ...

    async def gone(self, holder: str) -> bool:
        """Whether the daemon ``holder`` (never this one) has provably lost its signal: it died."""
        ...

    async def wait_gone(self, holder: str) -> bool:
        """Wait a while for ``holder``'s signal to go; True as soon as it is gone, False if it still stands."""
        ...

    async def close(self) -> None:
        """Give this daemon's signal up (idempotent)."""
        ...


def lock_key(name: str, daemon_id: str) -> int:
    """The advisory lock key (a signed 64-bit int) of a daemon on the lease ``name``: one key per daemon.

    >>> lock_key("scheduler", "h:1:a") == lock_key("scheduler", "h:1:a") != lock_key("scheduler", "h:2:b")
    True
    """
    digest = hashlib.blake2b(f"statebook.{name}.{daemon_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class SessionLock:
    """PostgreSQL: this daemon's advisory lock, held on a session of its own; others' locks probed and waited on."""

    gone_reason = "its database session ended (the process died or lost its connection)"
    waits = True

    def __init__(self, dsn: str, daemon_id: str, *, name: str, watch_seconds: float = WATCH_SECONDS) -> None:
        self.dsn = dsn
        self.name = name
        self.key = lock_key(name, daemon_id)
        self.watch_seconds = watch_seconds
        self._session: Any = None
        """the connection holding this daemon's lock (asyncpg); None before the first hold or after a loss"""
        self._held = False
        self.generation = 0
        """bumped by every new session: a leader whose session was replaced stops leading (S15)"""
        self._watch: Any = None
        """a second connection, only for waiting on the holder's lock (a wait keeps its connection busy)"""

    def intact(self) -> bool:
        """True while the session that took this daemon's lock is open (asyncpg sees a dropped socket at once)."""
        return self._held and self._session is not None and not self._session.is_closed()

    async def hold(self) -> bool:
        """A round trip on the session (it still lives), or a new session that takes this daemon's lock."""
        import asyncpg

        if self.intact():
            try:
                await self._session.fetchval("SELECT 1", timeout=PING_SECONDS)
                return True
            except Exception:  # noqa: BLE001
                pass  # not provably alive: end it, so the server frees the lock too, and start over
        self._drop_session()
        self._session = await asyncpg.connect(self.dsn, timeout=PING_SECONDS)
        self.generation += 1
        # False while a standby's probe holds it for an instant, or while the server has not yet noticed
        # that an older session of ours ended: stand by this tick.
        self._held = bool(await self._session.fetchval("SELECT pg_try_advisory_lock($1)", self.key,
                                                       timeout=PING_SECONDS))
        return self._held

    async def gone(self, holder: str) -> bool:
        """Take and at once give back ``holder``'s lock: if it could be taken, the holder's session ended."""
        key = lock_key(self.name, holder)
        return bool(await self._session.fetchval(
            "SELECT CASE WHEN pg_try_advisory_lock($1) THEN pg_advisory_unlock($1) ELSE false END", key,
            timeout=PING_SECONDS))

    async def wait_gone(self, holder: str) -> bool:
        """Wait up to ``watch_seconds`` for ``holder``'s lock (the server's ``lock_timeout`` ends the wait, so no
        cancelled wait is left holding it); take it and give it back at once."""
        import asyncpg

        key = lock_key(self.name, holder)
        if self._watch is None or self._watch.is_closed():
            self._watch = await asyncpg.connect(
                self.dsn, timeout=PING_SECONDS,
                server_settings={"lock_timeout": str(int(self.watch_seconds * 1000))})
        try:
            await self._watch.execute("SELECT pg_advisory_lock($1)", key, timeout=self.watch_seconds + PING_SECONDS)
        except asyncpg.LockNotAvailableError:
            return False
        except BaseException:
            self._watch.terminate()  # a wait cut short on our side may still be granted: end the session
            self._watch = None
            raise
        await self._watch.execute("SELECT pg_advisory_unlock($1)", key, timeout=PING_SECONDS)
        return True

    def _drop_session(self) -> None:
        if self._session is not None:
            self._session.terminate()  # the socket closes now; the server frees the lock when it sees that
        self._session, self._held = None, False

    async def close(self) -> None:
        """End both sessions: this daemon's lock is free, and a standby waiting on it wakes."""
        for conn in (self._watch, self._session):
            if conn is not None and not conn.is_closed():
                try:
                    await asyncio.wait_for(conn.close(), PING_SECONDS)
                except Exception:  # noqa: BLE001 - closing: a terminated socket frees the lock as well
                    conn.terminate()
        self._watch, self._session, self._held = None, None, False


class SqliteDaemonLock:
    """An exclusive lock file next to the database; a second daemon on the same file refuses to start."""

    gone_reason = "it no longer holds the database's daemon lock (its process ended)"
    waits = False
    generation = 1
    """the lock is taken once, for the daemon's life"""

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

    # -- as the lease's liveness signal -------------------------------------------------------------
    def intact(self) -> bool:
        """True while this process holds the lock file."""
        return self._fd is not None

    async def hold(self) -> bool:
        """The lock is taken once, at start (:meth:`acquire`): True while it is held."""
        return self.intact()

    async def gone(self, holder: str) -> bool:
        """Every other holder: while this daemon holds the file's only daemon lock, no other daemon runs."""
        return self.intact()

    async def wait_gone(self, holder: str) -> bool:
        """No wait is needed: see :meth:`gone`."""
        return self.intact()

    async def close(self) -> None:
        """Release the lock file."""
        self.release()
