"""Leadership with real processes (S14-S17): `statebook run` daemons, the leader killed, stopped or frozen.

- SIGKILL the leader of two daemons on PostgreSQL: its session (and the liveness lock it held) ends with
  the process, so the standby takes over within 2 s, with the default tick (30 s) and lease (90 s) (S15).
- SIGKILL the only daemon on a SQLite file and start another: the daemon lock is free, so the new
  daemon leads on its first tick (S10, S15).
- SIGTERM the leader: it releases the lease, the standby takes it at once and its log says so (S14).
- SIGSTOP the leader: the standby takes over after the lease; woken with SIGCONT, the old leader
  writes nothing (S15, S16); no occurrence fires twice.

Every test prints its takeover figures (one ``takeover ...`` line): ``pytest -s`` shows them
(specs/scheduler.md records them). Every wait is bounded and the daemons are stopped (and, failing
that, killed with their process groups) in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import history, verify
from statebook.scheduler.schema import scheduler_daemons, scheduler_leases

from conformance.scheduler.support import make, runs_of

# Serial: real daemons racing for the lease, SIGKILL and SIGSTOP, takeovers bounded in seconds.
pytestmark = pytest.mark.serial

LEASE = 3.0  # ten ticks: a loaded machine does not make the leader lapse by itself
WAIT = 45.0  # the longest any one step may take before the test fails
CRASH_BOUND = 2.0
"""S15's rule itself: a leader that died is replaced within 2 s (asserted, with the figure printed)"""
CRASH_WAIT = 15.0  # how long a crash test waits for any takeover (a lease-long wait fails here)


