"""Schedules as lifecycle entities: create, read, enable, disable, delete; runs read (``runs.py`` writes them).

Every change goes through ``statebook.lifecycle`` (create/transition); reads are plain queries. The
actors the scheduler's facts name live here: ``OPERATOR`` (the CLI) and ``SCHEDULER`` (the engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, EntityNotFound, Reason, create, transition
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle import inputs
from statebook.lifecycle.inputs import KEY_CHARS, integer, json_value, text
from statebook.outbox.dispatch import checks

from .errors import InvalidSchedule, ScheduleError
from .models import Schedule, ScheduleRun
from .requests import JSON_FIELDS, LIST_FIELDS, CreateScheduleRequest
from .schema import RUN_STATUSES, schedule_runs, schedules
from .triggers import first_fire

OPERATOR = Actor("operator", "cli")
SCHEDULER = Actor("system", "scheduler")
RUN_TERMINAL = ("completed", "failed", "timed_out", "skipped", "cancelled")
NOTE_CHARS = 500
"""The longest operator note kept in a fact's summary (the console's reason field)."""
LIST_LIMIT = 100_000
"""the most rows one ``list_runs`` returns"""


# -- the arguments every command checks before it reads (S18) ---------------------------------------
def ref_arg(argument: str, value: Any) -> str:
    """An id or name to look up: text an index can compare (no NUL, no lone surrogate, at most KEY_CHARS)."""
    return text(argument, value, max_chars=KEY_CHARS)


def actor_arg(actor: Any) -> Actor:
    """Return ``actor`` when it is an :class:`~statebook.lifecycle.Actor`; raises ``InvalidArgument`` otherwise."""
    return inputs.actor("actor", actor)


def zone_arg(default_zone: Any) -> str | None:
    """The daemon's default zone: text or None (an unknown name warns and means UTC, S4)."""
    return None if default_zone is None else text("default_zone", default_zone, max_chars=KEY_CHARS)


def flag_arg(argument: str, value: Any) -> bool:
    """Return ``value`` when it is a bool; raises ``InvalidArgument`` naming ``argument`` otherwise."""
    return inputs.flag(argument, value)  # type: ignore[return-value]


def note_arg(note: Any) -> str | None:
    """An operator's note for the fact's summary: None, or text of at most :data:`NOTE_CHARS` characters."""
    return None if note is None else text("note", note, max_chars=NOTE_CHARS)


def with_note(summary: str, note: str | None) -> str:
    """A fact's summary with the operator's note after it, in parentheses (as a notification replay's)."""
    return f"{summary} ({note})" if note else summary


def _row(row: Any) -> dict[str, Any]:
    return dict(row._mapping) if row is not None else None  # type: ignore[return-value]


async def schedule_row(book: Book, ref: str) -> dict[str, Any]:
    """The stored row of the schedule with id or name ``ref`` (what the engine computes with: times as
    POSIX seconds); raises ``EntityNotFound``. Callers outside the scheduler read :func:`get_schedule`."""
    ref_arg("ref", ref)
    found = await _find(book, ref)
    if found is None:
        raise EntityNotFound(f"schedule {ref!r} does not exist (give its id or name; `statebook schedule ls`)")
    return found


async def run_row(book: Book, run_id: str) -> dict[str, Any]:
    """The stored row of a run; raises ``EntityNotFound``. Callers outside the scheduler read :func:`get_run`."""
    ref_arg("run_id", run_id)
    async with book.read() as conn:
        row = (await conn.execute(sa.select(schedule_runs).where(schedule_runs.c.id == run_id))).first()
    if row is None:
        raise EntityNotFound(f"run {run_id!r} does not exist (`statebook schedule runs NAME` lists them)")
    return _row(row)


async def create_schedule(book: Book, request: CreateScheduleRequest | Mapping[str, Any], *,
                          default_zone: str | None = None, actor: Actor = OPERATOR) -> Schedule:
    """Validate and insert a schedule (``active`` or ``paused``); returns it.

    A request is checked again (it may have been changed since it was made); any refusal is an
    :class:`~.errors.InvalidSchedule` naming the field, raised before anything is written (S18)."""
    req = CreateScheduleRequest.parse(request)
    zone_arg(default_zone)
    actor_arg(actor)
    values = req.to_values()
    for field in (*JSON_FIELDS, *LIST_FIELDS):
        try:
            json_value(field, values[field], book.limits)
        except InvalidArgument as exc:
            raise InvalidSchedule(str(exc), argument=exc.argument, rule=exc.rule) from None
    if req.notify is not None:
        # The run's end enqueues this dispatch in its final transaction: refuse now what enqueue would refuse then.
        try:
            checks.name("notify.kind", req.notify["kind"])
            checks.route("notify.deliver_to", req.notify["deliver_to"], book.limits)
        except InvalidArgument as exc:
            raise InvalidSchedule(str(exc), argument=exc.argument, rule=exc.rule) from None
    if await _find(book, req.name) is not None:
        raise ScheduleError(f"a schedule named {req.name!r} already exists; pick another name or remove it first")
    now = book.clock.now()
    values["next_fire_at"] = first_fire(values, now, default_zone)
    values["created_at"] = now
    status = "active" if req.enabled else "paused"
    out = await create(
        book, "schedule", values=values, status=status,
        reason=Reason(f"schedule.{status}.created", f"{req.trigger_type} schedule {req.name} created"), actor=actor,
    )
    return await get_schedule(book, out.entity_id)


async def find_schedule(book: Book, ref: str) -> Schedule | None:
    """A schedule by id or by name (deleted ones only by id)."""
    ref_arg("ref", ref)
    found = await _find(book, ref)
    return None if found is None else Schedule.from_row(found)


