"""Shared helpers for the scheduler tests: settings, a fake launcher, schedule specs."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import sqlalchemy as sa

from statebook.adapters.settings import LauncherSettings, SchedulerSettings, Settings
from statebook.scheduler.launcher import Launch, ProcessResult
from statebook.scheduler.schema import schedule_runs
from statebook.scheduler.models import Schedule
from statebook.scheduler.store import create_schedule


def settings(tmp_cwd: str = "/tmp", **scheduler: Any) -> Settings:
    return Settings(scheduler=SchedulerSettings(**scheduler), launcher=LauncherSettings(cwd=tmp_cwd))


class FakeSpawner:
    """Stands in for spawn_and_wait: records launches; exit codes by script; optional blocking gate."""

    def __init__(self, exit_code: int = 0, report: dict[str, Any] | None = None) -> None:
        self.exit_code = exit_code
        self.report = report or {}
        self.launches: list[tuple[str, Launch]] = []
        self.gate: asyncio.Event | None = None
        self.codes: list[int] = []

    def hold(self) -> None:
        self.gate = asyncio.Event()

    def release(self) -> None:
        assert self.gate is not None
        self.gate.set()

    async def __call__(self, launch: Launch, *, run_id: str, deadline: float, stdout_log: str | None = None,
                       on_spawn: Any = None, **_: Any) -> ProcessResult:
        self.launches.append((run_id, launch))
        if on_spawn is not None:
            await on_spawn(4242)
        if self.gate is not None:
            await self.gate.wait()
        code = self.codes.pop(0) if self.codes else self.exit_code
        return ProcessResult(code, "" if code == 0 else "boom", False, dict(self.report))


def command_spec(name: str = "job", **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name, "trigger_type": "interval", "interval_sec": 60, "action_kind": "command",
        "action_command": sys.executable, "action_command_args": ["-c", "pass"],
    }
    spec.update(over)
    return spec


async def make(book: Any, name: str = "job", **over: Any) -> Schedule:
    return await create_schedule(book, command_spec(name, **over))


async def runs_of(book: Any, schedule_id: str | None = None) -> list[dict[str, Any]]:
    q = sa.select(schedule_runs).order_by(schedule_runs.c.created_at, schedule_runs.c.chain_depth)
    if schedule_id is not None:
        q = q.where(schedule_runs.c.schedule_id == schedule_id)
    async with book.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(q)]
