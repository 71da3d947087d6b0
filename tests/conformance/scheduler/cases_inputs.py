"""S18: bad input to the scheduler's public functions is refused with a StatebookError and writes nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa

from statebook.adapters.daemon import seed_schedules
from statebook.adapters.errors import ConfigError
from statebook.adapters.settings import SchedulerSettings, Settings
from statebook.lifecycle import StatebookError, verify
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.facts import facts_table
from statebook.scheduler import (
    CreateScheduleRequest, ScheduleError, SchedulerEngine, cancel_run, create_schedule, delete_schedule,
    disable_schedule, enable_schedule, find_schedule, get_run, get_schedule, list_runs, list_schedules,
)
from statebook.scheduler.errors import InvalidSchedule
from statebook.scheduler.polling import PollResult
from statebook.scheduler.requests import INTERVAL_SECONDS
from statebook.scheduler.schema import schedule_runs, schedules

from .support import FakeSpawner, command_spec, make, runs_of, settings

NEVER_FIRES = ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"]
NOT_CRON = ["not a cron", "0 0 * * 8", "61 * * * *", "@reboot", "* * * *", "\ud800 * * * *", "*/5 * * * *\x00",
            "* " * 200]
BAD_AT = [float("nan"), float("inf"), float("-inf"), 1e400, -1.0, 2.6e11, 10**400, True, "1700000000", [1]]
BAD_NUMBERS = [
    {"interval_sec": 99999999999}, {"interval_sec": 2**31}, {"interval_sec": 2**63}, {"interval_sec": 2**64},
    {"interval_sec": INTERVAL_SECONDS[1] + 1}, {"interval_sec": 0}, {"interval_sec": -1}, {"interval_sec": 1.5},
    {"interval_sec": True}, {"interval_sec": "60"}, {"interval_sec": float("nan")},
    {"poll_interval_sec": 0}, {"poll_interval_sec": 2**40},
    {"max_runs": 2**31}, {"max_runs": 0}, {"max_runs": 2**63}, {"budget_tokens": 2**31}, {"budget_tokens": -1},
    {"budget_usd": float("nan")}, {"budget_usd": float("inf")}, {"budget_usd": 1e13}, {"budget_usd": -1.0},
    {"budget_usd": 10**400},
]
THRESHOLD = {"metric": "failed_runs", "op": "gte", "value": 1, "window_minutes": 5}
BAD_THRESHOLDS = [
    {"value": float("nan")}, {"value": float("inf")}, {"value": 10**400}, {"value": True}, {"value": "1"},
    {"window_minutes": 0}, {"window_minutes": float("inf")}, {"window_minutes": 10**7}, {"window_minutes": -5},
    {"cooldown": 5},
]
BAD_ZONES = ["Mars/Olympus", "../../etc/passwd", "/etc/passwd", "", "\x00", "Europe/Paris\x00", "America",
             "zone.tab", "tzdata.zi", "\ud800", "a" * 5000, "europe/paris", 5]
BAD_TEXT = [
    ("name", "\ud800"), ("name", "job\x00"), ("name", "x" * 300), ("name", "job\n"), ("name", 5), ("name", ""),
    ("description", "a\x00b"), ("description", "\udfff"), ("action_command", "/bin/true\x00"),
    ("action_command_args", ["ok", "a\x00b"]), ("action_command_args", ["\ud800"]), ("action_command_args", "-c"),
    ("action_command_args", [1]), ("action_cwd", "/tmp\x00"), ("project", "p" * 300), ("project", "\ud800"),
    ("action_model", "m\x00"), ("github_filter", {"types": ["\ud800"]}),
    ("notify", {"kind": "run_ended", "deliver_to": "ops\x00"}), ("notify", {"kind": "run_ended", "deliver_to": "\ud800"}),
    ("notify", {"kind": "run_ended", "deliver_to": "o" * 300}), ("on_fail", {"command": "/bin/false\x00"}),
    ("on_success", {"args": ["\ud800"]}), ("on_success", {"on_fail": {"kind": "playbook"}}),
    ("on_success", {"note": float("nan")}), ("on_success", {"\ud800": 1}),
]


def deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(levels):
        node = {"a": node}
    return node


async def counts(book) -> tuple[int, int, int]:
    """Rows of schedules, of schedule_runs and of status_transitions (facts)."""
    async with book.read() as conn:
        return tuple([(await conn.execute(sa.select(sa.func.count()).select_from(t))).scalar_one()
                      for t in (schedules, schedule_runs, facts_table)])


class Refused:
    """``async with Refused(book, "interval_sec"):`` — the block raises ``kind`` naming ``argument`` or a
    part of it (``notify.deliver_to``, ``action_command_args[1]``), its message starts with that name,
    and the table and fact counts are unchanged."""

    def __init__(self, book, argument: str, kind: type[Exception] = InvalidSchedule, rule: str | None = None) -> None:
        self.book, self.argument, self.kind, self.rule = book, argument, kind, rule
        self.error: BaseException | None = None

    async def __aenter__(self) -> Refused:
        self.before = await counts(self.book)
        return self

    async def __aexit__(self, kind, error, tb) -> bool:
        assert error is not None, f"accepted; {self.argument} should have been refused"
        assert isinstance(error, self.kind), f"{type(error).__name__}: {error}"
        assert isinstance(error, InvalidArgument), error
        assert error.argument.split(".")[0].split("[")[0] == self.argument, (error.argument, self.argument)
        assert str(error).startswith(error.argument), str(error)
        if self.rule is not None:
            assert error.rule == self.rule, (error.rule, str(error))
        assert await counts(self.book) == self.before
        self.error = error
        return True


class SchedulerInputCases:
    """Conformance cases: each bad input the same refusal on every backend."""

    # -- case 1: a cron that never fires ------------------------------------------------------------
    @pytest.mark.parametrize("expr", NEVER_FIRES)
    async def test_a_cron_that_never_fires_is_refused_at_creation(self, book, expr):
        """S18: '0 0 31 2 *' (February 31) is refused with an InvalidSchedule saying it never fires,
        not a CroniterBadDateError; nothing is written."""
        async with Refused(book, "cron_expr", rule="never_fires") as refused:
            await create_schedule(book, command_spec(trigger_type="cron", cron_expr=expr, interval_sec=None))
        assert "never fires" in str(refused.error)

    @pytest.mark.parametrize("expr", NOT_CRON)
    async def test_an_expression_croniter_cannot_read_is_refused(self, book, expr):
        """S18: every croniter error is translated into an InvalidSchedule naming cron_expr."""
        async with Refused(book, "cron_expr"):
            await create_schedule(book, command_spec(trigger_type="cron", cron_expr=expr, interval_sec=None))

    async def test_a_settings_schedule_whose_cron_never_fires_is_a_statebook_error(self, book):
        """S18: the daemon's ``[[scheduler.schedules]]`` go through create_schedule: the same refusal, nothing written."""
        spec = command_spec("nightly", trigger_type="cron", cron_expr="0 0 31 2 *", interval_sec=None)
        before = await counts(book)
        with pytest.raises(StatebookError) as err:
            await seed_schedules(book, Settings(scheduler=SchedulerSettings(schedules=[spec])))
        assert isinstance(err.value, ConfigError), type(err.value)  # a settings error: the CLI exits 2
        assert "'nightly'" in str(err.value) and "cron_expr" in str(err.value) and "never fires" in str(err.value)
        assert await counts(book) == before

    @pytest.mark.parametrize("route", ["-rf", "", "a\x00b", "\ud800"], ids=repr)
    async def test_a_notify_route_enqueue_would_refuse_is_refused_at_creation(self, book, route):
        """S18 with O22: the dispatch a run's end enqueues is checked when the schedule is made, not when the
        run's final transaction would fail on it."""
        async with Refused(book, "notify"):
            await create_schedule(book, command_spec(notify={"kind": "run_ended", "deliver_to": route}))

    # -- case 2: at_time --------------------------------------------------------------------------------
    @pytest.mark.parametrize("at", BAD_AT, ids=repr)
    async def test_at_time_must_be_a_finite_time_between_1970_and_9999(self, book, at):
        """S18: an at trigger's time nan, inf, 1e400, before 1970 or after 9999 is refused naming at_time."""
        async with Refused(book, "at_time"):
            await create_schedule(book, command_spec(trigger_type="at", at_time=at, interval_sec=None))

    # -- case 3: numbers in their documented ranges --------------------------------------------------
    @pytest.mark.parametrize("over", BAD_NUMBERS, ids=repr)
    async def test_numbers_outside_their_range_are_refused_on_every_backend(self, book, over):
        """S18: interval 99999999999 (accepted by SQLite, a database error on PostgreSQL before) and every
        other number of a schedule outside its range is refused the same way on both backends."""
        (field,) = over
        async with Refused(book, field):
            await create_schedule(book, command_spec(**over))

    @pytest.mark.parametrize("over", BAD_THRESHOLDS, ids=repr)
    async def test_threshold_numbers_are_finite_and_in_range(self, book, over):
        """S18: a threshold's value and window are finite numbers in range; unknown keys are refused."""
        async with Refused(book, "threshold_config") as refused:
            await create_schedule(book, command_spec(threshold_config={**THRESHOLD, **over}))
        assert refused.error is not None

    async def test_the_range_bounds_are_accepted_on_every_backend(self, book):
        """S18: the largest interval, max_runs and budget_tokens, and the year 9999, are stored on both backends."""
        await create_schedule(book, command_spec("a", interval_sec=INTERVAL_SECONDS[1], max_runs=2**31 - 1,
                                                 budget_tokens=2**31 - 1, budget_usd=1e12))
        at = await create_schedule(book, command_spec("b", trigger_type="at", interval_sec=None,
                                                      at_time=253402300799.0))
        assert at.next_fire_at.timestamp() == 253402300799.0
        assert (await verify(book)).ok

    # -- case 4: time zones -------------------------------------------------------------------------
    @pytest.mark.parametrize("zone", BAD_ZONES, ids=repr)
    async def test_a_schedule_zone_must_be_an_iana_zone(self, book, zone):
        """S18: a zone that is not an IANA key (unknown, a path, a folder, a data file, empty, NUL) is
        refused at creation, not stored with a warning."""
        async with Refused(book, "timezone"):
            await create_schedule(book, command_spec(trigger_type="cron", cron_expr="0 3 * * *", interval_sec=None,
                                                     timezone=zone))

    async def test_a_real_zone_is_kept_and_the_default_zone_still_falls_back(self, book, caplog):
        """S18/S4: 'Europe/Paris' is stored; an unknown *default* zone (the daemon's setting) warns and means UTC."""
        row = await create_schedule(book, command_spec("paris", trigger_type="cron", cron_expr="0 3 * * *",
                                                       interval_sec=None, timezone="Europe/Paris"))
        assert row.timezone == "Europe/Paris"
        with caplog.at_level(logging.WARNING, logger="statebook.scheduler"):
            utc = await create_schedule(book, command_spec("utc", trigger_type="cron", cron_expr="0 3 * * *",
                                                           interval_sec=None), default_zone="Mars/Olympus")
        assert "Mars/Olympus" in caplog.text and utc.next_fire_at.timestamp() % 3600 == 0
        async with Refused(book, "default_zone", InvalidArgument):
            await create_schedule(book, command_spec("nul", trigger_type="cron", cron_expr="0 3 * * *",
                                                     interval_sec=None), default_zone="UTC\x00")

    # -- case 5: text, JSON, types, every public function ---------------------------------------------
    @pytest.mark.parametrize("field, value", BAD_TEXT, ids=repr)
    async def test_text_that_no_backend_stores_alike_is_refused(self, book, field, value):
        """S18: a lone surrogate, a NUL, text too long for an index, a wrong type: refused naming the field."""
        async with Refused(book, field) as refused:
            await create_schedule(book, command_spec(**{field: value}))
        assert refused.error is not None

    async def test_json_within_the_books_limits(self, book):
        """S18: a follow-up nested 3,000 levels deep, or arguments over the book's JSON size, are refused."""
        async with Refused(book, "on_success", rule="depth"):
            await create_schedule(book, command_spec(on_success=deep(3000)))
        async with Refused(book, "on_success", rule="depth"):
            await create_schedule(book, command_spec(on_success=deep(book.limits.json_depth + 1)))
        async with Refused(book, "action_command_args", rule="size"):
            await create_schedule(book, command_spec(action_command_args=["x" * book.limits.json_bytes]))

    @pytest.mark.parametrize("request_", [None, 5, "job", ["name"], CreateScheduleRequest], ids=repr)
    async def test_a_request_of_the_wrong_type_is_refused(self, book, request_):
        """S18: create_schedule takes a CreateScheduleRequest or a mapping of its fields, nothing else."""
        async with Refused(book, "request", rule="type"):
            await create_schedule(book, request_)

    async def test_pydantic_errors_become_one_invalid_schedule_naming_the_field(self, book):
        """S18: no ValidationError leaves create_schedule; an unknown field names the nearest one."""
        async with Refused(book, "intervl_sec", rule="unknown_field") as refused:
            await create_schedule(book, {**command_spec(), "intervl_sec": 5})
        assert "did you mean 'interval_sec'" in str(refused.error)
        async with Refused(book, "trigger_type"):
            await create_schedule(book, command_spec(trigger_type="hourly"))
        async with Refused(book, "name"):
            await create_schedule(book, {k: v for k, v in command_spec().items() if k != "name"})
        async with Refused(book, "enabled"):
            await create_schedule(book, command_spec(enabled="maybe"))
        assert isinstance(refused.error, ScheduleError)

    async def test_a_request_changed_after_it_was_made_is_checked_again(self, book):
        """S18: a request built without validation (or mutated) is validated again before any write."""
        good = CreateScheduleRequest.model_validate(command_spec())
        good.interval_sec = 99999999999
        async with Refused(book, "interval_sec"):
            await create_schedule(book, good)
        unchecked = CreateScheduleRequest.model_construct(**{**command_spec(), "name": "a\x00"})
        async with Refused(book, "name"):
            await create_schedule(book, unchecked)

    @pytest.mark.parametrize("ref", ["\ud800", "job\x00", "x" * 300, 5, None, b"job"], ids=repr)
    async def test_lookups_and_commands_refuse_a_bad_reference(self, book, ref):
        """S18: every function taking a schedule or run reference refuses one no index can compare."""
        await make(book)
        for call in (find_schedule, get_schedule, enable_schedule, disable_schedule, delete_schedule):
            async with Refused(book, "ref", InvalidArgument):
                await call(book, ref)
        for call in (get_run, cancel_run):
            async with Refused(book, "run_id", InvalidArgument):
                await call(book, ref)
        if ref is not None:  # list_runs(book, None): every schedule's runs
            async with Refused(book, "schedule_id", InvalidArgument):
                await list_runs(book, ref)
        eng = SchedulerEngine(book, settings(), launcher=FakeSpawner())
        async with Refused(book, "schedule_id", InvalidArgument):
            await eng.fire_now(ref)
        await eng.stop()

    @pytest.mark.parametrize("call, argument", [
        (lambda book: list_runs(book, limit=-1), "limit"), (lambda book: list_runs(book, limit=0), "limit"),
        (lambda book: list_runs(book, limit=2**63), "limit"), (lambda book: list_runs(book, limit="5"), "limit"),
        (lambda book: list_runs(book, limit=True), "limit"), (lambda book: list_runs(book, status="runing"), "status"),
        (lambda book: list_runs(book, status="\x00"), "status"),
        (lambda book: list_schedules(book, include_deleted="yes"), "include_deleted"),
        (lambda book: disable_schedule(book, "job", actor="cli"), "actor"),
        (lambda book: cancel_run(book, "r1", actor=None), "actor"),
        (lambda book: create_schedule(book, command_spec("other"), actor="cli"), "actor"),
        (lambda book: create_schedule(book, command_spec("other"), default_zone=5), "default_zone"),
        (lambda book: enable_schedule(book, "job", default_zone="\ud800"), "default_zone"),
    ], ids=lambda v: v if isinstance(v, str) else "")
    async def test_other_arguments_are_checked_before_any_read(self, book, call, argument):
        """S18: limits, statuses, flags, actors and the default zone are checked like any argument."""
        await make(book)
        async with Refused(book, argument, InvalidArgument):
            await call(book)

    @pytest.mark.parametrize("now", [float("nan"), float("inf"), -1.0, 1e300, "now"], ids=repr)
    async def test_engine_times_are_finite(self, book, clock, now):
        """S18: the engine's evaluate and check_missed_fires refuse a time that is not finite and in range."""
        eng = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner())
        async with Refused(book, "now", InvalidArgument):
            await eng.evaluate(now)
        async with Refused(book, "now", InvalidArgument):
            await eng.check_missed_fires(now)
        await eng.stop()

    async def test_a_poll_with_malformed_events_fires_the_good_ones(self, book, clock):
        """S18: what a Poller returns is outside data: non-objects are skipped, text is made storable
        (a lone surrogate replaced, NUL removed), an id that is no number is ignored."""
        s = await make(book, "gh", trigger_type="github_poll", github_repo="octo/repo", interval_sec=None,
                       poll_interval_sec=60, overlap_policy="allow")
        when = "2100-01-01T00:00:00Z"
        events = (None, "junk", {"id": "9" * 5000, "type": "IssuesEvent", "created_at": when},
                  {"id": "7", "type": "Issues\ud800Event", "created_at": when, "actor": "nobody",
                   "payload": {"action": "open\x00ed", "issue": {"title": "t\ud800", "number": 2**70, "labels": 3}}})

        class Garbage:
            async def fetch(self, repo, *, etag, cursor):
                return PollResult("ok", events=events, pages=1)

        eng = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner(), poller=Garbage())
        await eng.start(loop=False)
        await eng.tick()
        await eng.wait_idle()
        (run,) = await runs_of(book, s.id)
        event = run["trigger_context"]["event"]
        assert (event["id"], event["type"], event["action"], event["title"]) == ("7", "Issues?Event", "opened", "t?")
        assert event["number"] is None and event["actor"] is None
        assert (await verify(book)).ok
        await eng.stop()

    # -- case 6: a manual fire says how its run ended ---------------------------------------------------
    async def test_a_manual_fire_whose_run_fails_says_so(self, book, clock):
        """S18: fire_and_wait returns the run and its follow-ups once they ended; a run that failed
        (missing_cwd) makes ``failed`` true, so ``schedule fire`` can exit 1."""
        s = await make(book)
        eng = SchedulerEngine(book, settings(tmp_cwd="/nonexistent/dir"), clock=clock)
        fire = await eng.fire_and_wait(s.id)
        assert (fire.status, fire.failed) == ("failed", True)
        assert fire.runs[0].status_reason_code == "schedule_run.failed.missing_cwd"
        assert fire.run_id == (await runs_of(book, s.id))[0]["id"]
        await eng.stop()

    async def test_a_manual_fire_that_completes_is_not_failed(self, book, clock):
        """S18: a run that exits 0 with a follow-up that exits 0: two runs, none failed."""
        s = await make(book, on_success={"command_args": ["-c", "pass"]})
        eng = SchedulerEngine(book, settings(max_chain_depth=1), clock=clock, launcher=FakeSpawner(exit_code=0))
        fire = await eng.fire_and_wait(s.id)
        assert [r.status for r in fire.runs] == ["completed", "completed"] and not fire.failed
        assert fire.runs[1].chain_parent_id == fire.run_id
        await eng.stop()
