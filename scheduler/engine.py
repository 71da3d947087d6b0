"""``SchedulerEngine``: the supervised loop that evaluates schedules and fires admitted runs.

tick() = reapers (interval-gated) → SQLite checkpoint (interval-gated) → operator cancellations →
schedule evaluation; each concern isolated from the others' failures. Dispatch delivery runs in its
own task next to the engine (the daemon composes it), so a slow delivery scan never delays a fire.
Between ticks the loop sleeps until the earliest next fire time or the tick interval, and wakes early
on a committed schedule change in this process (new schedule, manual fire) or a freed slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Clock, Reason, tracing
from statebook.lifecycle.inputs import KEY_CHARS, text, timestamp

from . import admission as gates
from . import evaluation
from .execution import Executor, Spawner
from .firing import Firing
from .errors import LeadershipLost
from .leadership import Leader, Unfenced
from .models import ScheduleRun
from .polling import GithubPolling, Poller
from .recovery import _LIVE_DAEMONS, new_daemon_id, reap
from .runs import finalize_run
from .schema import schedule_runs, schedules
from .store import SCHEDULER, ref_arg
from .triggers import following

log = logging.getLogger("statebook.scheduler")


@dataclass(frozen=True)
class ManualFire:
    """A manual fire once it ended (:meth:`SchedulerEngine.fire_and_wait`): the fired run and its
    follow-ups, in chain order."""

    runs: tuple[ScheduleRun, ...]

    @property
    def run_id(self) -> str:
        """The id of the first run the fire created."""
        return self.runs[0].id

    @property
    def status(self) -> str:
        """the fired run's final status"""
        return self.runs[0].status

    @property
    def failed(self) -> bool:
        """some run of the chain did not complete (it failed, timed out or was cancelled)"""
        return any(run.status != "completed" for run in self.runs)