async def _find(book: Book, ref: str) -> dict[str, Any] | None:
    async with book.read() as conn:
        row = (await conn.execute(sa.select(schedules).where(schedules.c.id == ref))).first()
        if row is None:
            row = (await conn.execute(
                sa.select(schedules).where(schedules.c.name == ref, schedules.c.status != "deleted")
            )).first()
    return _row(row)


async def get_schedule(book: Book, ref: str) -> Schedule:
    """The schedule with id or name ``ref``; raises ``EntityNotFound`` when there is none."""
    return Schedule.from_row(await schedule_row(book, ref))


async def list_schedules(book: Book, *, include_deleted: bool = False) -> list[Schedule]:
    """Every schedule by name, deleted ones only with ``include_deleted``."""
    flag_arg("include_deleted", include_deleted)
    q = sa.select(schedules).order_by(schedules.c.name)
    if not include_deleted:
        q = q.where(schedules.c.status != "deleted")
    async with book.read() as conn:
        return [Schedule.from_row(r) for r in await conn.execute(q)]


async def enable_schedule(book: Book, ref: str, *, default_zone: str | None = None, actor: Actor = OPERATOR,
                          note: str | None = None) -> Schedule:
    """paused → active (or exhausted → active by an operator, resetting cadence); ``note`` is kept in the
    fact's summary."""
    zone_arg(default_zone)
    actor_arg(actor)
    note_arg(note)
    row = await schedule_row(book, ref)
    if row["status"] == "active":
        return Schedule.from_row(row)
    if row["status"] not in ("paused", "exhausted"):
        raise ScheduleError(f"schedule {row['name']} is {row['status']}; only paused or exhausted schedules can be enabled")
    now = book.clock.now()
    nxt = row["next_fire_at"]
    if row["status"] == "exhausted" or nxt is None or nxt <= now:
        nxt = first_fire(row, now, default_zone) if row["trigger_type"] != "at" or row["at_time"] > now else None
    if nxt is None:
        raise ScheduleError(f"schedule {row['name']} is a one-shot whose time has passed; create a new one")
    code = "schedule.active.operator_reset" if row["status"] == "exhausted" else "schedule.active.enabled"
    out = await transition(book, "schedule", row["id"], "active", expected=row["status"], actor=actor,
                           reason=Reason(code, with_note("enabled by operator", note)),
                           patch={"enabled": 1, "next_fire_at": nxt}, on_conflict="return")
    if out.conflict:
        raise ScheduleError(f"schedule {row['name']} changed concurrently; try again")
    return await get_schedule(book, row["id"])


async def disable_schedule(book: Book, ref: str, *, actor: Actor = OPERATOR, note: str | None = None) -> Schedule:
    """Pause an active schedule (a paused one is returned as it is); raises ``EntityNotFound`` or ``ScheduleError``
    for another status. ``note`` is kept in the fact's summary.
    """
    actor_arg(actor)
    note_arg(note)
    row = await schedule_row(book, ref)
    if row["status"] == "paused":
        return Schedule.from_row(row)
    if row["status"] != "active":
        raise ScheduleError(f"schedule {row['name']} is {row['status']}; only active schedules can be disabled")
    out = await transition(book, "schedule", row["id"], "paused", expected="active", actor=actor,
                           reason=Reason("schedule.paused.disabled", with_note("disabled by operator", note)),
                           patch={"enabled": 0}, on_conflict="return")
    if out.conflict:
        raise ScheduleError(f"schedule {row['name']} changed concurrently; try again")
    return await get_schedule(book, row["id"])


async def delete_schedule(book: Book, ref: str, *, actor: Actor = OPERATOR) -> Schedule:
    """Move to ``deleted``: the row and its runs stay, with their history."""
    actor_arg(actor)
    row = await schedule_row(book, ref)
    if row["status"] == "deleted":
        return Schedule.from_row(row)
    patch = {"enabled": 0} if row["status"] != "exhausted" else {}
    out = await transition(book, "schedule", row["id"], "deleted", expected=row["status"], actor=actor,
                           reason=Reason("schedule.deleted.operator", "removed by operator"), patch=patch,
                           on_conflict="return")
    if out.conflict:
        raise ScheduleError(f"schedule {row['name']} changed concurrently; try again")
    return await get_schedule(book, row["id"])


async def get_run(book: Book, run_id: str) -> ScheduleRun:
    """The run with id ``run_id``; raises ``EntityNotFound`` when there is none."""
    return ScheduleRun.from_row(await run_row(book, run_id))


async def list_runs(book: Book, schedule_id: str | None = None, *, limit: int = 50,
                    status: str | None = None) -> list[ScheduleRun]:
    """A schedule's runs (or every run), newest first; ``limit`` from 1 to :data:`LIST_LIMIT`."""
    if schedule_id is not None:
        ref_arg("schedule_id", schedule_id)
    integer("limit", limit, low=1, high=LIST_LIMIT)
    if status is not None and status not in RUN_STATUSES:
        raise InvalidArgument(f"status: {text('status', status, max_chars=KEY_CHARS)!r} is not a run status; use "
                              f"one of {', '.join(RUN_STATUSES)}", argument="status", rule="vocabulary")
    q = sa.select(schedule_runs).order_by(schedule_runs.c.created_at.desc(), schedule_runs.c.id).limit(limit)
    if schedule_id is not None:
        q = q.where(schedule_runs.c.schedule_id == schedule_id)
    if status is not None:
        q = q.where(schedule_runs.c.status == status)
    async with book.read() as conn:
        return [ScheduleRun.from_row(r) for r in await conn.execute(q)]