async def until(what: str, check, wait: float = WAIT):
    """Poll ``check`` (a coroutine function returning a truthy value) for at most ``wait`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        found = await check()
        if found:
            return found
        if loop.time() > deadline:
            pytest.fail(f"gave up after {wait:g}s waiting for {what}")
        await asyncio.sleep(0.05)


def start_daemon(url: str, tmp_path: Path, name: str, *, tick: float = 0.3, lease: float = LEASE) -> subprocess.Popen:
    env = {**os.environ, "STATEBOOK_SCHEDULER__TICK_SECONDS": str(tick),
           "STATEBOOK_SCHEDULER__LEASE_SECONDS": str(lease),
           "STATEBOOK_SCHEDULER__REAPER_INTERVAL_SECONDS": "0.5", "STATEBOOK_LAUNCHER__CWD": str(tmp_path),
           "STATEBOOK_SCHEDULER__MAX_CONCURRENT": "40"}
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process below
    return subprocess.Popen([str(Path(sys.executable).parent / "statebook"), "--db", url, "run"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def kill(proc: subprocess.Popen) -> float:
    """SIGKILL the daemon (a crash: no release, no goodbye); the time it was killed."""
    at = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    return at


def report(what: str, **seconds: float) -> None:
    """The figures of one takeover, on one line (``pytest -s`` shows it)."""
    print(f"\ntakeover {what}: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}s" for k, v in seconds.items()))


class Watch:
    """Reads of one database while daemons run on it: the lease row, heartbeats, fires."""

    def __init__(self, book) -> None:
        self.book = book

    async def lease(self):
        async with self.book.read() as conn:
            return (await conn.execute(sa.select(scheduler_leases))).first()

    async def taken_from(self, old: str):
        row = await self.lease()
        return row if row is not None and row.holder != old else None

    async def daemons(self) -> dict[str, float]:
        async with self.book.read() as conn:
            rows = await conn.execute(sa.select(scheduler_daemons.c.daemon_id, scheduler_daemons.c.started_at))
            return {r.daemon_id: r.started_at for r in rows}

    async def fired(self, daemon: str | None = None) -> list[dict]:
        runs = [r for r in await runs_of(self.book) if r["status"] != "skipped"]
        return [r for r in runs if daemon is None or r["daemon_id"] == daemon]

    async def each_once(self) -> None:
        """S1: no occurrence of any schedule fired twice; no run left running (S3); the history verifies."""
        fired = await self.fired()
        twice = [k for k, n in Counter((r["schedule_id"], r["occurrence_at"]) for r in fired).items() if n > 1]
        assert twice == [], f"occurrences fired twice: {twice}"
        assert not [r for r in fired if r["status"] == "running"], "S3: a run was left running"
        assert (await verify(self.book)).ok


async def interval_schedules(book, count: int) -> list[dict]:
    """``count`` schedules every 1 or 2 s whose action is /bin/true (cheap to launch many times)."""
    return [await make(book, f"s{i}", interval_sec=1 + i % 2, overlap_policy="allow", action_command="/bin/true",
                       action_command_args=[]) for i in range(count)]


async def settled(watch: Watch) -> None:
    """Wait until no run is left running (a killed daemon's runs are reaped, S3)."""
    async def none_running():
        return not [r for r in await watch.fired() if r["status"] == "running"]

    await until("the runs left running to be reaped", none_running)


@pytest.mark.postgres
async def test_a_killed_leader_is_replaced_within_two_seconds(pg_url, tmp_path):
    """S15, S1: two daemons on PostgreSQL (the default tick, 30 s, and lease, 90 s), 20 schedules of 1-2 s;
    SIGKILL the leader: its session and liveness lock end with it, so the standby takes the lease at epoch 2
    within 2 s — not a lease, nor a tick, later — and fires from then on; its log says the holder's session
    ended; every occurrence fired once."""
    book = await open_book(pg_url)
    await reset_schema(book.engine)
    watch = Watch(book)
    procs: list[subprocess.Popen] = []
    try:
        await interval_schedules(book, 20)
        procs.append(start_daemon(pg_url, tmp_path, "a", tick=30, lease=90))
        a_id = (await until("daemon a to lead", watch.lease)).holder
        procs.append(start_daemon(pg_url, tmp_path, "b", tick=30, lease=90))
        await until("daemon b to heartbeat", lambda: _count(watch.daemons, 2))
        await until("a to fire 20 runs", lambda: _count(lambda: watch.fired(a_id), 20))

        killed_at = kill(procs[0])
        taken = await until("the standby to take the lease", lambda: watch.taken_from(a_id), CRASH_WAIT)
        b_id = taken.holder
        await until("b to fire 20 runs", lambda: _count(lambda: watch.fired(b_id), 20))
        last_a = max(r["fired_at"] for r in await watch.fired(a_id))
        first_b = min(r["fired_at"] for r in await watch.fired(b_id))
        report("after a crash, PostgreSQL (tick 30 s, lease 90 s)", kill_to_lease=taken.acquired_at - killed_at,
               kill_to_first_fire=first_b - killed_at, no_fire_for=first_b - last_a)
        assert taken.epoch == 2
        assert taken.acquired_at - killed_at < CRASH_BOUND, "a crashed leader was not replaced within 2 s"
        await settled(watch)
        stop(procs[1])
        assert {r["trigger_context"]["leader_epoch"] for r in await watch.fired(b_id)} == {2}
        await watch.each_once()
        took = [line for line in (tmp_path / "b.log").read_text().splitlines() if "took the scheduler lease" in line]
        assert len(took) == 1 and f"from {a_id}" in took[0] and "session ended" in took[0], took
    finally:
        for proc in procs:
            stop(proc)
        await book.engine.dispose()


async def test_a_restarted_sqlite_daemon_leads_on_its_first_tick(tmp_path):
    """S10, S15: SIGKILL the only daemon on a SQLite file (tick 30 s, lease 90 s) and start another: the daemon
    lock freed with the process, so no other daemon can hold the lease and the new one takes it on its first
    tick (the tick that wrote its first heartbeat), saying why; every occurrence fired once."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    book = await open_book(url)
    watch = Watch(book)
    procs: list[subprocess.Popen] = []
    try:
        await interval_schedules(book, 5)
        procs.append(start_daemon(url, tmp_path, "a", tick=30, lease=90))
        a_id = (await until("daemon a to lead", watch.lease)).holder
        await until("a to fire 5 runs", lambda: _count(lambda: watch.fired(a_id), 5))

        killed_at = kill(procs[0])
        started_at = time.time()
        procs.append(start_daemon(url, tmp_path, "c", tick=30, lease=90))
        taken = await until("the restarted daemon to take the lease", lambda: watch.taken_from(a_id), CRASH_WAIT)
        c_id = taken.holder
        await until("c to fire 5 runs", lambda: _count(lambda: watch.fired(c_id), 5))
        first_c = min(r["fired_at"] for r in await watch.fired(c_id))
        report("after a restart, SQLite (tick 30 s, lease 90 s)", start_to_lease=taken.acquired_at - started_at,
               kill_to_first_fire=first_c - killed_at)
        assert taken.epoch == 2
        assert taken.acquired_at == (await watch.daemons())[c_id], "the restarted daemon did not lead on its first tick"
        await settled(watch)
        stop(procs[1])
        await watch.each_once()
        took = [line for line in (tmp_path / "c.log").read_text().splitlines() if "took the scheduler lease" in line]
        assert len(took) == 1 and f"from {a_id}" in took[0] and "daemon lock" in took[0], took
    finally:
        for proc in procs:
            stop(proc)
        await book.engine.dispose()


@pytest.mark.postgres
async def test_a_stopped_leader_hands_over_at_once_and_the_log_says_released(pg_url, tmp_path):
    """S14: SIGTERM the leader of two daemons (tick 30 s): it releases the lease, and the standby takes it within
    2 s (woken by the leader's session ending, not by its next tick); its log says the lease was released, not
    that a heartbeat was stale."""
    book = await open_book(pg_url)
    await reset_schema(book.engine)
    watch = Watch(book)
    procs: list[subprocess.Popen] = []
    try:
        await interval_schedules(book, 5)
        procs.append(start_daemon(pg_url, tmp_path, "a", tick=30, lease=90))
        a_id = (await until("daemon a to lead", watch.lease)).holder
        procs.append(start_daemon(pg_url, tmp_path, "b", tick=30, lease=90))
        await until("daemon b to heartbeat", lambda: _count(watch.daemons, 2))
        await until("a to fire 5 runs", lambda: _count(lambda: watch.fired(a_id), 5))

        stopped_at = time.time()
        stop(procs[0])
        taken = await until("the standby to take the lease", lambda: watch.taken_from(a_id), CRASH_WAIT)
        [released] = [line for line in (tmp_path / "a.log").read_text().splitlines()
                      if "released the scheduler lease (epoch 1)" in line]
        released_at = datetime.fromisoformat(released.split()[0]).timestamp()
        report("after a clean stop, PostgreSQL (tick 30 s, lease 90 s)", stop_to_lease=taken.acquired_at - stopped_at,
               release_to_lease=taken.acquired_at - released_at)
        assert taken.epoch == 2
        assert taken.acquired_at - released_at < CRASH_BOUND, "a released lease waited for the standby's tick"
        stop(procs[1])
        took = [line for line in (tmp_path / "b.log").read_text().splitlines() if "took the scheduler lease" in line]
        assert len(took) == 1 and f"{a_id} released it" in took[0] and "heartbeat" not in took[0], took
        await watch.each_once()
    finally:
        for proc in procs:
            stop(proc)
        await book.engine.dispose()


async def _count(read, at_least: int) -> bool:
    return len(await read()) >= at_least


@pytest.mark.postgres
async def test_sigstopped_leader_is_replaced_and_fires_nothing_after_waking(pg_url, tmp_path):
    """S14-S17, S1: freeze the leader; it keeps its session and its liveness lock, so the standby takes the lease
    (epoch 2) only after the lease, plus a tick; the woken old leader writes no run and no claim; every
    occurrence fired once; verify ok."""
    book = await open_book(pg_url)
    await reset_schema(book.engine)
    watch = Watch(book)
    procs: list[subprocess.Popen] = []
    try:
        s = await make(book, interval_sec=1, overlap_policy="allow")

        async def fired_by(daemon: str, at_least: int):
            return len(await watch.fired(daemon)) >= at_least

        procs.append(start_daemon(pg_url, tmp_path, "a"))
        a_id = (await until("daemon a to lead", watch.lease)).holder
        procs.append(start_daemon(pg_url, tmp_path, "b"))
        await until("daemon b to heartbeat", lambda: _count(watch.daemons, 2))
        await until("a to fire twice", lambda: fired_by(a_id, 2))

        frozen_at = time.time()
        os.kill(procs[0].pid, signal.SIGSTOP)
        await asyncio.sleep(0.2)  # a renewal already sent commits; then the heartbeat stands still
        last_beat = (await watch.lease()).heartbeat_at
        taken = await until("the standby to take the lease", lambda: watch.taken_from(a_id))
        report(f"after a freeze, PostgreSQL (tick 0.3 s, lease {LEASE:g} s)",
               freeze_to_lease=taken.acquired_at - frozen_at, last_heartbeat_to_lease=taken.acquired_at - last_beat)
        assert taken.epoch == 2
        assert taken.acquired_at - last_beat >= LEASE, "a frozen leader (session alive) was replaced before its lease"
        b_id = taken.holder
        await until("b to fire twice", lambda: fired_by(b_id, 2))

        os.kill(procs[0].pid, signal.SIGCONT)
        woke_at = taken.acquired_at

        async def a_standing_by():  # its heartbeat moves again: it is awake, and still not the holder
            async with book.read() as conn:
                beat = (await conn.execute(sa.select(scheduler_daemons.c.heartbeat_at)
                                           .where(scheduler_daemons.c.daemon_id == a_id))).scalar()
            return beat is not None and beat > woke_at + LEASE

        await until("a to wake and stand by", a_standing_by)
        before = len(await runs_of(book, s.id))
        b_so_far = len(await watch.fired(b_id))
        await until("b to fire twice more with a awake", lambda: fired_by(b_id, b_so_far + 2))
        assert (await watch.lease()).holder == b_id

        stop(procs[0])  # the old leader first, so the lease never comes back to it
        stop(procs[1])

        runs = await runs_of(book, s.id)
        assert len(runs) > before
        fired = [r for r in runs if r["status"] != "skipped"]
        for r in fired:
            epoch = r["trigger_context"]["leader_epoch"]
            assert (r["daemon_id"], epoch) in ((a_id, 1), (b_id, 2)), r
            if r["daemon_id"] == a_id:
                assert r["fired_at"] < taken.acquired_at, "the old leader fired after losing the lease"
        claims = [f.reason_summary for f in await history(book, "schedule", s.id)
                  if f.reason_code == "schedule.active.fire_claimed"]
        assert len(claims) == len(set(claims)) == len(fired)
        await watch.each_once()
        took = [line for line in (tmp_path / "b.log").read_text().splitlines() if "took the scheduler lease" in line]
        assert len(took) == 1 and "heartbeat" in took[0] and "older than the 3s lease" in took[0], took
    finally:
        for proc in procs:
            stop(proc)
        await book.engine.dispose()