class SchedulerEngine:
    """See the module docstring. ``tick()`` is separately callable (tests drive it on a FakeClock)."""

    def __init__(self, book: Book, settings: Any, *, clock: Clock | None = None, launcher: Spawner | None = None,
                 leader: Leader | None = None, daemon_id: str | None = None,
                 projects: Mapping[str, str] | None = None,
                 reapers: list[Callable[[], Awaitable[Any]]] | None = None, poller: Poller | None = None) -> None:
        if daemon_id is not None:
            text("daemon_id", daemon_id, max_chars=KEY_CHARS, empty=False)
        self.book = book.with_clock(clock) if clock is not None else book
        self.cfg = settings.scheduler
        lcfg = settings.launcher
        self.daemon_id = daemon_id or new_daemon_id()
        self.leader: Leader = leader if leader is not None else Unfenced()
        self.slots = gates.Slots(self.cfg.max_concurrent)
        self.executor = Executor(
            self.book, daemon_id=self.daemon_id, deadline=self.cfg.invocation_deadline_seconds,
            max_depth=self.cfg.max_chain_depth, executable=lcfg.executable, fallback_cwd=lcfg.cwd,
            stdout_log=lcfg.stdout_log, projects=projects or getattr(lcfg, "projects", None), spawner=launcher,
        )
        self.extra_reapers = list(reapers or [])
        self.fire_tasks: set[asyncio.Task[Any]] = set()
        self.next_due: float | None = None
        self.stats = {"ticks": 0, "fired": 0, "skipped": 0, "deferred": 0, "errors": 0, "fallbacks": 0}
        self.firing = Firing(self.book, leader=self.leader, slots=self.slots, daemon_id=self.daemon_id,
                             zone=self.cfg.timezone, record_every=self.cfg.deferred_record_every,
                             launch=self._launch, stats=self.stats)
        self.polling = GithubPolling(self.firing, poller, tick_seconds=self.cfg.tick_seconds)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self._last_reap: float | None = None
        self._last_checkpoint: float | None = None
        self._was_leader = False
        self._operator_tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.on_tick: Callable[[SchedulerEngine], None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self, *, loop: bool = True) -> None:
        """Recover orphaned runs, then (as leader) handle missed fires; then start the loop."""
        _LIVE_DAEMONS.add(self.daemon_id)
        self.book.on_commit.append(self._on_commit)
        leading = await self._leading()
        await self.recover()
        if leading:
            await self.check_missed_fires()
        if loop:
            self._task = asyncio.create_task(self._loop(), name="statebook-scheduler")

    async def stop(self) -> None:
        """Cancel the loop and every fire (their process groups are terminated), then wait for them."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        tasks = list(self.fire_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.fire_tasks.clear()
        if self._on_commit in self.book.on_commit:
            self.book.on_commit.remove(self._on_commit)
        _LIVE_DAEMONS.discard(self.daemon_id)

    async def wait_idle(self) -> None:
        """Wait until every fire task (and its follow-ups) has finished (tests, ``--for``)."""
        while self.fire_tasks:
            await asyncio.gather(*list(self.fire_tasks), return_exceptions=True)

    def wake(self) -> None:
        """Wake the engine's loop now instead of at the next tick."""
        self._wake.set()

    def _on_commit(self, entity_type: str) -> None:
        if entity_type == "schedule":
            self._wake.set()

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - the loop survives; the next tick retries
                log.exception("scheduler tick failed")
            timeout = self.cfg.tick_seconds
            if self.next_due is not None and not self.firing.deferred_now:
                timeout = min(timeout, max(0.0, self.next_due - self.book.clock.now()))
            try:
                await asyncio.wait_for(self._wake.wait(), max(timeout, 0.01))
            except asyncio.TimeoutError:
                pass

    async def _leading(self) -> bool:
        """Ask leadership once per tick (this renews the daemon's heartbeat and the lease, S14)."""
        leading = await self.leader.is_leader()
        if leading and not self._was_leader and self._task is not None:
            log.info("daemon %s took over schedule evaluation", self.daemon_id)
        self._was_leader = leading
        return leading

    # -- the tick -----------------------------------------------------------------------------
    async def tick(self) -> None:
        """One tick: reap stale runs, checkpoint, watch cancellations and evaluate every due schedule; a failing
        step is logged and the others still run.
        """
        now = self.book.clock.now()
        self.stats["ticks"] += 1
        await self._isolated("reapers", lambda: self._reap_if_due(now))
        await self._isolated("checkpoint", lambda: self._checkpoint_if_due(now))
        await self._isolated("cancellations", self.watch_cancellations)
        await self._isolated("schedules", lambda: self.evaluate(now))
        if self.on_tick is not None:
            self.on_tick(self)

    async def _isolated(self, what: str, fn: Callable[[], Awaitable[Any]]) -> None:
        try:
            await fn()
        except LeadershipLost:
            raise  # not a failure of this concern: the whole evaluation stops (S16)
        except Exception:  # noqa: BLE001 - one concern failing never stops the others
            self.stats["errors"] += 1
            log.exception("scheduler concern %r failed", what)

    async def _reap_if_due(self, now: float) -> None:
        if self._last_reap is not None and now - self._last_reap < self.cfg.reaper_interval_seconds:
            return
        self._last_reap = now
        await self.recover()
        for reaper in self.extra_reapers:
            await self._isolated("reaper", reaper)

    async def _checkpoint_if_due(self, now: float) -> None:
        if self._last_checkpoint is None:
            self._last_checkpoint = now
            return
        if now - self._last_checkpoint < self.cfg.checkpoint_interval_seconds:
            return
        self._last_checkpoint = now
        await self.book.upkeep.maintain()  # SQLite: a WAL checkpoint; PostgreSQL: nothing

    # -- recovery -----------------------------------------------------------------------------
    async def recover(self) -> int:
        """Runs left ``running`` by a daemon that is gone end ``failed`` (``recovery.py``, S3, S17)."""
        return await reap(self.book, me=self.daemon_id, leader=self.leader, leading=self._was_leader,
                          executing=self.executor.current)

    async def watch_cancellations(self) -> None:
        """Kill the process group of any run of ours an operator cancelled through the lifecycle."""
        ids = list(self.executor.current)
        if not ids:
            return
        q = sa.select(schedule_runs.c.id, schedule_runs.c.status).where(schedule_runs.c.id.in_(ids))
        async with self.book.read() as conn:
            ended = [row.id for row in await conn.execute(q) if row.status != "running"]
        for run_id in ended:
            task = self.executor.current.get(run_id)
            if task is not None and not task.done():
                log.info("run %s was cancelled by an operator; terminating its process group", run_id)
                self.executor.shutdown_reason[run_id] = "operator"
                self._operator_tasks.add(task)
                task.cancel()

    # -- evaluation ---------------------------------------------------------------------------
    async def evaluate(self, now: datetime | float) -> int:
        """Consider every due active schedule once; returns how many were considered.

        Timed schedules are considered together (:meth:`consider_many`: one transaction for all their
        claims and runs); a github_poll schedule alone, in its place in due order (its poll is an
        HTTP call, never inside a transaction). Fires launch once their claims are committed and the
        evaluation has nothing left to read. ``now``: an aware ``datetime`` or POSIX seconds."""
        now = timestamp("now", now)
        self.firing.deferred_now = False
        if not await self._leading():
            return 0
        try:
            return await self._evaluate_due(now)
        except LeadershipLost as exc:  # S16: the lease was taken over while we were not looking
            log.warning("%s", exc)
            self._was_leader = False
            return 0

    async def _evaluate_due(self, now: float) -> int:
        async with self.book.read() as conn:
            due = [dict(r._mapping) for r in await conn.execute(evaluation.due_query(now))]
        timed: list[dict[str, Any]] = []
        decided: list[evaluation.Decision] = []
        try:
            for row in due:
                if row["trigger_type"] != "github_poll":
                    timed.append(row)
                    continue
                decided += await self._decide_timed(timed, now)
                started, decided, timed = decided, [], []
                self.firing.started(started)
                await self._isolated(f"schedule {row['name']}", partial(self.consider, row, now))
            decided += await self._decide_timed(timed, now)
            async with self.book.read() as conn:
                self.next_due = (await conn.execute(
                    sa.select(sa.func.min(schedules.c.next_fire_at)).where(schedules.c.status == "active")
                )).scalar()
        finally:
            self.firing.started(decided)
        return len(due)

    async def _decide_timed(self, rows: list[dict[str, Any]], now: float) -> list[evaluation.Decision]:
        """Committed decisions for due timed schedules, not yet started; after a failure of the set,
        each schedule alone (isolated, started at once)."""
        if len(rows) > 1:
            try:
                return await self.firing.decide(rows, now)
            except LeadershipLost:
                raise
            except Exception:  # noqa: BLE001 - nothing was written; each schedule alone, isolated
                self.stats["fallbacks"] += 1
                log.warning("evaluating %d due schedules together failed; one by one", len(rows), exc_info=True)
        for row in rows:
            await self._isolated(f"schedule {row['name']}", partial(self.consider, row, now))
        return []

    async def consider(self, s: dict[str, Any], now: datetime | float) -> str:
        """One due schedule, a set of one (S5); returns what happened."""
        now = timestamp("now", now)
        if s["trigger_type"] == "github_poll":
            due = s["next_fire_at"]
            context = {"trigger": s["trigger_type"], "occurrence_at": due, "schedule": s["name"]}
            return await self.polling.poll(s, due, following(s, due, now, self.cfg.timezone), context)  # S13
        return (await self.consider_many([s], now))[0]

    async def consider_many(self, due: list[dict[str, Any]], now: datetime | float) -> list[str]:
        """:meth:`consider` for due timed schedules (distinct, as read by the due query, in due order)
        in ONE transaction (scheduler/evaluation.py), then launch the fires. Returns what happened to
        each. On an error nothing is written, no slot stays taken and the error propagates."""
        decisions = await self.firing.decide(due, timestamp("now", now))
        self.firing.started(decisions)
        return [d.outcome for d in decisions]

    def _launch(self, s: Mapping[str, Any], run_id: str, context: Mapping[str, Any], handle: gates.SlotHandle) -> None:
        self.stats["fired"] += 1

        async def fire() -> None:
            try:
                if context.get("leader_epoch") is not None and not self.leader.holds(self.book.clock.now()):
                    await self._not_launched(s, run_id, context["leader_epoch"])
                    return
                tracer = tracing.active()
                if tracer is None:
                    await self.executor.run_chain(s, run_id, context)
                else:
                    with tracer.span(f"fire {s['name']}", "internal", _fire_attributes(s, run_id, context)):
                        await self.executor.run_chain(s, run_id, context)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if self._stopping or me not in self._operator_tasks:
                    raise
                self._operator_tasks.discard(me)  # an operator cancelled one of its runs: the fire ends here
            finally:
                handle.release()
                self._wake.set()

        task = asyncio.create_task(fire(), name=f"fire-{run_id}")
        self.fire_tasks.add(task)
        task.add_done_callback(self.fire_tasks.discard)

    async def _not_launched(self, s: Mapping[str, Any], run_id: str, epoch: int) -> None:
        """S16: a fire committed under a lease that has lapsed since (this process stalled between the
        commit and the launch) starts no process; its run ends failed, saying why."""
        log.warning("run %s of %s not launched: the scheduler lease of epoch %d lapsed before the launch",
                    run_id, s["name"], epoch)
        await finalize_run(self.book, run_id, "failed", schedule=s, patch={"error_detail": "not launched"},
                           reason=Reason("schedule_run.failed.launch_error",
                                         f"not launched: the scheduler lease of epoch {epoch} lapsed before the launch"))

    # -- manual fire and missed fires ---------------------------------------------------------
    async def fire_now(self, schedule_id: str, *, actor: Actor = SCHEDULER, note: str | None = None) -> str:
        """Fire a schedule now (an operator's act, ``Firing.manual``): budget, max_runs and a global slot
        are checked, a refusal raises (``CapacityExhausted`` when every slot is busy). Returns the run id;
        the run goes on in this engine (:meth:`fire_and_wait` waits for it and says how it ended).
        ``actor`` and ``note`` (the operator and why) are written in the fire's facts."""
        ref_arg("schedule_id", schedule_id)
        return await self.firing.manual(schedule_id, actor=actor, note=note)

    async def fire_and_wait(self, schedule_id: str) -> ManualFire:
        """:meth:`fire_now`, then wait for the run and its follow-ups to end; ``.failed`` says whether
        one of them did not complete (the CLI's ``schedule fire`` exits 1 then)."""
        run_id = await self.fire_now(schedule_id)
        fire = next((t for t in list(self.fire_tasks) if t.get_name() == f"fire-{run_id}"), None)
        if fire is not None:
            await asyncio.gather(fire, return_exceptions=True)
        return ManualFire(tuple(await self._chain(run_id)))

    async def _chain(self, run_id: str) -> list[ScheduleRun]:
        """The run ``run_id`` and its follow-ups (each the child of the one before, S8)."""
        chain: list[ScheduleRun] = []
        async with self.book.read() as conn:
            q = sa.select(schedule_runs).where(schedule_runs.c.id == run_id)
            while (row := (await conn.execute(q)).first()) is not None and len(chain) <= self.cfg.max_chain_depth:
                chain.append(ScheduleRun.from_row(row))
                q = sa.select(schedule_runs).where(schedule_runs.c.chain_parent_id == row.id)
        return chain

    async def check_missed_fires(self, now: datetime | float | None = None) -> int:
        """At start: occurrences that fell due while no daemon ran, by each schedule's missed_fire_policy (S6);
        ``now`` (an aware ``datetime`` or POSIX seconds) defaults to the book's clock."""
        now = self.book.clock.now() if now is None else timestamp("now", now)
        async with self.book.read() as conn:
            due = [dict(r._mapping) for r in await conn.execute(evaluation.due_query(now, limit=100_000))]
        try:
            for s in due:
                await self._isolated(f"missed fire {s['name']}", partial(self.firing.missed, s, now))
        except LeadershipLost as exc:
            log.warning("%s", exc)
            self._was_leader = False
        return len(due)


def _fire_attributes(s: Mapping[str, Any], run_id: str, context: Mapping[str, Any]) -> dict[str, str]:
    """A fire span's attributes: which schedule, which run, which trigger (never the command or its env)."""
    return {"statebook.schedule.id": s["id"], "statebook.schedule.name": s["name"], "statebook.schedule_run.id": run_id,
            "statebook.schedule.trigger": str(context.get("trigger", ""))}
