"""No double fire (S1) and the single-daemon lock on SQLite (S10, S15); the lease is in
tests/conformance/scheduler/cases_leadership.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from statebook.adapters.db import connect, open_book, reset_schema
from statebook.adapters.errors import ConfigError
from statebook.adapters.leader import LeaseLeader, SqliteDaemonLock, leadership_for
from statebook.lifecycle import Book, FakeClock, verify
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.errors import LeadershipLost

from conformance.scheduler.support import FakeSpawner, make, runs_of, settings


@pytest.mark.postgres
async def test_two_engines_on_one_postgres_fire_every_occurrence_once(pg_url):
    """S1: two engines on separate connection pools ticking interleaved and concurrently claim each occurrence once."""
    clock = FakeClock(1_800_000_000)
    a_book = await open_book(pg_url, clock=clock)
    await reset_schema(a_book.engine)
    b_book = Book(connect(pg_url), a_book.registry, clock)
    try:
        schedules = [await make(a_book, f"s{i}", interval_sec=5, overlap_policy="allow") for i in range(3)]
        a = SchedulerEngine(a_book, settings(max_concurrent=50), clock=clock, launcher=FakeSpawner())
        b = SchedulerEngine(b_book, settings(max_concurrent=50), clock=clock, launcher=FakeSpawner())
        await a.start(loop=False)
        await b.start(loop=False)
        for step in range(40):
            clock.advance(5)
            if step % 2:
                await asyncio.gather(a.tick(), b.tick())
            else:
                await b.tick()
                await a.tick()
        await a.wait_idle()
        await b.wait_idle()
        for s in schedules:
            runs = await runs_of(a_book, s.id)
            occurrences = [r["occurrence_at"] for r in runs]
            assert len(occurrences) == 40
            assert len(set(occurrences)) == 40, "an occurrence fired twice"
        assert a.stats["fired"] > 0 and b.stats["fired"] > 0
        await a.stop()
        await b.stop()
        assert (await verify(a_book)).ok
    finally:
        await a_book.engine.dispose()
        await b_book.engine.dispose()


async def test_second_sqlite_daemon_refuses_to_start(tmp_path):
    """S10: a second daemon on the same SQLite file is refused with a clear message; released locks free it."""
    db = tmp_path / "s.db"
    book = await open_book(f"sqlite:///{db}")
    try:
        first = leadership_for(book, "h:1:a", lease_seconds=90)
        assert await first.is_leader()
        with pytest.raises(ConfigError, match="another statebook daemon is already running"):
            leadership_for(book, "h:2:b", lease_seconds=90)
        await first.release()
        again = leadership_for(book, "h:2:b", lease_seconds=90)
        assert await again.is_leader()
        await again.release()
    finally:
        await book.engine.dispose()


async def test_a_restarted_sqlite_daemon_takes_the_lease_of_a_dead_one_at_once(tmp_path, caplog):
    """S10, S15: the daemon holding the lease dies without releasing it (its file lock freed with the process); the
    next daemon on the file, holding the lock, knows no other daemon runs and takes the lease on its first tick
    — the clock never moved — saying why."""
    db = tmp_path / "s.db"
    clock = FakeClock(1_800_000_000)
    book = await open_book(f"sqlite:///{db}", clock=clock)
    try:
        # the daemon that died: its lease row and heartbeat stay; its flock went with its process
        first = LeaseLeader(book, "h:1:a", lease_seconds=90)
        assert await first.is_leader() and first.epoch == 1
        again = leadership_for(book, "h:2:b", lease_seconds=90)
        with caplog.at_level(logging.INFO, logger="statebook.leader"):
            assert await again.is_leader() and again.epoch == 2
        assert [r.getMessage() for r in caplog.records if "took the scheduler lease" in r.getMessage()] == [
            "daemon h:2:b took the scheduler lease at epoch 2 from h:1:a: it no longer holds the database's daemon "
            "lock (its process ended); heartbeat 0.0s old"]
        async with book.begin() as tx:
            with pytest.raises(LeadershipLost):
                await first.fence(tx)
        await again.release()
    finally:
        await book.engine.dispose()


def test_second_daemon_process_is_refused(tmp_path):
    """S10: the lock holds across processes (a real second `statebook run`)."""
    import subprocess
    import sys

    db = tmp_path / "s.db"
    lock = SqliteDaemonLock(str(db))
    lock.acquire()
    try:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "statebook"), "--db", f"sqlite:///{db}", "run", "--for", "1"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )
    finally:
        lock.release()
    assert proc.returncode == 2
    assert "another statebook daemon is already running" in proc.stderr


async def test_sqlite_daemon_lock_sees_through_a_symlink(tmp_path):
    """S10: the one-daemon lock is named after the file itself, so a symlink to the database is the same database."""
    db = tmp_path / "s.db"
    book = await open_book(f"sqlite:///{db}")
    link = tmp_path / "link.db"
    link.symlink_to(db)
    via_dir = tmp_path / "dirlink"
    via_dir.symlink_to(tmp_path, target_is_directory=True)
    try:
        first = SqliteDaemonLock(str(db))
        first.acquire()
        try:
            for other in (link, via_dir / "s.db"):
                with pytest.raises(ConfigError, match="another statebook daemon is already running"):
                    SqliteDaemonLock(str(other)).acquire()
        finally:
            first.release()
    finally:
        await book.engine.dispose()
