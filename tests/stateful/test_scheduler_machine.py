"""The scheduler engine on a FakeClock, as a Hypothesis state machine (S1, S3, S4, S5, S6, S8, S9, S11, L7).

Random interval / cron / at schedules (max_runs sometimes, overlap skip/allow, missed-fire
skip/run_once, follow-ups, notifications) meet clock jumps, ticks, manual fires, operator
cancellations, runs that end 0 or 1 whenever the machine says so, capacity exhaustion (one or two
global slots), a second daemon evaluating the same schedules (stale or concurrently), graceful
restarts and crashes: the engine object is dropped without ``stop()`` — at rest, or right after a
tick claimed and opened runs whose launch never happened — and a new engine with a new daemon id
starts on the same book after some downtime (missed fires).

The action runner is ``ControlledSpawner`` (scheduler_model.py): a run stays ``running`` across ticks
until a rule ends it, so fires overlap and slots fill. After every rule the fire tasks run until each
is blocked in the spawner or done; then the invariants read the database. At teardown every run is
finished, the engine stops and starts once more, and nothing may be left ``running``.

Each machine instance owns one ``asyncio.Runner``; the book and the engines live on its loop. SQLite
gets a fresh file per example; PostgreSQL shares the session database, emptied before each example.

Profiles (``HYPOTHESIS_PROFILE``): ``ci`` and the default — 18 examples of up to 30 steps per
backend; ``deep`` — 200 examples of up to 80 steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import socket
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from book_state import book_state
from scheduler_model import (
    ControlledSpawner,
    Crashed,
    Snapshot,
    check_cadence,
    check_chains,
    check_max_runs,
    check_notifications,
    check_occurrences_fire_once,
    check_runs_are_owned,
    deterministic_ids,
    due_schedules,
    schedule_spec,
    settle,
    take_snapshot,
)

from statebook.adapters.db import open_book, reset_schema
from statebook.adapters.settings import LauncherSettings, SchedulerSettings, Settings
from statebook.lifecycle import Book, FakeClock, verify
from statebook.scheduler import engine as engine_module
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.errors import CapacityExhausted
from statebook.scheduler.runs import cancel_run
from statebook.scheduler.errors import ScheduleError
from statebook.scheduler.store import create_schedule

if os.environ.get("HYPOTHESIS_PROFILE") == "deep":
    MAX_EXAMPLES, STEPS = 200, 80
else:  # "ci", "dev" and the everyday default
    MAX_EXAMPLES, STEPS = 18, 30

MACHINE_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

MAX_SCHEDULES = 4
ADVANCE = st.sampled_from([0, 1, 30, 30, 60, 90, 300, 900])
HOST, PID = socket.gethostname(), os.getpid()


def event(text: str) -> None:
    """Count ``text`` in Hypothesis's statistics; a no-op when a step is replayed by hand."""
    with contextlib.suppress(InvalidArgument):
        hypothesis_event(text)


async def _rest() -> None:
    """A step that only lets the fire tasks run (after the machine ended some runs)."""


def guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """Mark the machine unclean while a rule or invariant runs: after a failure, teardown skips its
    final checks (and the loop may hold half-done work), so the first failure is the one reported."""

    @functools.wraps(fn)
    def wrapper(self: SchedulerMachine, *args: Any, **kwargs: Any) -> None:
        self.clean = False
        fn(self, *args, **kwargs)
        self.clean = True

    return wrapper


