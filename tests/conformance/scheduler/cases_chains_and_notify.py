"""Follow-up chains (S8) and notifications tied to run endings (S9)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from statebook.lifecycle import Reason, verify
from statebook.outbox.dispatch.schema import dispatch_outbox
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.runs import cancel_run, finalize_run

from .support import FakeSpawner, make, runs_of, settings


async def dispatches(book):
    async with book.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(sa.select(dispatch_outbox))]


class ChainsAndNotifyCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    async def test_follow_up_chain_stops_at_depth_ten(self, book, clock):
        """S8: an on_fail that always fails chains to depth 10 and no further; links and context are set."""
        s = await make(book, interval_sec=10, on_fail={"command_args": ["-c", "raise SystemExit(1)"]})
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner(exit_code=1))
        await eng.start(loop=False)
        await eng.fire_now(s.id)
        await eng.wait_idle()
        runs = sorted(await runs_of(book, s.id), key=lambda r: r["chain_depth"])
        assert [r["chain_depth"] for r in runs] == list(range(11))
        for parent, child in zip(runs, runs[1:]):
            assert child["chain_parent_id"] == parent["id"]
            assert child["trigger_context"]["chain_from"] == parent["id"]
            assert child["trigger_context"]["parent_exit_code"] == 1
            assert child["trigger_context"]["parent_status"] == "failed"
            assert child["status_reason_code"] in ("schedule_run.failed.nonzero_exit",)
        await eng.stop()

    async def test_follow_ups_do_not_count_against_max_runs(self, book, clock):
        """S8: chain children are not top-level runs; max_runs=1 still allows the chain to finish."""
        s = await make(book, interval_sec=10, max_runs=1, on_success={"command_args": ["-c", "pass"]},
                       on_fail=None)
        spawner = FakeSpawner()
        spawner.codes = [0, 1]
        eng = SchedulerEngine(book, settings(max_chain_depth=3), clock=clock, launcher=spawner)
        await eng.start(loop=False)
        clock.advance(10)
        await eng.tick()
        await eng.wait_idle()
        runs = await runs_of(book, s.id)
        assert sorted(r["chain_depth"] for r in runs) == [0, 1]
        assert {r["status"] for r in runs} == {"completed", "failed"}
        await eng.stop()

    async def test_notification_exists_iff_run_ended(self, book, clock):
        """S9: a notify schedule gets exactly one dispatch per ended run, none while running, dedup by fact."""
        s = await make(book, interval_sec=10, notify={"kind": "run_ended", "deliver_to": "ops"})
        spawner = FakeSpawner()
        spawner.hold()
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=spawner)
        await eng.start(loop=False)
        run_id = await eng.fire_now(s.id)
        assert await dispatches(book) == []
        spawner.release()
        await eng.wait_idle()
        found = await dispatches(book)
        assert len(found) == 1
        d = found[0]
        assert d["schedule_run_id"] == run_id and d["kind"] == "run_ended" and d["deliver_to"] == "ops"
        run = (await runs_of(book, s.id))[0]
        assert d["dedup_key"] == f"schedule_run:{run_id}:{run['last_fact_id']}"
        await eng.stop()
        assert (await verify(book)).ok

    async def test_crash_between_end_and_enqueue_is_impossible(self, book, clock, monkeypatch):
        """S9: when the enqueue fails, the terminal transition rolls back with it (same transaction)."""
        s = await make(book, interval_sec=10, notify={"kind": "run_ended", "deliver_to": "ops"})
        spawner = FakeSpawner()
        spawner.hold()
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=spawner)
        run_id = await eng.fire_now(s.id)
        import statebook.outbox as outbox

        async def broken(*args, **kwargs):
            raise RuntimeError("crash inside the enqueue")

        monkeypatch.setattr(outbox, "enqueue_dispatch", broken, raising=False)
        monkeypatch.setattr("statebook.scheduler.runs.enqueue_dispatch", broken)
        with pytest.raises(RuntimeError):
            await finalize_run(book, run_id, "completed", reason=Reason("schedule_run.completed.exit_zero"),
                               patch={"exit_code": 0})
        assert (await runs_of(book, s.id))[0]["status"] == "running"
        assert await dispatches(book) == []
        monkeypatch.undo()
        spawner.release()
        await eng.wait_idle()
        assert (await runs_of(book, s.id))[0]["status"] == "completed"
        assert len(await dispatches(book)) == 1
        await eng.stop()

    async def test_operator_cancel_notifies_and_daemon_finalize_is_a_no_op(self, book, clock):
        """S9, S11: cancelling through the lifecycle ends the run once; the owner's later finalize conflicts."""
        s = await make(book, interval_sec=10, notify={"kind": "run_ended", "deliver_to": "ops"})
        spawner = FakeSpawner()
        spawner.hold()
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=spawner)
        run_id = await eng.fire_now(s.id)
        row = await cancel_run(book, run_id)
        assert (row.status, row.status_reason_code) == ("cancelled", "schedule_run.cancelled.operator")
        await eng.watch_cancellations()
        await eng.wait_idle()
        assert (await runs_of(book, s.id))[0]["status"] == "cancelled"
        assert [d["schedule_run_id"] for d in await dispatches(book)] == [run_id]
        await eng.stop()
        assert (await verify(book)).ok
