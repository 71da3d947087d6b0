"""L20a, S18: a one-shot schedule's time and the engine's ``now`` take an aware datetime or POSIX seconds;
a schedule and its runs give their times as aware UTC datetimes, on every backend."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from statebook.lifecycle import verify
from statebook.scheduler import CreateScheduleRequest, get_schedule, list_runs
from statebook.scheduler.errors import InvalidSchedule
from statebook.scheduler.store import create_schedule

from .cases_gate import engine_for
from .support import command_spec, make, runs_of

SYDNEY = timezone(timedelta(hours=11), "AEDT")


class SchedulerTimeCases:
    """Mixed into SchedulerConformance: each backend runs them (tests/conformance)."""

    async def test_a_one_shot_at_a_datetime_is_stored_and_fires_as_at_its_seconds(self, book, clock):
        """L20a, S1: ``at_time`` as an aware datetime (a request or a mapping) stores its seconds, the same as
        seconds do; ``Schedule.at_time`` and ``next_fire_at`` are that moment, aware UTC; evaluating at a
        datetime past it fires it once, and the run's times are aware UTC too."""
        moment = datetime.fromtimestamp(clock.now() + 5, SYDNEY)
        request = CreateScheduleRequest(**command_spec("dt", trigger_type="at", at_time=moment, interval_sec=None))
        assert request.at_time == moment.timestamp()
        by_moment = await create_schedule(book, request)
        by_seconds = await make(book, "secs", trigger_type="at", at_time=moment.timestamp(), interval_sec=None)
        for s in (by_moment, by_seconds):
            assert s.at_time == s.next_fire_at == moment and s.at_time.tzinfo == timezone.utc
        eng = await engine_for(book, clock)
        clock.advance(5)
        assert await eng.evaluate(datetime.fromtimestamp(clock.now(), SYDNEY)) == 2
        await eng.wait_idle()
        [run] = await list_runs(book, schedule_id=by_moment.id)
        assert run.status == "completed" and run.occurrence_at == moment
        assert run.fired_at.tzinfo == timezone.utc and run.fired_at.timestamp() == clock.now()
        assert [r["occurrence_at"] for r in await runs_of(book, by_seconds.id)] == [moment.timestamp()]
        assert (await get_schedule(book, by_moment.id)).status == "exhausted"
        assert await eng.check_missed_fires(datetime.fromtimestamp(clock.now(), timezone.utc)) == 0
        await eng.stop()
        assert (await verify(book)).ok

    async def test_a_naive_time_is_refused_by_the_request_and_the_engine(self, book, clock):
        """L20a, S18: a naive ``at_time`` is one InvalidSchedule naming it (rule ``naive``, saying to add a
        tzinfo), nothing written; a naive ``now`` is refused by ``evaluate`` and ``check_missed_fires``."""
        naive = datetime(2026, 12, 5, 19, 30)
        with pytest.raises(InvalidSchedule) as refused:
            await make(book, "naive", trigger_type="at", at_time=naive, interval_sec=None)
        assert (refused.value.argument, refused.value.rule) == ("at_time", "naive")
        assert "tzinfo" in str(refused.value) and (await verify(book)).entities == 0
        eng = await engine_for(book, clock)
        for call in (eng.evaluate, eng.check_missed_fires):
            with pytest.raises(ValueError, match="^now: is a naive datetime"):
                await call(naive)
        await eng.stop()
