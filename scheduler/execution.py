"""Executing an admitted run: build the launch, spawn, finalize by outcome, then follow-ups inline.

Runs that end at about the same time are finalized together (:class:`EndingGroups`): one
transaction for the terminal transitions of every run whose ending was asked for meanwhile, each
with its notification (S9), as the outbox finalizes deliveries in groups.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from statebook.lifecycle import Book, Outcome, Reason

from .chains import child_context, may_continue, overlay_schedule, pick_continuation
from .errors import LaunchRefused
from .launcher import Launch, ProcessResult, build_launch, spawn_and_wait
from .runs import Ending, finalize_run, finalize_runs, open_run

log = logging.getLogger("statebook.scheduler")

Spawner = Callable[..., Awaitable[ProcessResult]]


class EndingGroups:
    """Finalize runs in groups: an ending asked for while a group is being written joins the next.

    Each group is one :func:`finalize_runs` transaction (a group of one, :func:`finalize_run`); if it
    fails, its endings are written one by one so one bad ending (say, a notification refused) fails alone. The writer
    is a task of its own: a caller cancelled while waiting does not interrupt the others' transaction.
    """

    def __init__(self, book: Book) -> None:
        self.book = book
        self._pending: list[tuple[Ending, asyncio.Future[Outcome]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def end(self, ending: Ending) -> Outcome:
        """The outcome of ``ending`` once its group is committed (``conflict``: another ending won)."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append((ending, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="statebook-run-endings")
        return await future

    async def _write(self) -> None:
        group: list[tuple[Ending, asyncio.Future[Outcome]]] = []
        try:
            await asyncio.sleep(0)  # endings already on their way join the first group
            while self._pending:
                group, self._pending = self._pending, []
                if len(group) == 1:
                    await self._one_by_one(group)
                    continue
                try:
                    outcomes = await finalize_runs(self.book, [e for e, _ in group])
                except Exception:  # noqa: BLE001 - nothing of the group was written; one by one below
                    log.warning("finalizing %d runs together failed; one by one", len(group), exc_info=True)
                    await self._one_by_one(group)
                    continue
                for (_, future), outcome in zip(group, outcomes, strict=True):
                    if not future.done():
                        future.set_result(outcome)
        finally:  # the writer itself was cancelled (the loop is closing): nobody waits forever
            for _, future in [*group, *self._pending]:
                if not future.done():
                    future.cancel()

    async def _one_by_one(self, group: list[tuple[Ending, asyncio.Future[Outcome]]]) -> None:
        for e, future in group:
            try:
                outcome = await finalize_run(self.book, e.run_id, e.target, reason=e.reason, patch=e.patch,
                                             schedule=e.schedule, actor=e.actor, expected=e.expected)
            except Exception as exc:  # noqa: BLE001 - the caller sees its own ending's error
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(outcome)


