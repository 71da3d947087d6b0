"""Missed fires at start (S6) and recovery of runs a dead daemon left running (S3)."""

from __future__ import annotations


from statebook.lifecycle import verify
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.store import get_schedule, schedule_row

from .support import FakeSpawner, make, runs_of, settings


class MissedAndRecoveryCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    async def test_missed_fire_skip_records_evidence_and_advances(self, book, clock):
        """S6: policy skip writes one skipped run (missed_fire, with evidence) and moves next_fire_at past now."""
        s = await make(book, interval_sec=10)
        clock.advance(95)  # occurrences at +10..+90 fell while no daemon ran
        spawner = FakeSpawner()
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=spawner)
        await eng.start(loop=False)
        runs = await runs_of(book, s.id)
        assert [(r["status"], r["status_reason_code"]) for r in runs] == [("skipped", "schedule_run.skipped.missed_fire")]
        assert runs[0]["trigger_context"]["missed"] == 9
        row = await get_schedule(book, s.id)
        assert row.next_fire_at.timestamp() == s.next_fire_at.timestamp() + 90 and row.next_fire_at.timestamp() > clock.now()
        assert spawner.launches == []
        await eng.stop()

    async def test_missed_fire_run_once_reserves_next_then_one_recovery_run(self, book, clock):
        """S6: run_once advances next_fire_at first, then launches exactly one recovery run."""
        s = await make(book, interval_sec=10, missed_fire_policy="run_once")
        clock.advance(95)
        spawner = FakeSpawner()
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=spawner)
        await eng.start(loop=False)
        await eng.tick()  # the reserved time is in the future: the tick fires nothing more
        await eng.wait_idle()
        runs = await runs_of(book, s.id)
        assert [(r["status"], r["status_reason_code"]) for r in runs] == [("completed", "schedule_run.completed.exit_zero")]
        assert runs[0]["trigger_context"]["trigger"] == "missed_fire"
        assert (await get_schedule(book, s.id)).next_fire_at.timestamp() > clock.now()
        await eng.stop()
        assert (await verify(book)).ok

    async def test_missed_fire_run_once_passes_the_gates(self, book, clock):
        """S6, S5: the recovery run is admitted like a manual fire: max_runs used up exhausts the schedule
        (after the reservation moved next_fire_at) and no recovery run is opened."""
        s = await make(book, interval_sec=10, missed_fire_policy="run_once", max_runs=1)
        first = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner())
        await first.fire_now(s.id)
        await first.wait_idle()
        clock.advance(95)
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner())
        await eng.start(loop=False)
        await eng.wait_idle()
        assert [r["trigger_context"]["trigger"] for r in await runs_of(book, s.id)] == ["manual"]
        row = await get_schedule(book, s.id)
        assert (row.status, row.status_reason_code) == ("exhausted", "schedule.exhausted.max_runs")
        assert row.next_fire_at.timestamp() > clock.now()
        assert eng.slots.used == 0
        await eng.stop()
        assert (await verify(book)).ok

    async def test_run_of_a_dead_daemon_is_finalized_failed_at_start(self, book, clock):
        """S3: a run left `running` (claimed, never finished: crash between claim and launch) ends failed daemon_died."""
        s = await make(book, interval_sec=10)
        crashed = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner())
        clock.advance(10)
        # Simulate the crash: claim and open the run (committed), but never launch it.
        (decision,) = await crashed.firing.decide([await schedule_row(book, s.id)], clock.now())
        assert decision.outcome == "fired"
        run_id = decision.run_id
        assert (await runs_of(book, s.id))[0]["status"] == "running"
        survivor = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner())
        await survivor.start(loop=False)
        run = (await runs_of(book, s.id))[0]
        assert run["id"] == run_id
        assert (run["status"], run["status_reason_code"]) == ("failed", "schedule_run.failed.daemon_died")
        await survivor.stop()

    async def test_run_of_a_live_engine_is_not_reaped(self, book, clock):
        """S3: recovery leaves alone a run whose daemon is alive (here another engine in this process)."""
        s = await make(book, interval_sec=10)
        spawner = FakeSpawner()
        spawner.hold()
        alive = SchedulerEngine(book, settings(), clock=clock, launcher=spawner)
        await alive.start(loop=False)
        await alive.fire_now(s.id)
        other = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner())
        await other.start(loop=False)
        assert await other.recover() == 0
        assert (await runs_of(book, s.id))[0]["status"] == "running"
        spawner.release()
        await alive.wait_idle()
        await alive.stop()
        await other.stop()

    async def test_reaper_is_interval_gated(self, book, clock):
        """S3: the periodic reaper runs at most once per reaper interval."""
        eng = SchedulerEngine(book, settings(reaper_interval_seconds=300), clock=clock, launcher=FakeSpawner())
        calls = []

        async def reaper():
            calls.append(clock.now())

        eng.extra_reapers.append(reaper)
        await eng.tick()
        clock.advance(100)
        await eng.tick()
        clock.advance(250)
        await eng.tick()
        assert len(calls) == 2
