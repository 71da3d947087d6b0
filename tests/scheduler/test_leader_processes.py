"""Leadership with real processes (S14-S17): two `statebook run` daemons on one PostgreSQL, the
leader frozen with SIGSTOP, the standby takes over within the lease, the old leader is woken with
SIGCONT and writes nothing; no occurrence fires twice.

Short settings (tick 0.3 s, lease 3 s) keep it to a few seconds of waiting; every wait is bounded
and the daemons are stopped (and, failing that, killed with their process groups) in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import history, verify
from statebook.scheduler.schema import scheduler_daemons, scheduler_leases

from sched_helpers import make, runs_of

LEASE = 3.0  # ten ticks: a loaded machine does not make the leader lapse by itself
WAIT = 45.0  # the longest any one step may take before the test fails


async def until(what: str, check):
    """Poll ``check`` (a coroutine function returning a truthy value) for at most WAIT seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        found = await check()
        if found:
            return found
        if loop.time() > deadline:
            pytest.fail(f"gave up after {WAIT:g}s waiting for {what}")
        await asyncio.sleep(0.1)


def start_daemon(url: str, tmp_path: Path, name: str) -> subprocess.Popen:
    env = {**os.environ, "STATEBOOK_SCHEDULER__TICK_SECONDS": "0.3", "STATEBOOK_SCHEDULER__LEASE_SECONDS": str(LEASE),
           "STATEBOOK_SCHEDULER__REAPER_INTERVAL_SECONDS": "0.5", "STATEBOOK_LAUNCHER__CWD": str(tmp_path),
           "STATEBOOK_SCHEDULER__MAX_CONCURRENT": "8"}
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


@pytest.mark.postgres
async def test_sigstopped_leader_is_replaced_and_fires_nothing_after_waking(pg_url, tmp_path):
    """S14-S17, S1: freeze the leader; the standby takes the lease (epoch 2) within the lease plus a tick;
    the woken old leader writes no run and no claim; every occurrence fired once; verify ok."""
    book = await open_book(pg_url)
    await reset_schema(book.engine)
    procs: list[subprocess.Popen] = []
    try:
        s = await make(book, interval_sec=1, overlap_policy="allow")

        async def lease():
            async with book.read() as conn:
                return (await conn.execute(sa.select(scheduler_leases))).first()

        async def fired_by(daemon: str, at_least: int):
            runs = [r for r in await runs_of(book, s["id"]) if r["daemon_id"] == daemon and r["status"] != "skipped"]
            return len(runs) >= at_least

        procs.append(start_daemon(pg_url, tmp_path, "a"))
        a_id = (await until("daemon a to lead", lease)).holder
        procs.append(start_daemon(pg_url, tmp_path, "b"))

        async def two_daemons():
            async with book.read() as conn:
                return len((await conn.execute(sa.select(scheduler_daemons))).all()) == 2

        await until("daemon b to heartbeat", two_daemons)
        await until("a to fire twice", lambda: fired_by(a_id, 2))

        os.kill(procs[0].pid, signal.SIGSTOP)
        taken = await until("the standby to take the lease", lambda: _taken(lease, a_id))
        assert taken.epoch == 2
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
        before = len(await runs_of(book, s["id"]))
        b_so_far = len([r for r in await runs_of(book, s["id"]) if r["daemon_id"] == b_id and r["status"] != "skipped"])
        await until("b to fire twice more with a awake", lambda: fired_by(b_id, b_so_far + 2))
        assert (await lease()).holder == b_id

        stop(procs[0])  # the old leader first, so the lease never comes back to it
        stop(procs[1])

        runs = await runs_of(book, s["id"])
        assert len(runs) > before
        fired = [r for r in runs if r["status"] != "skipped"]
        twice = [at for at, n in Counter(r["occurrence_at"] for r in fired).items() if n > 1]
        assert twice == [], f"occurrences fired twice: {twice}"
        for r in fired:
            epoch = r["trigger_context"]["leader_epoch"]
            assert (r["daemon_id"], epoch) in ((a_id, 1), (b_id, 2)), r
            if r["daemon_id"] == a_id:
                assert r["fired_at"] < taken.acquired_at, "the old leader fired after losing the lease"
        claims = [f.reason_summary for f in await history(book, "schedule", s["id"])
                  if f.reason_code == "schedule.active.fire_claimed"]
        assert len(claims) == len(set(claims)) == len(fired)
        assert not [r for r in runs if r["status"] == "running"], "S3: a run was left running"
        assert (await verify(book)).ok
    finally:
        for proc in procs:
            stop(proc)
        await book.engine.dispose()


async def _taken(lease, old: str):
    row = await lease()
    return row if row is not None and row.holder != old else None