class Executor:
    """Runs one top-level fire and its follow-up chain; owned by a :class:`SchedulerEngine`."""

    def __init__(self, book: Book, *, daemon_id: str, deadline: float, max_depth: int,
                 executable: list[str] | None, fallback_cwd: str | None, stdout_log: str | None,
                 projects: Mapping[str, str] | None = None, spawner: Spawner | None = None) -> None:
        self.book = book
        self.daemon_id = daemon_id
        self.deadline = deadline
        self.max_depth = max_depth
        self.executable = executable
        self.fallback_cwd = fallback_cwd
        self.stdout_log = stdout_log
        self.projects = dict(projects or {})
        self.spawner = spawner or spawn_and_wait
        self.current: dict[str, asyncio.Task[Any]] = {}
        """run id -> the task executing it (for operator cancellation)."""
        self.pids: dict[str, int] = {}
        self.shutdown_reason: dict[str, str] = {}
        self.endings = EndingGroups(book)

    async def run_chain(self, schedule: Mapping[str, Any], run_id: str, context: Mapping[str, Any]) -> list[str]:
        """Execute ``run_id``, then at most one continuation per step while depth < cap. Returns run ids."""
        ran = [run_id]
        effective, depth = dict(schedule), 0
        while True:
            status, exit_code = await self.execute(effective, run_id, context)
            overlay = pick_continuation(effective, exit_code) if status in ("completed", "failed", "timed_out") else None
            if overlay is None or not may_continue(depth, self.max_depth):
                return ran
            effective = overlay_schedule(effective, overlay)
            context = child_context(context, run_id, exit_code, status)
            depth += 1
            run_id = await open_run(
                self.book, effective, context=context, daemon_id=self.daemon_id, chain_parent_id=run_id,
                chain_depth=depth, action_kind=effective.get("action_kind"),
                reason=Reason("schedule_run.running.follow_up", f"follow-up at depth {depth} after {status}"),
            )
            ran.append(run_id)

    async def execute(self, schedule: Mapping[str, Any], run_id: str, context: Mapping[str, Any]) -> tuple[str, int | None]:
        """One run from ``running`` to a terminal status; returns (status, exit code)."""
        try:
            launch = build_launch(schedule, context, executable=self.executable, projects=self.projects,
                                  fallback_cwd=self.fallback_cwd)
        except LaunchRefused as exc:
            await self._end(schedule, run_id, "failed", exc.reason, str(exc), {"error_detail": str(exc)})
            return "failed", None
        task = asyncio.current_task()
        if task is not None:
            self.current[run_id] = task
        try:
            result = await self.spawner(launch, run_id=run_id, deadline=self.deadline, stdout_log=self.stdout_log,
                                        on_spawn=lambda pid: self._launched(run_id, pid, launch))
        except LaunchRefused as exc:
            await self._end(schedule, run_id, "failed", exc.reason, str(exc), {"error_detail": str(exc)})
            return "failed", None
        except asyncio.CancelledError:
            why = self.shutdown_reason.pop(run_id, "shutdown")
            if why == "shutdown":
                await asyncio.shield(self._end(schedule, run_id, "cancelled", "schedule_run.cancelled.shutdown",
                                               "the daemon stopped; the process group was terminated", {}))
            raise
        except Exception as exc:  # noqa: BLE001 - any launcher failure becomes a visible failed run
            log.exception("run %s failed inside the scheduler", run_id)
            await self._end(schedule, run_id, "failed", "schedule_run.failed.internal_error", repr(exc),
                            {"error_detail": repr(exc)})
            return "failed", None
        finally:
            self.current.pop(run_id, None)
        return await self._finish(schedule, run_id, launch, result)

    async def _finish(self, schedule: Mapping[str, Any], run_id: str, launch: Launch, result: ProcessResult) -> tuple[str, int | None]:
        """Record how the process ended; returns the status the run actually has (an operator's
        earlier cancel wins, and then no follow-up is chosen)."""
        patch: dict[str, Any] = {"exit_code": result.exit_code, "action_args": launch.argv, **result.report}
        if result.timed_out:
            patch["error_detail"] = result.stderr_tail or None
            status = await self._end(schedule, run_id, "timed_out", "schedule_run.timed_out.deadline",
                                     f"no exit within {self.deadline:g} s; process group terminated", patch)
        elif result.exit_code == 0:
            status = await self._end(schedule, run_id, "completed", "schedule_run.completed.exit_zero", "exit 0", patch)
        else:
            patch["error_detail"] = result.stderr_tail or None
            status = await self._end(schedule, run_id, "failed", "schedule_run.failed.nonzero_exit",
                                     f"exit {result.exit_code}", patch)
        return status, result.exit_code

    async def _launched(self, run_id: str, pid: int, launch: Launch) -> None:
        # The schedule_run graph has no running -> running edge (specs/schedule_run.md), so the child's pid
        # is kept in memory and recorded with the terminal transition.
        self.pids[run_id] = pid
        log.info("run %s launched pid %s in %s", run_id, pid, launch.cwd)

    async def _end(self, schedule: Mapping[str, Any], run_id: str, status: str, code: str, summary: str,
                   patch: Mapping[str, Any]) -> str:
        """Finalize the run; returns its status afterwards (another writer's ending, if it won)."""
        pid = self.pids.pop(run_id, None)
        if pid is not None:
            patch = {**patch, "pid": pid}
        out = await self.endings.end(Ending(run_id, status, Reason(code, summary[:500]), patch, schedule))
        if out.conflict:
            log.info("run %s was already ended elsewhere (now %s); kept that ending", run_id, out.status)
            return out.status or status
        log.info("run %s of %s ended %s (%s)", run_id, schedule.get("name", "-"), status, summary[:200],
                 extra={"run_id": run_id, "schedule": schedule.get("name"), "outcome": status, "reason": code})
        return status
