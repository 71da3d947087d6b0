"""One fire per occurrence outside the tick's batch path (S1), gate order overlap → budget (S5), max_runs
and follow-ups (S5, S8), and a stale read through a second SQLite connection (S1).

The single-schedule claims — missed fire ``skip`` / ``run_once``, a cadence advance, a github event, a
manual fire — rely on their own compare-and-set (``next_fire_at``, ``github_cursor``, the status) and
not on the tick's row lock. Each test below hands such a claim a schedule row that another claimant
has already moved on, and counts the runs.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from statebook.lifecycle import history, verify
from statebook.scheduler import firing
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.occurrence import claim
from statebook.scheduler.polling import PollResult
from statebook.scheduler.runs import open_run
from statebook.scheduler.errors import ScheduleError
from statebook.scheduler.store import get_schedule, schedule_row
from statebook.lifecycle import Reason

from .support import FakeSpawner, make, runs_of, settings


def engine(book, clock, **kw: Any) -> SchedulerEngine:
    return SchedulerEngine(book, settings(max_concurrent=10), clock=clock, launcher=FakeSpawner(), **kw)


class OneEvent:
    """A Poller that always returns the same single event."""

    def __init__(self, at: float) -> None:
        created = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.event = {"id": "40000000007", "type": "IssuesEvent", "created_at": created, "actor": {"login": "o"},
                      "repo": {"name": "octo/repo"}, "payload": {"action": "opened"}}

    async def fetch(self, repo: str, *, etag: str | None, cursor: str | None) -> PollResult:
        return PollResult("ok", (self.event,), pages=1)


def stale_read(monkeypatch, row: dict[str, Any]) -> None:
    """The manual fire's first read of the schedule returns ``row`` (read before another daemon moved it)."""

    async def read(book, ref):
        return dict(row)

    monkeypatch.setattr(firing, "schedule_row", read)


class StaleClaimCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    async def test_stale_missed_fire_skip_records_one_skip(self, book, rival, clock):
        """S1, S6: a missed-fire `skip` claim given a row another daemon already handled writes nothing."""
        s = await make(book, interval_sec=10)
        clock.advance(35)
        stale = await schedule_row(book, s.id)
        first, second = engine(book, clock), engine(rival, clock)
        await first.firing.missed(dict(stale), clock.now())
        await second.firing.missed(dict(stale), clock.now())
        runs = await runs_of(book, s.id)
        assert [(r["status"], r["status_reason_code"]) for r in runs] == [("skipped", "schedule_run.skipped.missed_fire")]
        assert (await get_schedule(book, s.id)).next_fire_at.timestamp() == s.next_fire_at.timestamp() + 30
        assert (await verify(book)).ok

    async def test_stale_missed_fire_run_once_launches_one_recovery_run(self, book, rival, clock):
        """S1, S6: two `run_once` recoveries of the same missed occurrence: only the reserver launches a run."""
        s = await make(book, interval_sec=10, missed_fire_policy="run_once")
        clock.advance(35)
        stale = await schedule_row(book, s.id)
        first, second = engine(book, clock), engine(rival, clock)
        await first.firing.missed(dict(stale), clock.now())
        await second.firing.missed(dict(stale), clock.now())
        await first.wait_idle()
        await second.wait_idle()
        runs = await runs_of(book, s.id)
        assert [r["trigger_context"]["trigger"] for r in runs] == ["missed_fire"]
        assert first.stats["fired"] + second.stats["fired"] == 1
        assert (await verify(book)).ok

    async def test_stale_cadence_advance_applies_once(self, book, rival, clock):
        """S1: a cadence advance (github_poll without a poller) with a stale row is a conflict, one transition."""
        s = await make(book, trigger_type="github_poll", github_repo="octo/repo", interval_sec=None, poll_interval_sec=60)
        clock.advance(60)
        stale = await schedule_row(book, s.id)
        assert stale["next_fire_at"] <= clock.now()
        first, second = engine(book, clock), engine(rival, clock)
        assert await first.consider(dict(stale), clock.now()) == "poll_unconfigured"
        assert await second.consider(dict(stale), clock.now()) == "conflict"
        advances = [f for f in await history(book, "schedule", s.id)
                    if f.reason_code == "schedule.active.poll_unconfigured"]
        assert len(advances) == 1
        assert (await get_schedule(book, s.id)).next_fire_at.timestamp() > clock.now()

    async def test_stale_occurrence_claim_is_a_conflict(self, book, rival, clock):
        """S1: `claim` of an occurrence another book already claimed (next_fire_at moved) writes nothing."""
        s = await make(book, interval_sec=10)
        clock.advance(10)
        stale = await schedule_row(book, s.id)
        due = stale["next_fire_at"]
        won = await claim(book, stale, due, due + 10, reason=Reason("schedule.active.fire_claimed", "first"))
        lost = await claim(rival, stale, due, due + 10, reason=Reason("schedule.active.fire_claimed", "second"))
        assert won.applied and lost.conflict
        claims = [f for f in await history(book, "schedule", s.id) if f.reason_code == "schedule.active.fire_claimed"]
        assert len(claims) == 1

    async def test_stale_github_event_claim_fires_the_event_once(self, book, rival, clock):
        """S1, S13: two daemons polling with the same stale row (cursor, next_fire_at) fire the event once."""
        s = await make(book, trigger_type="github_poll", github_repo="octo/repo", interval_sec=None, poll_interval_sec=60,
                       overlap_policy="allow")
        clock.advance(60)
        poller = OneEvent(clock.now())
        stale = await schedule_row(book, s.id)
        first, second = engine(book, clock, poller=poller), engine(rival, clock, poller=poller)
        assert await first.consider(dict(stale), clock.now()) == "fired"
        assert await second.consider(dict(stale), clock.now()) == "conflict"
        await first.wait_idle()
        await second.wait_idle()
        runs = await runs_of(book, s.id)
        assert [r["trigger_context"]["event_id"] for r in runs] == ["40000000007"]
        assert (await get_schedule(book, s.id)).github_cursor == "40000000007"

    async def test_stale_manual_fire_respects_max_runs(self, book, rival, clock, monkeypatch):
        """S5: a manual fire whose pre-checks read a stale count is refused inside its transaction (max_runs)."""
        s = await make(book, interval_sec=1000, max_runs=1)
        stale = await schedule_row(book, s.id)
        first, second = engine(book, clock), engine(rival, clock)
        await first.fire_now(s.id)
        await first.wait_idle()
        # The second daemon passed its pre-checks on the stale row; only the claim transaction remains.
        stale_read(monkeypatch, stale)
        with pytest.raises(ScheduleError, match="all 1 of its runs"):
            await second.fire_now(s.id)
        assert len(await runs_of(book, s.id)) == 1
        assert (await get_schedule(book, s.id)).status == "exhausted"
        assert second.slots.used == 0

    async def test_stale_manual_fire_of_an_exhausted_schedule_is_refused(self, book, rival, clock, monkeypatch):
        """S1: a manual fire with a row read before the schedule was exhausted opens no run (status guard)."""
        s = await make(book, trigger_type="at", at_time=clock.now() + 5, interval_sec=None)
        stale = await schedule_row(book, s.id)
        first = engine(book, clock)
        clock.advance(5)
        await first.tick()
        await first.wait_idle()
        assert (await get_schedule(book, s.id)).status == "exhausted"
        stale_read(monkeypatch, stale)
        second = engine(rival, clock)
        with pytest.raises(ScheduleError, match="changed concurrently"):
            await second.fire_now(s.id)
        assert len(await runs_of(book, s.id)) == 1
        assert second.slots.used == 0

    async def test_overlap_is_reported_before_budget(self, book, clock):
        """S5: a schedule both overlapping (a run still running) and over budget reports overlap (gate 2), not budget."""
        s = await make(book, interval_sec=10, budget_usd=0.5)
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner(report={"cost_usd": 1.0}))
        await eng.start(loop=False)
        await eng.fire_now(s.id)
        await eng.wait_idle()  # spent 1.0 of 0.5
        await open_run(book, await schedule_row(book, s.id), context={"trigger": "manual"}, daemon_id="elsewhere:1:x",
                       reason=Reason("schedule_run.running.manual", "held by another daemon"))
        clock.advance(10)
        await eng.tick()
        row = await get_schedule(book, s.id)
        assert (row.status, row.status_reason_code) == ("active", "schedule.active.skipped_overlap")
        assert [r["status_reason_code"] for r in await runs_of(book, s.id) if r["status"] == "skipped"] == [
            "schedule_run.skipped.overlap"]
        await eng.stop()

    async def test_max_runs_counts_top_level_runs_not_follow_ups(self, book, clock):
        """S5, S8: with max_runs=2, a first fire and its follow-up count as one; the second fire is admitted."""
        s = await make(book, interval_sec=10, max_runs=2, on_success={"command_args": ["-c", "pass"]})
        spawner = FakeSpawner()
        spawner.codes = [0, 1, 0]  # parent ok → follow-up (fails, no on_fail) ; second parent ok → follow-up
        eng = SchedulerEngine(book, settings(max_chain_depth=1), clock=clock, launcher=spawner)
        await eng.start(loop=False)
        clock.advance(10)
        await eng.tick()
        await eng.wait_idle()
        assert sorted(r["chain_depth"] for r in await runs_of(book, s.id)) == [0, 1]
        clock.advance(10)
        await eng.tick()  # the batch path (grouped count)
        await eng.wait_idle()
        runs = await runs_of(book, s.id)
        assert sorted(r["chain_depth"] for r in runs) == [0, 0, 1, 1]
        assert (await get_schedule(book, s.id)).status == "active"
        await eng.stop()

    async def test_manual_fire_max_runs_counts_top_level_runs_not_follow_ups(self, book, clock):
        """S5, S8: the single-schedule count (manual fire) ignores follow-ups too."""
        s = await make(book, interval_sec=1000, max_runs=2, on_success={"command_args": ["-c", "pass"]})
        eng = SchedulerEngine(book, settings(max_chain_depth=1), clock=clock, launcher=FakeSpawner())
        await eng.start(loop=False)
        await eng.fire_now(s.id)
        await eng.wait_idle()
        await eng.fire_now(s.id)  # one top-level run so far (plus its follow-up): admitted
        await eng.wait_idle()
        assert sorted(r["chain_depth"] for r in await runs_of(book, s.id)) == [0, 0, 1, 1]
        with pytest.raises(Exception, match="all 2 of its runs"):
            await eng.fire_now(s.id)
        await eng.stop()
