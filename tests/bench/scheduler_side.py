"""W6: one scheduler evaluation over 10,000 enabled schedules, none due and 1,000 due.

Interval schedules (one hour) seeded through the engine's ``create``; the first ``due`` are due now,
the rest days later. The launcher is a no-op, so the figure is the scheduler's own cost. Each round
moves a fake clock one interval on: the same ``due`` schedules are due again and nothing else is.
The timed call is ``SchedulerEngine.evaluate`` (the tick's schedule evaluation: due read, one claim
transaction, launches handed to tasks); the no-op runs are then awaited untimed (logged per round).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from statebook.adapters.db import open_book, reset_schema

from common import Line, median

INTERVAL = 3600


def available() -> str | None:
    """None when the scheduler can be benchmarked; otherwise why not."""
    try:
        from statebook.adapters.settings import LauncherSettings, SchedulerSettings, Settings  # noqa: F401
        from statebook.scheduler.engine import SchedulerEngine

        if not callable(getattr(SchedulerEngine, "evaluate", None)):
            return "SchedulerEngine has no evaluate()"
        from statebook.scheduler.launcher import ProcessResult  # noqa: F401
        from statebook.scheduler.requests import CreateScheduleRequest  # noqa: F401
    except ImportError as exc:
        return f"scheduler not available ({exc})"
    return None


async def _noop_launch(launch: Any, *, run_id: str, deadline: float, stdout_log: Any = None, on_spawn: Any = None,
                       **_: Any) -> Any:
    from statebook.scheduler.launcher import ProcessResult

    return ProcessResult(0, "", False, {})


async def _seed(book: Any, n: int, due: int, now: float) -> None:
    """``n`` active interval schedules, the first ``due`` due at ``now`` (bulk rows + creation facts)."""
    from statebook.scheduler.requests import CreateScheduleRequest

    import seed

    template = CreateScheduleRequest(
        name="s", trigger_type="interval", interval_sec=INTERVAL, action_kind="command",
        action_command=sys.executable, action_command_args=["-c", "pass"], overlap_policy="allow",
    ).to_values()
    for start in range(0, n, 2000):
        values = [{**template, "name": f"s{i:05d}", "created_at": now,
                   "next_fire_at": now if i < due else now + 30 * 86_400 + i} for i in range(start, min(n, start + 2000))]
        await seed.bulk_create(book, "schedule", values, status="active", reason="schedule.active.created",
                               summary="bench", actor=("system", "bench"))


class Bench:
    """One backend: a seeded database and an engine on a fake clock."""

    def __init__(self, url: str, n: int, due: int) -> None:
        self.url, self.n, self.due = url, n, due
        self.idle_ms = 0.0

    async def open(self, log: Callable[[str], None]) -> None:
        from statebook.adapters.settings import LauncherSettings, SchedulerSettings, Settings
        from statebook.lifecycle import FakeClock
        from statebook.scheduler.engine import SchedulerEngine

        self.clock = FakeClock(1_800_000_000)
        self.book = await open_book(self.url, clock=self.clock)
        await reset_schema(self.book.engine)
        t0 = time.perf_counter()
        await _seed(self.book, self.n, self.due, self.clock.now() + 10)
        log(f"W6 seeded {self.n:,} schedules on {self.book.dialect} in {time.perf_counter() - t0:.1f}s")
        # a slot for every due schedule, within the setting's bound of 1,000 (W6's 1,000 due asked for 1,001)
        settings = Settings(scheduler=SchedulerSettings(max_concurrent=min(self.due + 1, 1_000)),
                            launcher=LauncherSettings(cwd=tempfile.gettempdir()))
        self.engine = SchedulerEngine(self.book, settings, clock=self.clock, launcher=_noop_launch)
        await self.engine.start(loop=False)

    async def none_due(self) -> float:
        t0 = time.perf_counter()
        considered = await self.engine.evaluate(self.clock.now())
        elapsed = time.perf_counter() - t0
        if considered:
            raise RuntimeError(f"expected no due schedule, the engine considered {considered}")
        return elapsed * 1000

    async def some_due(self) -> float:
        self.clock.advance(INTERVAL if self.engine.stats["fired"] else 10)
        fired_before = self.engine.stats["fired"]
        t0 = time.perf_counter()
        considered = await self.engine.evaluate(self.clock.now())
        elapsed = time.perf_counter() - t0
        await self.engine.wait_idle()
        self.idle_ms = (time.perf_counter() - t0 - elapsed) * 1000  # untimed: the no-op runs launch and end
        fired = self.engine.stats["fired"] - fired_before
        if considered != self.due or fired != self.due:
            raise RuntimeError(f"expected {self.due} due schedules fired; considered {considered}, fired {fired}")
        return elapsed * 1000

    async def close(self) -> None:
        await self.engine.stop()
        await self.book.engine.dispose()


async def w6(urls: dict[str, str], n: int, due: int, rounds: int, log: Callable[[str], None]) -> list[Line]:
    why = available()
    name0, name1 = f"W6 scheduler evaluate, {n:,} schedules, none due", f"W6 scheduler evaluate, {n:,} schedules, {due:,} due"
    if why is not None:
        return [Line(name0, b, "ms", None, note=f"n/a ({why})") for b in urls] + \
               [Line(name1, b, "ms", None, note=f"n/a ({why})") for b in urls]
    benches = {backend: Bench(url, n, due) for backend, url in urls.items()}
    out: dict[str, dict[str, list[float]]] = {b: {"none": [], "due": []} for b in benches}
    try:
        for bench in benches.values():
            await bench.open(log)
        for r in range(rounds):
            for backend, bench in benches.items():
                out[backend]["due"].append(await bench.some_due())
                out[backend]["none"].append(await bench.none_due())
                log(f"    round {r + 1}/{rounds} {backend}: none due {out[backend]['none'][-1]:.1f} ms, "
                    f"{due} due {out[backend]['due'][-1]:.1f} ms (then {bench.idle_ms:.0f} ms until its runs ended, untimed)")
    finally:
        for bench in benches.values():
            if hasattr(bench, "engine"):
                await bench.close()
    lines = []
    for backend, got in out.items():
        none, some = median(got["none"]), median(got["due"])
        lines.append(Line(name0, backend, "ms", none, target="<= 50 ms", passed=none <= 50, samples={"statebook": got["none"]}))
        lines.append(Line(name1, backend, "ms", some, target="<= 1000 ms", passed=some <= 1000,
                          samples={"statebook": got["due"]}))
    return lines
