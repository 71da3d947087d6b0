"""Fire admission, gate by gate in the seed's order (S5), and the occurrence compare-and-set (S1)."""

from __future__ import annotations


from statebook.lifecycle import history, verify
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.errors import CapacityExhausted
from statebook.scheduler.store import get_schedule

import pytest

from .support import FakeSpawner, make, runs_of, settings


async def engine_for(book, clock, spawner=None, **cfg):
    eng = SchedulerEngine(book, settings(**cfg), clock=clock, launcher=spawner or FakeSpawner())
    await eng.start(loop=False)
    return eng


class GateCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    async def test_due_interval_fires_once_and_advances(self, book, clock):
        """S1, S5: a due schedule is claimed (next_fire_at moves) and exactly one run is opened and ends."""
        s = await make(book, interval_sec=10)
        eng = await engine_for(book, clock)
        clock.advance(10)
        await eng.tick()
        await eng.tick()  # same occurrence again: nothing new
        await eng.wait_idle()
        runs = await runs_of(book, s.id)
        assert [r["status"] for r in runs] == ["completed"]
        assert runs[0]["occurrence_at"] == s.next_fire_at.timestamp()
        assert (await get_schedule(book, s.id)).next_fire_at.timestamp() == s.next_fire_at.timestamp() + 10
        await eng.stop()
        assert (await verify(book)).ok

    async def test_threshold_within_bounds_advances_without_run(self, book, clock):
        """S5 gate 1: a threshold within bounds advances the cadence and writes no run."""
        s = await make(book, interval_sec=10,
                       threshold_config={"metric": "failed_runs", "op": "gte", "value": 1, "window_minutes": 5})
        eng = await engine_for(book, clock)
        clock.advance(10)
        await eng.tick()
        assert await runs_of(book, s.id) == []
        row = await get_schedule(book, s.id)
        assert row.status_reason_code == "schedule.active.threshold_ok"
        assert row.next_fire_at.timestamp() > s.next_fire_at.timestamp()
        await eng.stop()

    async def test_threshold_breach_fires_then_cools_down(self, book, clock):
        """S5 gate 1: a breach fires once and stamps last_alert_at; within the window it only advances."""
        other = await make(book, "other", interval_sec=1000)
        alert = await make(book, "alert", interval_sec=10,
                           threshold_config={"metric": "failed_runs", "op": "gte", "value": 1, "window_minutes": 5})
        spawner = FakeSpawner()
        eng = await engine_for(book, clock, spawner)
        # A failed run of another schedule inside the window.
        await eng.fire_now(other.id)
        spawner.exit_code = 1
        await eng.wait_idle()
        spawner.exit_code = 0
        clock.advance(10)
        await eng.tick()
        await eng.wait_idle()
        fired = await runs_of(book, alert.id)
        assert len(fired) == 1 and fired[0]["trigger_context"]["metric"] == "failed_runs"
        assert (await get_schedule(book, alert.id)).last_alert_at.timestamp() == clock.now()
        clock.advance(10)
        await eng.tick()
        assert len(await runs_of(book, alert.id)) == 1
        assert (await get_schedule(book, alert.id)).status_reason_code == "schedule.active.threshold_cooldown"
        await eng.stop()

    async def test_overlap_skip_writes_a_skipped_run_and_advances(self, book, clock):
        """S5 gate 2: while a run is running, the next occurrence becomes a skipped run (overlap) and cadence moves."""
        s = await make(book, interval_sec=10)
        spawner = FakeSpawner()
        spawner.hold()
        eng = await engine_for(book, clock, spawner)
        clock.advance(10)
        await eng.tick()
        clock.advance(10)
        await eng.tick()
        runs = await runs_of(book, s.id)
        assert [r["status"] for r in runs] == ["running", "skipped"]
        assert runs[1]["status_reason_code"] == "schedule_run.skipped.overlap"
        assert (await get_schedule(book, s.id)).next_fire_at.timestamp() == s.next_fire_at.timestamp() + 20
        spawner.release()
        await eng.wait_idle()
        await eng.stop()

    async def test_overlap_allow_runs_concurrently(self, book, clock):
        """S5 gate 2: overlap_policy=allow bypasses the overlap gate."""
        s = await make(book, interval_sec=10, overlap_policy="allow")
        spawner = FakeSpawner()
        spawner.hold()
        eng = await engine_for(book, clock, spawner)
        for _ in range(2):
            clock.advance(10)
            await eng.tick()
        assert [r["status"] for r in await runs_of(book, s.id)] == ["running", "running"]
        spawner.release()
        await eng.wait_idle()
        await eng.stop()

    async def test_budget_exhausts_schedule_before_firing(self, book, clock):
        """S5 gate 3: reported cost reaching budget_usd moves the schedule to exhausted (budget) — overshoot by one run."""
        s = await make(book, interval_sec=10, budget_usd=1.0)
        spawner = FakeSpawner(report={"cost_usd": 1.5, "tokens": 10})
        eng = await engine_for(book, clock, spawner)
        clock.advance(10)
        await eng.tick()
        await eng.wait_idle()
        clock.advance(10)
        await eng.tick()
        row = await get_schedule(book, s.id)
        assert row.status == "exhausted" and row.status_reason_code == "schedule.exhausted.budget"
        assert row.enabled == 0
        assert len(await runs_of(book, s.id)) == 1
        await eng.stop()

    async def test_max_runs_exhausts_after_n_top_level_runs(self, book, clock):
        """S5 gate 4: max_runs counts top-level runs; the next due fire exhausts the schedule instead."""
        s = await make(book, interval_sec=10, max_runs=2)
        eng = await engine_for(book, clock)
        for _ in range(3):
            clock.advance(10)
            await eng.tick()
            await eng.wait_idle()
        assert len(await runs_of(book, s.id)) == 2
        row = await get_schedule(book, s.id)
        assert row.status == "exhausted" and row.status_reason_code == "schedule.exhausted.max_runs"
        with pytest.raises(Exception, match="exhausted"):
            await eng.fire_now(s.id)
        await eng.stop()

    async def test_global_slots_defer_with_records_on_first_and_every_tenth(self, book, clock):
        """S5 gate 5: with every slot busy a due fire stays due; deferral records at deferrals 1 and 11 only."""
        busy = await make(book, "busy", interval_sec=10)
        waiting = await make(book, "waiting", interval_sec=10, overlap_policy="allow")
        spawner = FakeSpawner()
        spawner.hold()
        eng = await engine_for(book, clock, spawner, max_concurrent=1)
        await eng.fire_now(busy.id)
        with pytest.raises(CapacityExhausted):
            await eng.fire_now(waiting.id)
        clock.advance(10)
        due = (await get_schedule(book, waiting.id)).next_fire_at.timestamp()
        for _ in range(12):
            await eng.tick()
        records = [r for r in await runs_of(book, waiting.id)]
        assert [r["trigger_context"]["deferrals"] for r in records] == [1, 11]
        assert all(r["status_reason_code"] == "schedule_run.skipped.deferred_capacity" for r in records)
        assert (await get_schedule(book, waiting.id)).next_fire_at.timestamp() == due  # still due
        spawner.release()
        await eng.wait_idle()
        await eng.tick()
        await eng.wait_idle()
        assert sorted(r["status"] for r in await runs_of(book, waiting.id)) == ["completed", "skipped", "skipped"]
        await eng.stop()

    async def test_gate_order_threshold_before_overlap_before_budget(self, book, clock):
        """S5: when several gates would refuse, the earliest in the seed's order decides."""
        s = await make(book, interval_sec=10, budget_usd=0.5, max_runs=1,
                       threshold_config={"metric": "total_cost", "op": "gt", "value": 100, "window_minutes": 1})
        eng = await engine_for(book, clock)
        clock.advance(10)
        await eng.tick()
        # threshold within bounds wins over budget/max_runs (which would not refuse yet anyway)
        assert (await get_schedule(book, s.id)).status_reason_code == "schedule.active.threshold_ok"
        t = await make(book, "t", interval_sec=10, budget_usd=0.5, max_runs=1)
        spawner = FakeSpawner(report={"cost_usd": 1.0})
        eng.executor.spawner = spawner
        await eng.fire_now(t.id)
        await eng.wait_idle()
        clock.advance(10)
        await eng.tick()
        # both budget and max_runs are spent: budget (gate 3) is the recorded reason, not max_runs (gate 4)
        assert (await get_schedule(book, t.id)).status_reason_code == "schedule.exhausted.budget"
        await eng.stop()

    async def test_one_shot_at_fires_once_and_exhausts(self, book, clock):
        """S1: an `at` schedule fires at its time once and becomes exhausted (one_shot)."""
        s = await make(book, trigger_type="at", at_time=clock.now() + 5, interval_sec=None)
        eng = await engine_for(book, clock)
        clock.advance(5)
        await eng.tick()
        await eng.tick()
        await eng.wait_idle()
        assert [r["status"] for r in await runs_of(book, s.id)] == ["completed"]
        row = await get_schedule(book, s.id)
        assert row.status == "exhausted" and row.status_reason_code == "schedule.exhausted.one_shot"
        await eng.stop()

    async def test_paused_schedule_does_not_fire_but_manual_fire_works(self, book, clock):
        """S5: paused schedules are not evaluated; a manual fire still runs (and is audited on the schedule)."""
        s = await make(book, interval_sec=10, enabled=False)
        eng = await engine_for(book, clock)
        clock.advance(100)
        await eng.tick()
        assert await runs_of(book, s.id) == []
        run_id = await eng.fire_now(s.id)
        await eng.wait_idle()
        runs = await runs_of(book, s.id)
        assert runs[0]["id"] == run_id and runs[0]["trigger_context"]["trigger"] == "manual"
        codes = [f.reason_code for f in await history(book, "schedule", s.id)]
        assert codes[-1] == "schedule.paused.manual_fire"
        await eng.stop()
