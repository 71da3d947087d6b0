"""A tick's due schedules are evaluated together (one transaction) and quick runs end together (S1, S5, S9)."""

from __future__ import annotations

import sqlalchemy as sa

from statebook.lifecycle import Actor, Reason, transition, verify
from statebook.outbox.dispatch.schema import dispatch_outbox
from statebook.scheduler import admission, evaluation, execution
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.runs import SCHEDULER, finalize_run, open_run
from statebook.scheduler.store import disable_schedule, get_schedule, schedule_row

from .support import FakeSpawner, make, runs_of, settings


async def engine_for(book, clock, spawner=None, **cfg):
    eng = SchedulerEngine(book, settings(**cfg), clock=clock, launcher=spawner or FakeSpawner())
    await eng.start(loop=False)
    return eng


async def ended_run(book, s, **patch):
    """A finished top-level run of ``s`` (what an earlier fire would have left)."""
    row = await schedule_row(book, s.id)
    run_id = await open_run(book, row, context={"trigger": "manual"}, daemon_id="elsewhere",
                            reason=Reason("schedule_run.running.manual", "earlier"))
    await finalize_run(book, run_id, "completed", reason=Reason("schedule_run.completed.exit_zero"),
                       patch={"exit_code": 0, **patch})
    return run_id


async def due_rows(eng, now):
    async with eng.book.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(evaluation.due_query(now))]


async def dispatches(book):
    async with book.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(sa.select(dispatch_outbox))]


class SetEvaluationCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    async def test_every_gate_decides_in_one_set(self, book, clock):
        """S5, S1: one tick over schedules each stopped by a different gate gives each the outcome it gets
        alone, in due order: the global slots go to the first fires, the next one is deferred (with a record)."""
        ok = await make(book, "ok", interval_sec=13,
                        threshold_config={"metric": "failed_runs", "op": "gte", "value": 1, "window_minutes": 5})
        busy = await make(book, "busy", interval_sec=14)
        broke = await make(book, "broke", interval_sec=15, budget_usd=1.0)
        used = await make(book, "used", interval_sec=16, max_runs=1)
        fire = await make(book, "fire", interval_sec=10)
        once = await make(book, "once", trigger_type="at", at_time=clock.now() + 11, interval_sec=None)
        late = await make(book, "late", interval_sec=12)
        eng = await engine_for(book, clock, max_concurrent=2)
        await open_run(book, await schedule_row(book, busy.id), context={"trigger": "manual"}, daemon_id=eng.daemon_id,
                       reason=Reason("schedule_run.running.manual", "still running"))
        await ended_run(book, broke, cost_usd=1.5)
        await ended_run(book, used)
        clock.advance(16)
        rows = await due_rows(eng, clock.now())
        assert [r["name"] for r in rows] == ["fire", "once", "late", "ok", "busy", "broke", "used"]
        outcomes = await eng.consider_many(rows, clock.now())
        assert outcomes == ["fired", "fired", "deferred", "threshold_ok", "skipped_overlap", "exhausted_budget",
                            "exhausted_max_runs"]
        await eng.wait_idle()
        state = {s.name: await get_schedule(book, s.id) for s in (ok, busy, broke, used, fire, once, late)}
        assert state["ok"].status_reason_code == "schedule.active.threshold_ok"
        assert state["busy"].status_reason_code == "schedule.active.skipped_overlap"
        assert (state["broke"].status, state["broke"].status_reason_code) == ("exhausted", "schedule.exhausted.budget")
        assert (state["used"].status, state["used"].status_reason_code) == ("exhausted", "schedule.exhausted.max_runs")
        assert (state["once"].status, state["once"].status_reason_code) == ("exhausted", "schedule.exhausted.one_shot")
        assert state["fire"].next_fire_at.timestamp() == fire.next_fire_at.timestamp() + 10
        assert state["late"].next_fire_at.timestamp() == late.next_fire_at.timestamp()  # deferred: still due
        for name, s in (("ok", ok), ("busy", busy)):
            assert state[name].next_fire_at > s.next_fire_at
        runs = {name: await runs_of(book, s.id) for name, s in (("busy", busy), ("fire", fire), ("once", once), ("late", late))}
        assert [r["status_reason_code"] for r in runs["busy"]] == ["schedule_run.running.manual", "schedule_run.skipped.overlap"]
        assert [r["status"] for r in runs["fire"]] == ["completed"] and [r["status"] for r in runs["once"]] == ["completed"]
        assert [(r["status_reason_code"], r["trigger_context"]["deferrals"]) for r in runs["late"]] == [
            ("schedule_run.skipped.deferred_capacity", 1)]
        assert await runs_of(book, ok.id) == []
        assert (eng.stats["fired"], eng.stats["skipped"], eng.stats["deferred"], eng.stats["fallbacks"]) == (2, 1, 1, 0)
        assert eng.slots.used == 0
        await eng.stop()
        assert (await verify(book)).ok

    async def test_rows_changed_after_the_due_read_are_read_again_under_the_lock(self, book, clock):
        """S1, S5: a schedule claimed or disabled since the due read is a conflict and gets nothing written;
        one an operator changed but still due is judged on its new values (max_runs lowered: exhausted)."""
        taken = await make(book, "taken", interval_sec=10)
        paused = await make(book, "paused", interval_sec=10)
        lowered = await make(book, "lowered", interval_sec=10)
        plain = await make(book, "plain", interval_sec=10)
        eng = await engine_for(book, clock)
        rival = await engine_for(book, clock)
        await ended_run(book, lowered)
        clock.advance(10)
        rows = await due_rows(eng, clock.now())
        assert await rival.consider_many([r for r in rows if r["name"] == "taken"], clock.now()) == ["fired"]
        await disable_schedule(book, paused.id)
        out = await transition(book, "schedule", lowered.id, "active", expected="active", patch={"max_runs": 1},
                               actor=Actor("operator", "cli"), reason=Reason("schedule.active.updated", "max_runs 1"))
        assert out.applied
        outcomes = dict(zip([r["name"] for r in rows], await eng.consider_many(rows, clock.now()), strict=True))
        assert outcomes == {"taken": "conflict", "paused": "conflict", "lowered": "exhausted_max_runs", "plain": "fired"}
        await eng.wait_idle()
        await rival.wait_idle()
        assert len(await runs_of(book, taken.id)) == 1
        assert await runs_of(book, paused.id) == []
        assert (await get_schedule(book, lowered.id)).status_reason_code == "schedule.exhausted.max_runs"
        assert len(await runs_of(book, plain.id)) == 1
        assert eng.slots.used == 0
        await eng.stop()
        await rival.stop()
        assert (await verify(book)).ok

    async def test_a_failing_set_is_evaluated_one_by_one(self, book, clock, monkeypatch):
        """S1, S5: when evaluating the set fails nothing of it is written, no slot stays taken, and each
        schedule is then evaluated alone — every occurrence still fires exactly once."""
        names = ["a", "b", "c"]
        made = [await make(book, n, interval_sec=10) for n in names]
        eng = await engine_for(book, clock)
        real = admission.read_inputs

        async def refuse_sets(book, due, now):
            if len(due) > 1:
                raise RuntimeError("a set refused")
            return await real(book, due, now)

        monkeypatch.setattr(admission, "read_inputs", refuse_sets)
        clock.advance(10)
        await eng.tick()
        await eng.wait_idle()
        assert (eng.stats["fallbacks"], eng.stats["errors"], eng.stats["fired"]) == (1, 0, 3)
        for s in made:
            assert [r["status"] for r in await runs_of(book, s.id)] == ["completed"]
        assert eng.slots.used == 0
        await eng.stop()
        assert (await verify(book)).ok

    async def test_quick_runs_end_together_each_notified_once(self, book, clock, monkeypatch):
        """S9: runs ending at the same time are finalized in one group; each ended run has exactly one
        notification, keyed by its own terminal fact."""
        groups: list[int] = []
        real = execution.finalize_runs

        async def counting(book, endings):
            groups.append(len(endings))
            return await real(book, endings)

        monkeypatch.setattr(execution, "finalize_runs", counting)
        made = [await make(book, f"n{i}", interval_sec=10, notify={"kind": "run_ended", "deliver_to": "ops"})
                for i in range(4)]
        eng = await engine_for(book, clock)
        clock.advance(10)
        await eng.tick()
        await eng.wait_idle()
        assert sum(groups) == 4 and max(groups) > 1
        found = {d["schedule_run_id"]: d for d in await dispatches(book)}
        for s in made:
            (run,) = await runs_of(book, s.id)
            assert run["status"] == "completed"
            assert found[run["id"]]["dedup_key"] == f"schedule_run:{run['id']}:{run['last_fact_id']}"
        assert len(found) == 4
        await eng.stop()
        assert (await verify(book)).ok

    async def test_one_bad_ending_in_a_group_fails_alone(self, book, clock, monkeypatch):
        """S9: a notification that cannot be enqueued rolls back its own run's ending only; the other runs
        of the group end (with their notifications) and the bad one stays running, without a dispatch."""
        import statebook.scheduler.runs as runs_module

        made = [await make(book, f"n{i}", interval_sec=10, notify={"kind": "run_ended", "deliver_to": "ops"})
                for i in range(3)]
        bad = made[1].id
        real = runs_module.enqueue_dispatch

        async def refuse_one(tx, **kwargs):
            if kwargs["body"]["schedule_id"] == bad:
                raise RuntimeError("enqueue refused")
            return await real(tx, **kwargs)

        monkeypatch.setattr(runs_module, "enqueue_dispatch", refuse_one)
        eng = await engine_for(book, clock)
        clock.advance(10)
        await eng.tick()
        await eng.wait_idle()
        by_schedule = {s.id: await runs_of(book, s.id) for s in made}
        assert [r["status"] for r in by_schedule[bad]] == ["running"]
        notified = {d["schedule_run_id"] for d in await dispatches(book)}
        for s in made:
            (run,) = by_schedule[s.id]
            assert (run["id"] in notified) == (s.id != bad)
            if s.id != bad:
                assert run["status"] == "completed"
        monkeypatch.undo()
        (stuck,) = by_schedule[bad]
        out = await finalize_run(book, stuck["id"], "failed", actor=SCHEDULER, patch={"error_detail": "test cleanup"},
                                 reason=Reason("schedule_run.failed.internal_error", "test cleanup"))
        assert out.applied
        await eng.stop()
        assert (await verify(book)).ok