class SchedulerMachine(RuleBasedStateMachine):
    """One book, one live ``SchedulerEngine`` at a time, a FakeClock. Subclasses set ``make_url``."""

    make_url: Callable[[], str] | None = None
    shared_database = False

    def __init__(self) -> None:
        super().__init__()
        if self.make_url is None:
            raise RuntimeError("run a subclass of SchedulerMachine that sets make_url")
        self.url = self.make_url()
        self.clock = FakeClock()
        self.ids = deterministic_ids()
        self.ids.__enter__()
        self.runner = asyncio.Runner()
        try:
            self.book: Book = self.run(self._open())
        except BaseException:
            self.runner.close()
            self.ids.__exit__(None, None, None)
            raise
        self.engine: SchedulerEngine | None = None
        self.verified: tuple | None = None  # book_state when verify last passed
        self.spawner = ControlledSpawner()
        self.generation = itertools.count()
        self.settings: Settings | None = None
        self.names: dict[str, str] = {}  # schedule id -> name
        self.cadence: dict[str, float | None] = {}  # schedule id -> next_fire_at last seen
        self.operator_cancelled: set[str] = set()
        self.clean = True

    async def _open(self) -> Book:
        book = await open_book(self.url, clock=self.clock)
        if self.shared_database:
            await reset_schema(book.engine)
        return book

    # -- plumbing -----------------------------------------------------------------------------
    def run(self, coro: Awaitable[Any]) -> Any:
        return self.runner.run(coro)  # type: ignore[arg-type]

    @property
    def live(self) -> SchedulerEngine:
        assert self.engine is not None
        return self.engine

    @property
    def limit(self) -> int:
        assert self.settings is not None
        return self.settings.scheduler.max_concurrent

    def do(self, coro_fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run one step on the loop, then let the fire tasks reach rest (blocked in the spawner or done)."""

        async def step() -> Any:
            result = await coro_fn()
            await settle(self.live.fire_tasks, self.spawner)
            return result

        return self.run(step())

    def snapshot(self) -> Snapshot:
        return self.run(take_snapshot(self.book))

    def new_engine(self) -> SchedulerEngine:
        self.spawner = ControlledSpawner()
        return SchedulerEngine(self.book, self.settings, clock=self.clock, launcher=self.spawner,
                               daemon_id=f"{HOST}:{PID}:gen{next(self.generation)}")

    def held_by_name(self) -> list[str]:
        """Held runs in an order that replays identically: by schedule name, then launch order."""
        snap = self.snapshot()
        key = {rid: (self.names[snap.runs[rid]["schedule_id"]], h.seq) for rid, h in self.spawner.held.items()}
        return sorted(key, key=key.__getitem__)

    async def _start(self) -> None:
        """Start the new engine (recovery, then missed fires — S3, S6) and check what start promises."""
        await self.live.start(loop=False)
        snap = await take_snapshot(self.book)
        foreign = sorted(r for r in snap.running() if snap.runs[r]["daemon_id"] != self.live.daemon_id)
        assert not foreign, f"S3: after start, run(s) {foreign} of a previous daemon are still running"
        late = sorted(s["name"] for s in snap.schedules.values()
                      if s["status"] == "active" and s["next_fire_at"] is not None and s["next_fire_at"] <= snap.now)
        assert not late, f"S6: after start, active schedule(s) {late} are still due; missed fires were not handled"

    # -- rules --------------------------------------------------------------------------------
    @initialize(max_concurrent=st.integers(1, 2), max_chain_depth=st.sampled_from([0, 1, 2, 10]),
                reaper=st.sampled_from([60.0, 300.0]))
    @guarded
    def boot(self, max_concurrent: int, max_chain_depth: int, reaper: float) -> None:
        self.settings = Settings(
            scheduler=SchedulerSettings(max_concurrent=max_concurrent, max_chain_depth=max_chain_depth,
                                        reaper_interval_seconds=reaper),
            launcher=LauncherSettings(cwd=tempfile.gettempdir()),
        )
        self.engine = self.new_engine()
        self.do(self._start)

    @precondition(lambda self: len(self.names) < MAX_SCHEDULES)
    @rule(trigger=st.sampled_from(["interval", "interval", "cron", "at"]),
          interval=st.sampled_from([30, 60, 90, 300]),
          cron=st.sampled_from(["* * * * *", "*/2 * * * *", "*/5 * * * *"]),
          at_offset=st.sampled_from([-120, 0, 45, 600]),
          max_runs=st.none() | st.integers(1, 3),
          overlap=st.sampled_from(["skip", "allow"]),
          missed=st.sampled_from(["skip", "run_once"]),
          follow=st.sampled_from([None, None, "on_success", "on_fail", "both"]),
          notify=st.booleans())
    @guarded
    def add_schedule(self, trigger: str, interval: int, cron: str, at_offset: int, max_runs: int | None,
                     overlap: str, missed: str, follow: str | None, notify: bool) -> None:
        name = f"s{len(self.names)}"
        spec = schedule_spec(name, trigger, interval=interval, cron=cron, at_time=self.clock.now() + at_offset,
                             max_runs=max_runs, overlap=overlap, missed=missed, follow=follow, notify=notify)
        row = self.do(lambda: create_schedule(self.book, spec))
        assert row.status == "active" and row.next_fire_at is not None
        self.names[row.id] = name
        self.cadence[row.id] = row.next_fire_at.timestamp()

    @rule(seconds=ADVANCE)
    @guarded
    def tick(self, seconds: int) -> None:
        """S5: the clock moves on and the engine ticks; afterwards an active schedule stays due only
        when every global slot is taken."""
        self._tick(seconds)

    @rule(pick=st.integers(0, 7), exit_code=st.sampled_from([0, 1]), seconds=ADVANCE)
    @guarded
    def finish_and_tick(self, pick: int, exit_code: int, seconds: int) -> None:
        """A run ends (if one is running), the clock moves on, the engine ticks (the everyday cadence)."""
        self._finish(pick, exit_code)
        self._tick(seconds)

    def _tick(self, seconds: int) -> None:
        now = self.clock.advance(seconds)
        self.do(self.live.tick)
        self.operator_cancelled &= set(self.spawner.held)  # the tick saw them; their tasks are gone
        snap = self.snapshot()
        still_due = sorted(s["name"] for s in snap.schedules.values()
                           if s["status"] == "active" and s["next_fire_at"] is not None and s["next_fire_at"] <= now)
        if still_due:
            event("tick deferred for capacity")
            assert self.live.slots.free == 0, f"S5: {still_due} still due after a tick with {self.live.slots.free} free slot(s)"

    @rule(advance=st.sampled_from([0, 30, 60]), concurrent=st.booleans(),
          manual=st.none() | st.integers(0, MAX_SCHEDULES - 1))
    @guarded
    def rival_tick(self, advance: int, concurrent: bool, manual: int | None) -> None:
        """S1, S5: a second daemon (no leadership, its own slots) evaluates the same due schedules, then
        stops. Stale: it read them before the live engine's tick and considers them after it (always
        the losing side of the race, deterministic on both backends). Concurrent: both tick at once,
        optionally racing a manual fire. Either way every occurrence is claimed once (compare-and-set on
        next_fire_at) and max_runs is re-counted under the schedule's row lock."""
        now = self.clock.advance(advance)
        rival_spawner = ControlledSpawner()
        rival = SchedulerEngine(self.book, self.settings, clock=self.clock, launcher=rival_spawner,
                                daemon_id=f"{HOST}:{PID}:gen{next(self.generation)}-rival")
        engine_module._LIVE_DAEMONS.add(rival.daemon_id)  # alive: the live engine's reaper leaves its runs alone

        async def stale() -> list[Any]:
            due = await due_schedules(self.book, now)
            await self.live.tick()
            await settle(self.live.fire_tasks, self.spawner)
            return [await rival.consider(row, now) for row in due]

        async def race() -> list[Any]:
            racers: list[Awaitable[Any]] = [self.live.tick(), rival.tick()]
            if manual is not None and self.names:
                sid = sorted(self.names, key=self.names.__getitem__)[manual % len(self.names)]
                racers.append(self.live.fire_now(sid))
            return await asyncio.gather(*racers, return_exceptions=True)

        async def both() -> list[Any]:
            results = await (race() if concurrent else stale())
            await settle(rival.fire_tasks, rival_spawner)
            return results

        results = self.do(both)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ScheduleError):
                raise result
        if not concurrent:  # it may fire what the live engine deferred; S1 below says it took nothing twice
            event(f"stale rival: {sorted(set(results))}")
        self.operator_cancelled &= set(self.spawner.held)
        rival_runs = set(rival_spawner.held)
        # The rival's runs are checked while they exist, then it shuts down and they end cancelled.
        snap = self.snapshot()
        check_occurrences_fire_once(snap)
        check_max_runs(snap)
        assert rival.slots.used == len(rival_runs) <= self.limit
        self.run(rival.stop())
        after = self.snapshot()
        for rid in rival_runs:
            assert after.runs[rid]["status"] == "cancelled", f"S3: rival run {rid} ended {after.runs[rid]['status']}"

    @precondition(lambda self: bool(self.names))
    @rule(pick=st.integers(0, MAX_SCHEDULES - 1))
    @guarded
    def fire_now(self, pick: int) -> None:
        """S5: a manual fire checks status, max_runs and a global slot, in that order; a refusal writes no run."""
        sid = sorted(self.names, key=self.names.__getitem__)[pick % len(self.names)]
        before = self.snapshot()
        s = before.schedules[sid]
        if s["status"] not in ("active", "paused"):
            expected: type[Exception] | None = ScheduleError
        elif s["max_runs"] is not None and before.counted(sid) >= s["max_runs"]:
            expected = ScheduleError
        elif self.live.slots.free == 0:
            expected = CapacityExhausted
        else:
            expected = None
        try:
            run_id = self.do(lambda: self.live.fire_now(sid))
        except ScheduleError as exc:
            event(f"fire_now refused: {type(exc).__name__}")
            assert expected is not None and type(exc) is expected, f"S5: fire_now raised {exc!r}, expected {expected}"
            after = self.snapshot()
            assert after.runs.keys() == before.runs.keys(), "S5: a refused manual fire wrote a run"
            return
        assert expected is None, f"S5: fire_now of {s['name']} fired ({run_id}); expected {expected.__name__}"
        run = self.snapshot().runs[run_id]
        assert (run["trigger_context"]["trigger"], run["chain_depth"], run["daemon_id"]) == (
            "manual", 0, self.live.daemon_id)

    @rule(pick=st.integers(0, 7), exit_code=st.sampled_from([0, 1]))
    @guarded
    def finish_run(self, pick: int, exit_code: int) -> None:
        """The fake process of one running run exits; its chain continues or its slot frees."""
        self._finish(pick, exit_code)

    def _finish(self, pick: int, exit_code: int) -> None:
        # No precondition on what is running: on PostgreSQL who wins a race is timing, and rules
        # enabled by timing would make Hypothesis's data generation inconsistent between replays.
        held = self.held_by_name()
        if not held:
            event("nothing running to finish")
            return
        run_id = held[pick % len(held)]
        self.spawner.finish(run_id, exit_code)
        self.do(_rest)
        run = self.snapshot().runs[run_id]
        if run_id in self.operator_cancelled:
            self.operator_cancelled.discard(run_id)
            assert run["status"] == "cancelled", f"S11: operator-cancelled run {run_id} ended {run['status']}"
        else:
            assert (run["status"], run["exit_code"]) == ("completed" if exit_code == 0 else "failed", exit_code)

    @rule(pick=st.integers(0, 7))
    @guarded
    def cancel_by_operator(self, pick: int) -> None:
        """S11: an operator cancels a running run through the lifecycle; the engine notices on its next tick."""
        candidates = [rid for rid in self.held_by_name() if rid not in self.operator_cancelled]
        if not candidates:
            event("nothing running to cancel")
            return
        run_id = candidates[pick % len(candidates)]
        row = self.do(lambda: cancel_run(self.book, run_id))
        assert row.status == "cancelled"
        self.operator_cancelled.add(run_id)

    @precondition(lambda self: bool(self.names))
    @rule(how=st.sampled_from(["crash", "crash_mid_tick", "graceful"]), downtime=st.sampled_from([0, 30, 120, 3600]))
    @guarded
    def restart(self, how: str, downtime: int) -> None:
        """S3, S6: the daemon goes away and a new one (new daemon id, same book) starts after ``downtime``.

        ``crash``: the engine is dropped without stop() while its runs execute; ``crash_mid_tick``: the
        same right after a tick claimed and opened runs whose launch never happened; every orphan ends
        ``failed`` (daemon_died) at the next start. ``graceful``: stop() ends every running run
        ``cancelled`` (shutdown). Either way the start handles the missed fires.
        """
        if how == "graceful":
            running = set(self.spawner.held) - self.operator_cancelled
            self.run(self.live.stop())
            snap = self.snapshot()
            for rid in running:
                assert (snap.runs[rid]["status"], snap.runs[rid]["status_reason_code"]) == (
                    "cancelled", "schedule_run.cancelled.shutdown"), f"S3: run {rid} ended {snap.runs[rid]['status']} at stop"
            orphans: set[str] = set()
        else:
            orphans = self.run(self._crash(mid_tick=how == "crash_mid_tick"))
            event(f"crash left {min(len(orphans), 3)}+ run(s) running" if orphans else "crash left nothing running")
        self.operator_cancelled.clear()
        self.clock.advance(downtime)
        self.engine = self.new_engine()
        self.do(self._start)
        snap = self.snapshot()
        for rid in orphans:
            assert (snap.runs[rid]["status"], snap.runs[rid]["status_reason_code"]) == (
                "failed", "schedule_run.failed.daemon_died"), f"S3: orphan {rid} ended {snap.runs[rid]['status']}"

    async def _crash(self, *, mid_tick: bool) -> set[str]:
        """Kill the live engine's 'process'; returns the runs it left `running`."""
        old, old_spawner = self.live, self.spawner
        old_spawner.crashed = True  # a released run, or one launched from now on, dies with the process
        if mid_tick:
            await old.tick()
        tasks = [*old.fire_tasks, *old_spawner.crashed_tasks]
        for held in list(old_spawner.held.values()):
            held.event.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, Crashed) for r in results), f"a fire task survived the crash: {results}"
        # What the process's death takes with it: its liveness and its in-process wake-up hook.
        engine_module._LIVE_DAEMONS.discard(old.daemon_id)
        if old._on_commit in self.book.on_commit:
            self.book.on_commit.remove(old._on_commit)
        return (await take_snapshot(self.book)).running()

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    @guarded
    def scheduler_invariants(self) -> None:
        """S1, S3, S4, S5, S8, S9 and the global slot limit, read off one snapshot at rest."""
        if self.engine is None:
            return
        snap = self.snapshot()
        check_occurrences_fire_once(snap)
        check_max_runs(snap)
        assert self.settings is not None
        check_chains(snap, self.settings.scheduler.max_chain_depth)
        check_runs_are_owned(snap, live_daemon=self.live.daemon_id, held=set(self.spawner.held),
                             operator_cancelled=self.operator_cancelled)
        check_notifications(snap)
        check_cadence(snap, self.cadence)
        self.cadence = {sid: s["next_fire_at"] for sid, s in snap.schedules.items()}
        # S5 global slot: one slot per live fire chain, never more than the limit; none leaks.
        pending = [t for t in self.live.fire_tasks if not t.done()]
        assert self.live.slots.used == len(pending) <= self.limit, (
            f"S5: {self.live.slots.used} slot(s) taken, {len(pending)} fire(s) alive, limit {self.limit}")
        mine = sum(1 for rid in snap.running() if snap.runs[rid]["daemon_id"] == self.live.daemon_id)
        assert mine <= self.limit, f"S5: {mine} runs running at once, limit {self.limit}"
        assert self.live.stats["errors"] == 0, f"a scheduler concern failed {self.live.stats['errors']} time(s); see the log"
        assert self.live.stats["fallbacks"] == 0, "a tick's set of due schedules could not be evaluated together; see the log"

    @invariant()
    @guarded
    def rows_are_folds(self) -> None:
        """L7: every schedule, run and dispatch row equals the fold of its facts; chains verify."""
        if self.engine is None:
            return
        state = self.run(book_state(self.book))  # nothing verify reads changed: its answer has not either
        if state == self.verified:
            return
        report = self.run(verify(self.book))
        assert report.ok, report.to_json()
        self.verified = state

    # -- teardown -----------------------------------------------------------------------------
    def teardown(self) -> None:
        """S3 at the end: finish every run, stop, start once more — nothing may be left `running`."""
        try:
            if self.engine is not None and self.clean:
                self._drain_and_restart()
        finally:
            try:
                if self.engine is not None:
                    # After a failure the loop may hold half-done work; the first failure is the one to see.
                    with contextlib.suppress(Exception) if not self.clean else contextlib.nullcontext():
                        self.run(self.live.stop())
                self.run(self.book.engine.dispose())
            finally:
                self.runner.close()
                self.ids.__exit__(None, None, None)
                engine_module._LIVE_DAEMONS.difference_update(
                    {d for d in engine_module._LIVE_DAEMONS if d.startswith(f"{HOST}:{PID}:gen")})
                if self.url.startswith("sqlite:///"):
                    for suffix in ("", "-wal", "-shm", ".daemon.lock"):
                        Path(self.url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)

    def _drain(self) -> None:
        for _ in range(12):  # a chain is at most 11 runs long (depth 0..10)
            if not self.spawner.held:
                return
            for run_id in self.held_by_name():
                self.spawner.finish(run_id, 0)
            self.do(_rest)
        assert not self.spawner.held, f"S8: runs still executing after 12 rounds: {sorted(self.spawner.held)}"

    def _drain_and_restart(self) -> None:
        self._drain()
        self.run(self.live.stop())
        assert not self.snapshot().running(), "S3: a run is still running after every run ended and the engine stopped"
        self.engine = self.new_engine()
        self.do(self._start)  # recovery, missed fires (run_once may launch a recovery run)
        self.scheduler_invariants()
        self._drain()
        self.run(self.live.stop())
        snap = self.snapshot()
        assert not snap.running(), f"S3: run(s) {sorted(snap.running())} still running after the final restart"
        report = self.run(verify(self.book))
        assert report.ok, report.to_json()


