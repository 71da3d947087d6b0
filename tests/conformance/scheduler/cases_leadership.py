"""Leadership as a lease (S10, S14-S17), in one process on a FakeClock, on both backends.

Two :class:`LeaseLeader` objects stand for two daemons (on SQLite the file lock would refuse the
second daemon; the lease underneath is the same code), without a liveness signal: a takeover waits
for a release or a stale heartbeat. ``test_leader_liveness.py`` adds PostgreSQL's session lock,
``test_leader_processes.py`` does it with real processes (SIGKILL, SIGTERM, SIGSTOP).
"""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from statebook.adapters.leader import LeaseLeader
from statebook.lifecycle import history, verify
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.errors import LeadershipLost
from statebook.scheduler.recovery import _LIVE_DAEMONS
from statebook.scheduler.schema import scheduler_daemons, scheduler_leases
from statebook.scheduler.store import get_schedule, schedule_row

from .support import FakeSpawner, make, runs_of, settings

LEASE = 15.0
TICK = 5


def daemon(book, clock, name: str, spawner=None) -> tuple[SchedulerEngine, LeaseLeader]:
    leader = LeaseLeader(book, name, lease_seconds=LEASE)
    eng = SchedulerEngine(book, settings(tick_seconds=TICK, lease_seconds=LEASE, max_concurrent=10), clock=clock,
                          launcher=spawner or FakeSpawner(), leader=leader, daemon_id=name)
    return eng, leader


def took(caplog) -> list[tuple[str, str | None, str]]:
    """The takeover lines logged: (``reason``, ``previous``, message)."""
    return [(r.reason, r.previous, r.getMessage()) for r in caplog.records
            if getattr(r, "event", None) == "leadership" and "took the scheduler lease" in r.getMessage()]


async def lease_row(book):
    async with book.read() as conn:
        return (await conn.execute(sa.select(scheduler_leases))).one()


class LeadershipCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    async def test_one_leader_renews_and_a_standby_waits(self, book, rival, clock):
        """S14: the first daemon takes the lease (epoch 1) and renews it every tick; a standby evaluates nothing."""
        s = await make(book, interval_sec=TICK)
        a, lead_a = daemon(book, clock, "host-a:1:a")
        b, lead_b = daemon(rival, clock, "host-b:2:b")
        await a.start(loop=False)
        await b.start(loop=False)
        assert (lead_a.epoch, lead_b.epoch) == (1, None)
        for _ in range(6):  # 30 s, twice the lease: renewals keep it
            clock.advance(TICK)
            await b.tick()
            await a.tick()
            await a.wait_idle()
        row = await lease_row(book)
        assert (row.holder, row.epoch, row.heartbeat_at) == ("host-a:1:a", 1, clock.now())
        assert a.stats["fired"] == 6 and b.stats["fired"] == 0
        assert {r["trigger_context"]["leader_epoch"] for r in await runs_of(book, s.id)} == {1}
        await a.stop()
        await b.stop()

    async def test_standby_takes_over_a_stale_lease_and_the_old_leader_writes_nothing(self, book, rival, clock, caplog):
        """S15, S16: once the leader's heartbeat is older than the lease the standby takes over with epoch 2, its
        log saying the heartbeat was stale; the old leader, waking with due rows it read before, is fenced: no
        claim, no run, and it stands by."""
        s = await make(book, interval_sec=TICK, overlap_policy="allow")
        a, lead_a = daemon(book, clock, "host-a:1:a")
        b, lead_b = daemon(rival, clock, "host-b:2:b")
        await a.start(loop=False)
        await b.start(loop=False)
        clock.advance(TICK)
        await a.tick()
        await a.wait_idle()
        stale = await schedule_row(book, s.id)  # what A read just before it froze
        clock.advance(LEASE - 1)
        await b.tick()
        assert lead_b.epoch is None, "took over before the lease ran out"
        clock.advance(2)
        with caplog.at_level(logging.INFO, logger="statebook.leader"):
            await b.tick()  # A's heartbeat is now older than the lease
        assert lead_b.epoch == 2 and (await lease_row(book)).holder == "host-b:2:b"
        assert took(caplog) == [("stale", "host-a:1:a", "daemon host-b:2:b took the scheduler lease at epoch 2 from "
                                 "host-a:1:a: its heartbeat 16.0s old, older than the 15s lease")]
        await b.wait_idle()
        fired_by_b = await runs_of(book, s.id)
        # A wakes up: it still believes it leads (epoch 1) and goes on with the row it read.
        assert lead_a.epoch == 1
        with pytest.raises(LeadershipLost, match="epoch 2"):
            await a.consider_many([stale], clock.now())
        assert await runs_of(book, s.id) == fired_by_b
        assert lead_a.epoch is None
        await a.tick()  # standing by now: renews its heartbeat, evaluates nothing
        assert a.stats["fired"] == 1 and await runs_of(book, s.id) == fired_by_b
        epochs = [(r["daemon_id"], r["trigger_context"]["leader_epoch"]) for r in fired_by_b]
        assert epochs[0] == ("host-a:1:a", 1) and set(epochs[1:]) == {("host-b:2:b", 2)}
        occurrences = [r["occurrence_at"] for r in fired_by_b]
        assert len(occurrences) == len(set(occurrences))
        await a.stop()
        await b.stop()
        assert (await verify(book)).ok

    async def test_a_fenced_single_claim_writes_nothing(self, book, rival, clock):
        """S16: the single-schedule paths (missed fire, github cadence) are fenced too."""
        s = await make(book, interval_sec=TICK)
        g = await make(book, "g", trigger_type="github_poll", github_repo="octo/repo", interval_sec=None,
                       poll_interval_sec=60)
        a, lead_a = daemon(book, clock, "host-a:1:a")
        b, lead_b = daemon(rival, clock, "host-b:2:b")
        await a.start(loop=False)
        clock.advance(LEASE + 1)
        await b.start(loop=False)  # takes the stale lease; b's own start handles the missed fires
        assert lead_b.epoch == 2
        row, grow = await schedule_row(book, s.id), await schedule_row(book, g.id)
        before = (len(await history(book, "schedule", s.id)), len(await history(book, "schedule", g.id)))
        clock.advance(60)  # both due again; a still believes it leads at epoch 1
        with pytest.raises(LeadershipLost):
            await a.firing.missed(dict(row), clock.now())
        lead_a.epoch = 1  # (a lost fence forgets the epoch; put a back in its frozen belief for the second path)
        with pytest.raises(LeadershipLost):
            await a.consider(dict(grow), clock.now())
        after = (len(await history(book, "schedule", s.id)), len(await history(book, "schedule", g.id)))
        assert after == before
        await a.stop()
        await b.stop()

    async def test_leader_reaps_runs_of_a_daemon_whose_heartbeat_is_stale(self, book, rival, clock):
        """S3, S17: a run owned by a daemon on another host ends failed (daemon_died) once its heartbeat is
        older than the lease, on the leader's reaper; a live owner's run is left alone."""
        s = await make(book, interval_sec=1000, overlap_policy="allow")
        spawner = FakeSpawner()
        spawner.hold()
        a, lead_a = daemon(book, clock, "host-a:1:a", spawner)  # "another host": its pid is not checkable here
        b, lead_b = daemon(rival, clock, "host-b:2:b")
        await a.start(loop=False)
        await b.start(loop=False)
        run_id = await a.fire_now(s.id)
        _LIVE_DAEMONS.discard(a.daemon_id)  # a stands for a daemon in another process
        clock.advance(LEASE - 1)
        await b.tick()
        await a.tick()  # a renews: it is alive
        clock.advance(LEASE - 1)
        b._last_reap = None
        await b.tick()  # b takes over? no: a renewed LEASE-1 ago
        assert lead_b.epoch is None
        clock.advance(2)
        b._last_reap = None
        await b.tick()  # now a's heartbeat is stale: b leads (this tick) and reaps on the next reaper pass
        assert lead_b.epoch == 2
        b._last_reap = None
        await b.tick()
        run = next(r for r in await runs_of(book, s.id) if r["id"] == run_id)
        assert (run["status"], run["status_reason_code"]) == ("failed", "schedule_run.failed.daemon_died")
        assert "heartbeat" in run["status_reason_summary"]
        # a wakes: its process is killed on its next tick (the run is no longer running), its finalize conflicts
        await a.tick()
        await a.wait_idle()
        run = next(r for r in await runs_of(book, s.id) if r["id"] == run_id)
        assert run["status"] == "failed"
        await a.stop()
        await b.stop()
        assert (await verify(book)).ok

    async def test_release_hands_the_lease_over_at_once(self, book, rival, clock, caplog):
        """S14: a clean stop gives the lease up and drops the daemon's heartbeat; the standby leads on its next tick,
        its log saying the lease was released (not that a heartbeat was stale)."""
        a, lead_a = daemon(book, clock, "host-a:1:a")
        b, lead_b = daemon(rival, clock, "host-b:2:b")
        await a.start(loop=False)
        await b.start(loop=False)
        await a.stop()
        await lead_a.release()
        clock.advance(1)
        with caplog.at_level(logging.INFO, logger="statebook.leader"):
            await b.tick()
        assert lead_b.epoch == 2
        assert took(caplog) == [("released", "host-a:1:a", "daemon host-b:2:b took the scheduler lease at epoch 2: "
                                 "host-a:1:a released it (a clean stop)")]
        async with book.read() as conn:
            assert [r.daemon_id for r in await conn.execute(sa.select(scheduler_daemons))] == ["host-b:2:b"]
        await b.stop()
        await lead_b.release()

    async def test_a_fire_whose_lease_lapsed_before_the_launch_starts_no_process(self, book, clock):
        """S16: the leader commits a fire, then stalls past its lease before launching it (a GC pause, SIGSTOP):
        when it resumes it starts no process for that fire — a standby may lead by now — and the run ends
        failed, saying why; the history verifies."""
        s = await make(book, interval_sec=TICK)
        spawner = FakeSpawner()
        a, lead_a = daemon(book, clock, "host-a:1:a", spawner)
        await a.start(loop=False)
        launch = a.firing.launch

        def stalled(*args, **kw):
            clock.advance(LEASE + 1)  # the process froze between the fire's commit and its launch
            return launch(*args, **kw)

        a.firing.launch = stalled
        clock.advance(TICK)
        await a.tick()
        await a.wait_idle()
        assert spawner.launches == []
        [run] = await runs_of(book, s.id)
        assert run["status"] == "failed" and run["trigger_context"]["leader_epoch"] == 1
        [*_, last] = await history(book, "schedule_run", run["id"])
        assert last.reason_code == "schedule_run.failed.launch_error" and "lapsed" in last.reason_summary
        assert not lead_a.holds(clock.now())
        a.firing.launch = launch
        assert await lead_a.is_leader() and lead_a.holds(clock.now())  # nobody took over: it renews and leads on
        await a.stop()
        assert (await verify(book)).ok
