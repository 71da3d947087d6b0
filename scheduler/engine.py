"""``SchedulerEngine``: the supervised loop that evaluates schedules and fires admitted runs.

tick() = reapers (interval-gated) → SQLite checkpoint (interval-gated) → operator cancellations →
schedule evaluation; each concern isolated from the others' failures. Dispatch delivery runs in its
own task next to the engine (the daemon composes it), so a slow delivery scan never delays a fire.
Between ticks the loop sleeps until the earliest next fire time or the tick interval, and wakes early
on a committed schedule change in this process (new schedule, manual fire) or a freed slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Clock, Reason, transition

from . import admission as gates
from . import evaluation
from .execution import Executor, Spawner
from .leadership import Leader, LeadershipLost, Unfenced
from .occurrence import claim, exhaust
from .polling import GithubPolling, Poller
from .runs import SCHEDULER, finalize_run, open_run
from .schema import schedule_runs, schedules
from .store import ScheduleError, get_schedule
from .triggers import following, missed_between

log = logging.getLogger("statebook.scheduler")

_LIVE_DAEMONS: set[str] = set()
"""daemon ids of engines alive in this process (a run owned by another id of this pid is orphaned)."""


class CapacityExhausted(ScheduleError):
    """A manual fire found every global slot taken."""


class _Abort(Exception):
    """Roll back the claim transaction (max_runs reached after the claim took the row lock)."""


class SchedulerEngine:
    """See the module docstring. ``tick()`` is separately callable (tests drive it on a FakeClock)."""

    def __init__(self, book: Book, settings: Any, *, clock: Clock | None = None, launcher: Spawner | None = None,
                 leader: Leader | None = None, daemon_id: str | None = None,
                 projects: Mapping[str, str] | None = None,
                 reapers: list[Callable[[], Awaitable[Any]]] | None = None, poller: Poller | None = None) -> None:
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
        self.polling = GithubPolling(self, poller)
        self.fire_tasks: set[asyncio.Task[Any]] = set()
        self.deferrals: dict[str, int] = {}
        self.next_due: float | None = None
        self.stats = {"ticks": 0, "fired": 0, "skipped": 0, "deferred": 0, "errors": 0, "fallbacks": 0}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self._last_reap: float | None = None
        self._last_checkpoint: float | None = None
        self._was_leader = False
        self._deferred_now = False
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
            if self.next_due is not None and not self._deferred_now:
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

    @contextlib.asynccontextmanager
    async def fenced(self) -> AsyncIterator[Book]:
        """A write transaction for a fire: its first statement is the leadership fence (S16), so a
        daemon that lost the lease writes nothing (``LeadershipLost``, rolled back)."""
        async with self.book.begin() as tx:
            await self.leader.fence(tx)
            yield tx

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
        await self.book.store.maintain()  # SQLite: a WAL checkpoint; PostgreSQL: nothing

    # -- recovery -----------------------------------------------------------------------------
    def _owner_gone(self, daemon_id: str | None) -> bool:
        if not daemon_id:
            return True
        if daemon_id == self.daemon_id or daemon_id in _LIVE_DAEMONS:
            return False
        host, _, rest = daemon_id.partition(":")
        pid_text = rest.partition(":")[0]
        if host != socket.gethostname() or not pid_text.isdigit():
            return False  # another host: its liveness is not knowable from here
        pid = int(pid_text)
        if pid == os.getpid():
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    async def recover(self) -> int:
        """Runs left ``running`` by a daemon that is gone end ``failed`` (daemon_died); never left forever.

        Gone: a dead pid on this host (any engine sees it), or — seen by the leader — a heartbeat older
        than the lease, on any host (S3, S17)."""
        q = sa.select(schedule_runs.c.id, schedule_runs.c.daemon_id, schedule_runs.c.schedule_id).where(
            schedule_runs.c.status == "running"
        )
        async with self.book.read() as conn:
            rows = list(await conn.execute(q))
        others = {r.daemon_id for r in rows if r.daemon_id and r.daemon_id != self.daemon_id
                  and r.daemon_id not in _LIVE_DAEMONS}
        stale = await self.leader.stale_owners(others) if others and self._was_leader else set()
        count = 0
        for row in rows:
            if row.id in self.executor.current:
                continue
            if row.daemon_id in stale:
                why = f"the heartbeat of daemon {row.daemon_id} is older than the lease; the run was not observed to end"
            elif self._owner_gone(row.daemon_id):
                why = f"daemon {row.daemon_id} is gone; the run was not observed to end"
            else:
                continue
            out = await finalize_run(self.book, row.id, "failed", reason=Reason(
                "schedule_run.failed.daemon_died", why, (f"daemon:{row.daemon_id}",)),
                patch={"error_detail": "owning daemon died"})
            count += out.applied
        if count:
            log.warning("recovered %d run(s) left running by a daemon that died", count)
        return count

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
    def _active_due(self, now: float, limit: int = 1000) -> sa.Select:
        s = schedules
        return (sa.select(s).where(s.c.status == "active", s.c.next_fire_at.is_not(None), s.c.next_fire_at <= now)
                .order_by(s.c.next_fire_at, s.c.id).limit(limit))

    async def evaluate(self, now: float) -> int:
        """Consider every due active schedule once; returns how many were considered.

        Timed schedules are considered together (:meth:`consider_many`: one transaction for all their
        claims and runs); a github_poll schedule alone, in its place in due order (its poll is an
        HTTP call, never inside a transaction). Fires launch once their claims are committed and the
        evaluation has nothing left to read."""
        self._deferred_now = False
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
            due = [dict(r._mapping) for r in await conn.execute(self._active_due(now))]
        timed: list[dict[str, Any]] = []
        decided: list[evaluation.Decision] = []
        try:
            for row in due:
                if row["trigger_type"] != "github_poll":
                    timed.append(row)
                    continue
                decided += await self._decide_timed(timed, now)
                started, decided, timed = decided, [], []
                self._start(started)
                await self._isolated(f"schedule {row['name']}", lambda row=row: self.consider(row, now))
            decided += await self._decide_timed(timed, now)
            async with self.book.read() as conn:
                self.next_due = (await conn.execute(
                    sa.select(sa.func.min(schedules.c.next_fire_at)).where(schedules.c.status == "active")
                )).scalar()
        finally:
            self._start(decided)
        return len(due)

    async def _decide_timed(self, rows: list[dict[str, Any]], now: float) -> list[evaluation.Decision]:
        """Committed decisions for due timed schedules, not yet started; after a failure of the set,
        each schedule alone (isolated, started at once)."""
        if len(rows) > 1:
            try:
                return await self._decide_and_write(rows, now)
            except LeadershipLost:
                raise
            except Exception:  # noqa: BLE001 - nothing was written; each schedule alone, isolated
                self.stats["fallbacks"] += 1
                log.warning("evaluating %d due schedules together failed; one by one", len(rows), exc_info=True)
        for row in rows:
            await self._isolated(f"schedule {row['name']}", lambda row=row: self.consider(row, now))
        return []

    async def consider(self, s: dict[str, Any], now: float) -> str:
        """The gates in the seed's order for one due schedule; returns what happened."""
        if s["trigger_type"] == "github_poll":
            due = s["next_fire_at"]
            context = {"trigger": s["trigger_type"], "occurrence_at": due, "schedule": s["name"]}
            return await self.polling.poll(s, due, following(s, due, now, self.cfg.timezone), context)  # S13
        return (await self.consider_many([s], now))[0]

    async def consider_many(self, due: list[dict[str, Any]], now: float) -> list[str]:
        """:meth:`consider` for due timed schedules (distinct, as read by the due query, in due order)
        in ONE transaction (scheduler/evaluation.py), then launch the fires. Returns what happened to
        each. On an error nothing is written, no slot stays taken and the error propagates."""
        decisions = await self._decide_and_write(due, now)
        self._start(decisions)
        return [d.outcome for d in decisions]

    async def _decide_and_write(self, due: list[dict[str, Any]], now: float) -> list[evaluation.Decision]:
        return await evaluation.decide_and_write(
            self.book, due, now, zone=self.cfg.timezone, slots=self.slots, deferrals=self.deferrals,
            record_every=self.cfg.deferred_record_every, daemon_id=self.daemon_id, fence=self.leader.fence)

    def _start(self, decisions: list[evaluation.Decision]) -> None:
        """After the commit: count, remember deferrals and launch the fires (outside any transaction)."""
        for d in decisions:
            if d.outcome == "skipped_overlap" and d.run_id is not None:
                self.stats["skipped"] += 1
            elif d.outcome == "deferred":
                self.deferrals[d.schedule["id"]] = d.deferrals or 0
                self.stats["deferred"] += 1
                self._deferred_now = True
            elif d.outcome == "fired" and d.handle is not None and d.run_id is not None:
                self.deferrals.pop(d.schedule["id"], None)
                handle, d.handle = d.handle, None
                self._launch(d.schedule, d.run_id, d.context or {}, handle)

    async def fire_in_slot(
        self, s: Mapping[str, Any], due: float, context: Mapping[str, Any],
        claim_and_open: Callable[[], Awaitable[str | None]],
    ) -> str:
        """The last gates of an automatic fire: take a global slot (or record a deferral), then claim
        the occurrence and open its run, then launch it. Returns "deferred", "conflict" or "fired";
        the slot is released on every path that launches nothing."""
        handle = self.slots.try_take()
        if handle is None:
            await self._defer(s, due, context)
            return "deferred"
        try:
            run_id = await claim_and_open()
        except BaseException:
            handle.release()
            raise
        if run_id is None:
            handle.release()
            return "conflict"
        self.deferrals.pop(s["id"], None)
        self._launch(s, run_id, context, handle)
        return "fired"

    async def _over_budget(self, s: Mapping[str, Any]) -> str | None:
        if s.get("budget_usd") is None and s.get("budget_tokens") is None:
            return None
        return gates.over_budget(s, *await gates.spent(self.book, s["id"]))

    async def _advance(self, s: Mapping[str, Any], due: float, nxt: float | None, code: str, summary: str) -> str:
        async with self.fenced() as tx:
            out = await claim(tx, s, due, nxt, fired=False, reason=Reason(code, summary))
        return code.rsplit(".", 1)[1] if out.applied else "conflict"

    async def _defer(self, s: Mapping[str, Any], due: float, context: Mapping[str, Any]) -> None:
        count = self.deferrals.get(s["id"], 0) + 1
        self.deferrals[s["id"]] = count
        self.stats["deferred"] += 1
        self._deferred_now = True
        if gates.deferral_recorded(count, self.cfg.deferred_record_every):
            async with self.fenced() as tx:
                await open_run(tx, s, status="skipped", context={**context, "deferrals": count},
                               daemon_id=self.daemon_id, occurrence_at=due, reason=Reason(
                                   "schedule_run.skipped.deferred_capacity",
                                   f"all {self.slots.limit} slots busy; deferral {count}, the fire stays due"))

    async def _claim_and_open(self, s: Mapping[str, Any], due: float | None, nxt: float | None,
                              context: Mapping[str, Any], extra: Mapping[str, Any], run_reason: str, *,
                              fence: bool = True) -> str | None:
        """Claim (or, for a manual fire, lock) the schedule and open the run in ONE transaction (S1, S6).

        Fenced (S16) unless it is an operator's manual fire, which needs no leadership; the run's
        trigger context records the lease epoch it was fired under."""
        try:
            async with self.book.begin() as tx:
                epoch = await self.leader.fence(tx) if fence else None
                if epoch is not None:
                    context = {**context, "leader_epoch": epoch}
                if due is not None:
                    out = await claim(tx, s, due, nxt, extra=extra, reason=Reason(
                        "schedule.active.fire_claimed", f"occurrence {due} claimed by {self.daemon_id}"))
                elif s["status"] in ("active", "paused"):
                    out = await _touch(tx, s, run_reason)
                else:
                    out = None  # the recovery run of a one-shot already claimed (and exhausted) it
                if out is not None and out.conflict:
                    return None
                # Counted after the row lock is held: two claimants cannot both take the last run.
                if s.get("max_runs") is not None and await gates.top_level_runs(tx, s["id"]) >= s["max_runs"]:
                    raise _Abort
                return await open_run(tx, s, context=context, daemon_id=self.daemon_id, occurrence_at=due,
                                      reason=Reason(run_reason, f"{context.get('trigger')} fire"))
        except _Abort:
            if s["status"] == "active":
                async with (self.fenced() if fence else self.book.begin()) as tx:
                    await exhaust(tx, s, "schedule.exhausted.max_runs", f"{s['max_runs']} run(s) used")
            return None

    def _launch(self, s: Mapping[str, Any], run_id: str, context: Mapping[str, Any], handle: gates.SlotHandle) -> None:
        self.stats["fired"] += 1

        async def fire() -> None:
            try:
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

    # -- manual fire and missed fires ---------------------------------------------------------
    async def fire_now(self, schedule_id: str) -> str:
        """Fire a schedule now: budget, max_runs and a global slot are checked; capacity is refused."""
        s = await get_schedule(self.book, schedule_id)
        if s["status"] not in ("active", "paused"):
            raise ScheduleError(f"schedule {s['name']} is {s['status']}; enable it before firing")
        over = await self._over_budget(s)
        if over:
            if s["status"] == "active":
                await exhaust(self.book, s, "schedule.exhausted.budget", over)
            raise ScheduleError(f"schedule {s['name']} has exhausted its budget ({over})")
        if s.get("max_runs") is not None and await gates.top_level_runs(self.book, s["id"]) >= s["max_runs"]:
            raise ScheduleError(f"schedule {s['name']} has used all {s['max_runs']} of its runs")
        handle = self.slots.try_take()
        if handle is None:
            raise CapacityExhausted(f"all {self.slots.limit} global slots are busy; try again when a run ends")
        context = {"trigger": "manual", "schedule": s["name"], "fired_at": self.book.clock.now()}
        try:
            run_id = await self._claim_and_open(s, None, None, context, {}, "schedule_run.running.manual", fence=False)
        except BaseException:
            handle.release()
            raise
        if run_id is None:
            handle.release()
            raise ScheduleError(f"schedule {s['name']} could not be fired (changed concurrently or max_runs reached)")
        self._launch(s, run_id, context, handle)
        return run_id

    async def check_missed_fires(self, now: float | None = None) -> int:
        """At start: occurrences that fell due while no daemon ran, by each schedule's missed_fire_policy."""
        now = self.book.clock.now() if now is None else now
        async with self.book.read() as conn:
            due = [dict(r._mapping) for r in await conn.execute(self._active_due(now, limit=100_000))]
        try:
            for s in due:
                await self._isolated(f"missed fire {s['name']}", lambda s=s: self._missed(s, now))
        except LeadershipLost as exc:
            log.warning("%s", exc)
            self._was_leader = False
        return len(due)

    async def _missed(self, s: dict[str, Any], now: float) -> None:
        if s["trigger_type"] == "github_poll":
            return  # S13: the cursor covers the downtime; the next tick polls
        due = s["next_fire_at"]
        nxt = following(s, due, now, self.cfg.timezone)
        count = missed_between(s, due, now, self.cfg.timezone)
        evidence = (f"occurrence_at:{due}", f"missed:{count}", f"detected_at:{now}")
        context = {"trigger": "missed_fire", "occurrence_at": due, "missed": count, "schedule": s["name"]}
        if s["missed_fire_policy"] == "skip":
            async with self.fenced() as tx:
                out = await claim(tx, s, due, nxt, fired=False, reason=Reason(
                    "schedule.active.missed_fire", f"{count} occurrence(s) missed while down; skipped", evidence))
                if out.applied:
                    await open_run(tx, s, status="skipped", context=context, daemon_id=self.daemon_id,
                                   occurrence_at=due, reason=Reason(
                                       "schedule_run.skipped.missed_fire", f"{count} occurrence(s) missed", evidence))
            return
        # run_once: reserve the next fire time first; only the reserver launches the recovery run.
        async with self.fenced() as tx:
            out = await claim(tx, s, due, nxt, fired=True, reason=Reason(
                "schedule.active.missed_fire", f"{count} occurrence(s) missed; one recovery run", evidence))
        if out.conflict:
            return
        over = await self._over_budget(s)
        if over:
            async with self.fenced() as tx:
                await exhaust(tx, {**s, "next_fire_at": nxt}, "schedule.exhausted.budget", over)
            return
        handle = self.slots.try_take()
        if handle is None:
            async with self.fenced() as tx:
                await open_run(tx, s, status="skipped", context=context, daemon_id=self.daemon_id, occurrence_at=due,
                               reason=Reason("schedule_run.skipped.deferred_capacity", "no slot for the recovery run"))
            return
        fresh = {**s, "next_fire_at": nxt, "status": out.status}
        try:
            run_id = await self._claim_and_open(fresh, None, None, context, {}, "schedule_run.running.recovery")
        except BaseException:
            handle.release()
            raise
        if run_id is None:
            handle.release()
            return
        self._launch(s, run_id, context, handle)


def new_daemon_id() -> str:
    """``host:pid:random`` — the host and pid let an engine on the same host tell a dead owner (S3)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def _touch(tx: Book, s: Mapping[str, Any], why: str) -> Any:
    """A same-status transition on the schedule: takes its row lock for a manual or recovery fire."""
    status = s["status"]
    return await transition(tx, "schedule", s["id"], status, expected=status, actor=SCHEDULER,
                            patch={"last_fired_at": tx.clock.now()},
                            reason=Reason(f"schedule.{status}.manual_fire", why))