# -- the tests ---------------------------------------------------------------------------------


def test_scheduler_machine_sqlite(tmp_path_factory: pytest.TempPathFactory) -> None:
    """S1, S3, S4, S5, S6, S8, S9, L7 on SQLite: a fresh database file per example."""
    folder = tmp_path_factory.mktemp("scheduler_machine")
    numbers = itertools.count()

    class OnSqlite(SchedulerMachine):
        make_url = staticmethod(lambda: f"sqlite:///{folder}/book-{next(numbers)}.db")

    run_state_machine_as_test(OnSqlite, settings=MACHINE_SETTINGS)


async def _clean_postgres(url: str) -> None:
    book = await open_book(url)
    try:
        await reset_schema(book.engine)
    finally:
        await book.engine.dispose()


@pytest.mark.postgres
def test_scheduler_machine_postgres(pg_url: str) -> None:
    """S1, S3, S4, S5, S6, S8, S9, L7 on PostgreSQL: the session database, emptied per example."""

    class OnPostgres(SchedulerMachine):
        make_url = staticmethod(lambda: pg_url)
        shared_database = True

    try:
        run_state_machine_as_test(OnPostgres, settings=MACHINE_SETTINGS)
    finally:
        asyncio.run(_clean_postgres(pg_url))


def test_no_follow_up_after_operator_cancel(tmp_path: Path) -> None:
    """S8, S11: a run an operator cancelled takes no follow-up, even when its process exits before the
    engine's next tick (the engine's own finalize is a no-op conflict). Shrunk from the machine."""

    class OnSqlite(SchedulerMachine):
        make_url = staticmethod(lambda: f"sqlite:///{tmp_path}/book.db")

    machine = OnSqlite()
    try:
        machine.boot(max_concurrent=2, max_chain_depth=1, reaper=60.0)
        machine.add_schedule(trigger="interval", interval=30, cron="* * * * *", at_offset=0, max_runs=None,
                             overlap="skip", missed="skip", follow="on_fail", notify=False)
        machine.fire_now(pick=0)
        machine.cancel_by_operator(pick=0)
        machine.finish_run(pick=0, exit_code=1)
        runs = [(r["status"], r["chain_depth"]) for r in machine.snapshot().runs.values()]
        assert runs == [("cancelled", 0)], f"S8/S11: an operator-cancelled run took a follow-up: {runs}"
        machine.scheduler_invariants()
    finally:
        machine.teardown()
