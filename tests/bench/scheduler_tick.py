"""Scheduler tick cost: one evaluation with 10,000 enabled schedules none due, then with 1,000 due.

Run: ``.venv/bin/python tests/bench/scheduler_tick.py [--db URL] [--schedules N] [--due M]``
(default: a fresh SQLite file in a temp dir). Not collected by pytest; prints timings, asserts nothing
about speed. The action is a no-op launcher so the figure is the scheduler's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from statebook.adapters.db import open_book, reset_schema
from statebook.adapters.settings import LauncherSettings, SchedulerSettings, Settings
from statebook.lifecycle import Actor, FakeClock, Reason, create
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.launcher import ProcessResult
from statebook.scheduler.requests import CreateScheduleRequest


async def noop(launch, *, run_id, deadline, stdout_log=None, on_spawn=None, **_):
    return ProcessResult(0, "", False, {})


async def seed(book, n: int, due: int, now: float) -> None:
    actor, batch = Actor("system", "bench"), 1000
    for start in range(0, n, batch):
        async with book.begin() as tx:
            for i in range(start, min(n, start + batch)):
                values = CreateScheduleRequest(
                    name=f"s{i:05d}", trigger_type="interval", interval_sec=3600, action_kind="command",
                    action_command=sys.executable, action_command_args=["-c", "pass"], overlap_policy="allow",
                ).to_values()
                # the first `due` schedules are due at now; the rest later
                values.update(created_at=now, next_fire_at=now if i < due else now + 1800 + i)
                await create(tx, "schedule", values=values, status="active", actor=actor,
                             reason=Reason("schedule.active.created", "bench"))


async def timed(label: str, coro) -> float:
    t0 = time.perf_counter()
    result = await coro
    elapsed = time.perf_counter() - t0
    print(f"{label:58} {elapsed * 1000:9.1f} ms  ({result})")
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--due", type=int, default=1_000)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="statebook-bench-")
    url = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
    clock = FakeClock(1_800_000_000)
    book = await open_book(url, clock=clock)
    try:
        await reset_schema(book.engine)
        now = clock.now()
        t0 = time.perf_counter()
        await seed(book, args.schedules, args.due, now + 10)
        print(f"backend {book.dialect}; seeded {args.schedules} schedules in {time.perf_counter() - t0:.1f} s")
        settings = Settings(scheduler=SchedulerSettings(max_concurrent=args.due + 1),
                            launcher=LauncherSettings(cwd=tmp))
        eng = SchedulerEngine(book, settings, clock=clock, launcher=noop)
        await eng.start(loop=False)
        await timed(f"evaluate: {args.schedules} enabled, none due", eng.evaluate(clock.now()))
        await timed(f"tick:     {args.schedules} enabled, none due", eng.tick())
        clock.advance(10)
        await timed(f"evaluate: {args.schedules} enabled, {args.due} due (claims + run rows)", eng.evaluate(clock.now()))
        await timed(f"          ... until the {args.due} no-op runs are finalized", eng.wait_idle())
        await timed(f"evaluate: {args.schedules} enabled, none due (after)", eng.evaluate(clock.now()))
        await eng.stop()
    finally:
        await book.engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
