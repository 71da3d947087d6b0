"""Pieces of the scheduler state machine (test_scheduler_machine.py): a spawner whose runs end when the
machine says so, a simulated process death, deterministic ids, and the invariants read off one snapshot
of the database.

Each check raises ``AssertionError`` naming the invariant of specs/scheduler.md it guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import sqlalchemy as sa

import statebook.lifecycle.engine as lifecycle_engine
from statebook.lifecycle import Book
from statebook.outbox.dispatch.schema import dispatch_outbox
from statebook.scheduler.launcher import Launch, ProcessResult
from statebook.scheduler.schema import schedule_runs, schedules

NOTIFIED = ("completed", "failed", "timed_out", "cancelled")
ENDED_BY_EXECUTOR = ("schedule_run.completed.exit_zero", "schedule_run.failed.nonzero_exit")
CHAIN_CAP = 10  # S8: the seed's cap; a configured max_chain_depth may only be lower here


class Crashed(BaseException):
    """The daemon's process died. Raised inside a fire task it passes every ``except Exception`` and
    ``except CancelledError`` handler, so nothing more is written for the run — as after a kill -9."""


@dataclass
class Held:
    """A launched run whose fake process keeps running until the machine ends it."""

    run_id: str
    seq: int
    task: asyncio.Task[Any]
    event: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int = 0


class ControlledSpawner:
    """Stands in for ``spawn_and_wait``: each run blocks until ``finish`` gives it an exit code.

    ``crashed`` simulates the daemon's death: a blocked run released afterwards, or a run launched
    afterwards, raises :class:`Crashed` instead of returning.
    """

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}
        self.launched: list[str] = []
        self.crashed = False
        self.crashed_tasks: list[asyncio.Task[Any]] = []
        self.changed = asyncio.Event()
        self._seq = itertools.count()

    async def __call__(self, launch: Launch, *, run_id: str, deadline: float, stdout_log: str | None = None,
                       on_spawn: Any = None, **_: Any) -> ProcessResult:
        if self.crashed:
            self.crashed_tasks.append(asyncio.current_task())  # type: ignore[arg-type]
            raise Crashed
        self.launched.append(run_id)
        if on_spawn is not None:
            await on_spawn(4242)
        task = asyncio.current_task()
        assert task is not None
        held = Held(run_id, next(self._seq), task)
        self.held[run_id] = held
        self.changed.set()
        try:
            await held.event.wait()
        finally:
            if self.held.get(run_id) is held:
                del self.held[run_id]
        if self.crashed:
            raise Crashed
        code = held.exit_code
        return ProcessResult(code, "" if code == 0 else "the fake action exited 1", False, {})

    def finish(self, run_id: str, exit_code: int) -> None:
        held = self.held.pop(run_id)
        held.exit_code = exit_code
        held.event.set()

    def blocked_tasks(self) -> set[asyncio.Task[Any]]:
        return {h.task for h in self.held.values()}


async def settle(fire_tasks: set[asyncio.Task[Any]], spawner: ControlledSpawner, timeout: float = 60.0) -> None:
    """Let every fire task run until it is done or its current run is blocked in the spawner."""
    while True:
        spawner.changed.clear()
        blocked = spawner.blocked_tasks()
        busy = [t for t in fire_tasks if not t.done() and (t.cancelling() or t not in blocked)]
        if not busy:
            return
        waiter = asyncio.ensure_future(spawner.changed.wait())
        try:
            done, _ = await asyncio.wait([waiter, *busy], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not done:
            raise AssertionError(f"{len(busy)} fire task(s) made no progress for {timeout:g} s: {busy}")


@contextlib.contextmanager
def deterministic_ids() -> Iterator[None]:
    """Entity and fact ids from a counter: due schedules are taken in (next_fire_at, id) order, so with
    random ids a replayed example could hand the last slot to another schedule and shrink badly."""
    numbers = itertools.count(1)

    def new_id() -> str:
        return f"{next(numbers):032x}"

    with mock.patch.object(lifecycle_engine, "new_id", new_id):
        yield


def schedule_spec(name: str, trigger: str, *, interval: int, cron: str, at_time: float, max_runs: int | None,
                  overlap: str, missed: str, follow: str | None, notify: bool) -> dict[str, Any]:
    """A ``command`` schedule; the fake spawner never runs the command."""
    spec: dict[str, Any] = {
        "name": name, "trigger_type": trigger, "action_kind": "command", "action_command": sys.executable,
        "action_command_args": ["-c", "pass"], "overlap_policy": overlap, "missed_fire_policy": missed,
    }
    if trigger == "interval":
        spec["interval_sec"] = interval
    elif trigger == "cron":
        spec["cron_expr"] = cron
    else:
        spec["at_time"] = at_time
    if max_runs is not None:
        spec["max_runs"] = max_runs
    # Overlays never set on_success/on_fail themselves, so every child inherits the schedule's.
    if follow in ("on_success", "both"):
        spec["on_success"] = {"command_args": ["-c", "pass", "after-success"]}
    if follow in ("on_fail", "both"):
        spec["on_fail"] = {"command_args": ["-c", "pass", "after-failure"]}
    if notify:
        spec["notify"] = {"kind": "run_ended", "deliver_to": "ops"}
    return spec


# -- one snapshot of the database ---------------------------------------------------------------


@dataclass
class Snapshot:
    now: float
    schedules: dict[str, dict[str, Any]]
    runs: dict[str, dict[str, Any]]
    notices: Counter[str]
    """run id -> dispatches enqueued for it."""

    def running(self) -> set[str]:
        return {rid for rid, r in self.runs.items() if r["status"] == "running"}

    def counted(self, schedule_id: str) -> int:
        """Runs that count against max_runs: top-level and not skipped (S5)."""
        return sum(1 for r in self.runs.values()
                   if r["schedule_id"] == schedule_id and r["chain_depth"] == 0 and r["status"] != "skipped")


async def take_snapshot(book: Book) -> Snapshot:
    async with book.read() as conn:
        sched = {r.id: dict(r._mapping) for r in await conn.execute(sa.select(schedules))}
        runs = {r.id: dict(r._mapping) for r in await conn.execute(sa.select(schedule_runs))}
        notices = Counter(
            rid for (rid,) in await conn.execute(
                sa.select(dispatch_outbox.c.schedule_run_id).where(dispatch_outbox.c.schedule_run_id.is_not(None)))
        )
    return Snapshot(book.clock.now(), sched, runs, notices)


async def due_schedules(book: Book, now: float) -> list[dict[str, Any]]:
    """Active schedules due at ``now`` in the engine's order — what a daemon's evaluation pass reads."""
    s = schedules
    q = (sa.select(s).where(s.c.status == "active", s.c.next_fire_at.is_not(None), s.c.next_fire_at <= now)
         .order_by(s.c.next_fire_at, s.c.id))
    async with book.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(q)]


# -- the invariants -----------------------------------------------------------------------------


CLAIM_SKIPS = ("schedule_run.skipped.overlap", "schedule_run.skipped.missed_fire")
"""Skipped records that stand for a claimed occurrence (a deferral record does not: the fire stays due)."""


def check_occurrences_fire_once(snap: Snapshot) -> None:
    """S1: every (schedule, occurrence) is claimed at most once — one top-level non-skipped run, or
    one skipped-overlap / missed-fire record — and a claimed occurrence lies behind the schedule's
    cadence (its claim moved next_fire_at past it)."""
    seen: dict[tuple[str, float], str] = {}
    for run in sorted(snap.runs.values(), key=lambda r: r["id"]):
        ctx = run["trigger_context"]
        if run["chain_depth"] != 0 or ctx.get("trigger") == "manual":
            continue
        if run["status"] == "skipped" and run["status_reason_code"] not in CLAIM_SKIPS:
            continue
        occurrence = ctx.get("occurrence_at")
        assert occurrence is not None, f"S1: run {run['id']} ({ctx}) names no occurrence"
        if ctx["trigger"] != "missed_fire" or run["status"] == "skipped":
            assert run["occurrence_at"] == occurrence, f"S1: run {run['id']} occurrence column != trigger context"
        key = (run["schedule_id"], occurrence)
        what = f"{run['id']} ({run['status_reason_code']})"
        assert key not in seen, f"S1: occurrence {occurrence} of schedule {key[0]} claimed twice: {seen[key]} and {what}"
        seen[key] = what
        nxt = snap.schedules[run["schedule_id"]]["next_fire_at"]
        assert nxt is None or nxt > occurrence, (
            f"S1: run {what} claimed occurrence {occurrence} but the schedule is still due at {nxt}")


def check_max_runs(snap: Snapshot) -> None:
    """S5: top-level non-skipped runs never exceed max_runs; exhausted for max_runs means all were used."""
    for s in snap.schedules.values():
        used = snap.counted(s["id"])
        if s["max_runs"] is not None:
            assert used <= s["max_runs"], f"S5: schedule {s['name']} has {used} counted runs, max_runs {s['max_runs']}"
        if s["status_reason_code"] == "schedule.exhausted.max_runs":
            assert used == s["max_runs"], f"S5: {s['name']} exhausted for max_runs after {used} of {s['max_runs']}"


def check_chains(snap: Snapshot, max_depth: int) -> None:
    """S8, S11: depth <= the cap (<= 10); a child links to a parent on the same schedule that ended by
    its process (completed / failed / timed_out — never cancelled by an operator), with the parent's
    outcome in its context; one child per parent; a continuation exists exactly below the cap."""
    assert max_depth <= CHAIN_CAP
    children: dict[str, list[str]] = {}
    for run in snap.runs.values():
        depth, parent_id = run["chain_depth"], run["chain_parent_id"]
        assert 0 <= depth <= max_depth, f"S8: run {run['id']} at depth {depth}, cap {max_depth}"
        if depth == 0:
            assert parent_id is None, f"S8: top-level run {run['id']} has a parent"
            continue
        parent = snap.runs.get(parent_id)
        assert parent is not None, f"S8: run {run['id']} names a missing parent {parent_id}"
        children.setdefault(parent_id, []).append(run["id"])
        ctx = run["trigger_context"]
        assert parent["status"] in ("completed", "failed", "timed_out"), (
            f"S8: run {run['id']} follows {parent_id}, which ended {parent['status']} ({parent['status_reason_code']})")
        assert parent["schedule_id"] == run["schedule_id"] and parent["chain_depth"] == depth - 1, (
            f"S8: run {run['id']} (depth {depth}) and parent {parent_id} (depth {parent['chain_depth']}) do not chain")
        assert ctx.get("chain_from") == parent_id, f"S8: run {run['id']} context chain_from {ctx.get('chain_from')}"
        assert (ctx.get("parent_status"), ctx.get("parent_exit_code")) == (parent["status"], parent["exit_code"]), (
            f"S8: run {run['id']} says its parent ended {ctx.get('parent_status')}/{ctx.get('parent_exit_code')}, "
            f"the parent row says {parent['status']}/{parent['exit_code']} ({parent['status_reason_code']})")
    for parent_id, kids in children.items():
        assert len(kids) == 1, f"S8: run {parent_id} has {len(kids)} follow-ups: {kids}"
    for run in snap.runs.values():
        if run["status_reason_code"] not in ENDED_BY_EXECUTOR:
            continue
        sched = snap.schedules[run["schedule_id"]]
        overlay = sched["on_success"] if run["exit_code"] == 0 else sched["on_fail"]
        expected = bool(overlay) and run["chain_depth"] < max_depth
        assert (run["id"] in children) == expected, (
            f"S8: run {run['id']} ended {run['status']} at depth {run['chain_depth']} (cap {max_depth}); "
            f"a follow-up {'was' if expected else 'was not'} expected")


def check_runs_are_owned(snap: Snapshot, *, live_daemon: str, held: set[str], operator_cancelled: set[str]) -> None:
    """S3 (continuously): every run `running` is one the live engine is executing right now; a run the
    engine executes is `running`, unless an operator cancelled it and the engine has not looked yet."""
    running = snap.running()
    orphans = sorted(running - held)
    assert not orphans, "S3: run(s) left running with nothing executing them: " + ", ".join(
        f"{rid} (daemon {snap.runs[rid]['daemon_id']})" for rid in orphans)
    for rid in sorted(held - running):
        assert rid in operator_cancelled, f"S3: run {rid} is executing but its row says {snap.runs[rid]['status']}"
    for rid in running:
        assert snap.runs[rid]["daemon_id"] == live_daemon, f"S3: run {rid} is running for {snap.runs[rid]['daemon_id']}"


def check_notifications(snap: Snapshot) -> None:
    """S9: a run of a notifying schedule has exactly one dispatch once it ended (skips excluded), none before."""
    for run in snap.runs.values():
        sched = snap.schedules[run["schedule_id"]]
        notify: Mapping[str, Any] | None = sched["notify"]
        expected = 1 if notify and run["status"] in NOTIFIED else 0
        got = snap.notices[run["id"]]
        assert got == expected, f"S9: run {run['id']} ({run['status']}) has {got} notification(s), expected {expected}"


def check_cadence(snap: Snapshot, before: Mapping[str, float | None]) -> None:
    """S4: a schedule's next_fire_at never moves backwards; it is empty only for a handled one-shot."""
    for sid, s in snap.schedules.items():
        nxt = s["next_fire_at"]
        if nxt is None:
            assert s["trigger_type"] == "at" and s["status"] == "exhausted", (
                f"S4: {s['name']} ({s['trigger_type']}, {s['status']}) lost its next fire time")
            continue
        old = before.get(sid)
        assert old is None or nxt >= old, f"S4: {s['name']} moved its next fire time back from {old} to {nxt}"
