"""The conformance suite's own lifecycle (``task``) and small helpers shared by its cases.

``task`` lives in its own table on its own MetaData, registered next to the built-ins, so the suite
exercises the engine with a policy of its choosing and leaves statebook's schema alone.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statebook.adapters.db import create_schema, reset_schema
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import (
    Actor,
    Book,
    Clock,
    Lifecycle,
    Outcome,
    Reason,
    Registry,
    create,
    edges,
    managed_table,
    transition,
)
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.replay import read_row

TASK_META = sa.MetaData()
"""Apart from statebook's MetaData: the adapters' schema helpers never see the task table."""

TASK_STATUSES = ("open", "working", "blocked", "done", "rejected")

tasks = managed_table(
    "conformance_tasks",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("owner", sa.Text, nullable=True),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("labels", sa.JSON, nullable=False),
    sa.Column("dedup_key", sa.Text, nullable=True, unique=True),
    sa.Column("score", sa.Float, nullable=True),  # a data column that is NOT a patch field
    meta=TASK_META,
)

TASK_REASONS = frozenset(
    {
        "task.open.created",
        "task.working.started",
        "task.working.retried",
        "task.blocked.waiting",
        "task.done.finished",
        "task.rejected.refused",
        "task.open.released",
        "task.open.reopened",
        "task.purged.cleanup",
    }
)

TASK = Lifecycle(
    entity_type="task",
    table=tasks,
    statuses=TASK_STATUSES,
    initial={"open"},
    terminal={"done", "rejected"},
    edges=(
        *edges("open", "working", "rejected"),
        *edges("working", "working", guard="attempt"),
        *edges("working", "blocked", "done", "open"),
        *edges("blocked", "working", "rejected"),
        *edges("rejected", "open", actors="operator", patch="note"),
    ),
    patch_fields={"attempt", "owner", "note", "labels"},
    reason_prefixes={"task"},
    reasons=TASK_REASONS,
    description="A unit of work used by the conformance suite.",
)

TASK_WITH_SHORTCUT = TASK.extend(edges=edges("open", "done"))
"""An older version of the policy: it allowed open -> done, which TASK no longer does."""

TASK_CREATED_WORKING = TASK.extend(initial=["working"])
"""An older version of the policy whose tasks could be created already working."""

SYSTEM = Actor("system", "worker-1")
OPERATOR = Actor("operator", "alice")
CREATED = Reason("task.open.created", "filed by the suite", evidence=("ticket:1",))
STARTED = Reason("task.working.started", "picked up")
RETRIED = Reason("task.working.retried", "picked up again")
BLOCKED = Reason("task.blocked.waiting", "waiting on a dependency")
FINISHED = Reason("task.done.finished", "all good")
REFUSED = Reason("task.rejected.refused", "out of scope")
RELEASED = Reason("task.open.released", "put back")
REOPENED = Reason("task.open.reopened", "operator reopened it")
PURGED = Reason("task.purged.cleanup", "retention")


def task_registry(task: Lifecycle = TASK) -> Registry:
    """The built-in lifecycles plus ``task`` (a given version of it), sealed."""
    registry = builtin_registry(seal=False)
    registry.register(task)
    return registry.seal()


async def prepare(engine: AsyncEngine, clock: Clock) -> None:
    """Create statebook's schema and the task table; leave every table empty."""
    await create_schema(engine, clock, registry=task_registry())  # the task table's CHECK from its lifecycle
    await reset_schema(engine)
    async with engine.begin() as conn:
        await conn.run_sync(TASK_META.create_all)
        await conn.execute(sa.delete(tasks))


def task_values(title: str = "write the spec", **overrides: Any) -> dict[str, Any]:
    """Every data column of a task, so the fold of its facts equals its whole row."""
    values: dict[str, Any] = {
        "title": title, "owner": None, "attempt": 0, "note": None, "labels": ["docs"], "dedup_key": None,
        "score": 1.5,
    }
    values.update(overrides)
    return values


async def new_task(book: Book, entity_id: str | None = None, **overrides: Any) -> Outcome:
    outcome = await create(book, "task", values=task_values(**overrides), status="open", reason=CREATED,
                           actor=SYSTEM, entity_id=entity_id, metadata={"source": "suite"})
    assert outcome.applied
    return outcome


async def start(book: Book, entity_id: str, *, attempt: int = 0, **kw: Any) -> Outcome:
    """open -> working, bumping attempt under a guard on its current value."""
    return await transition(book, "task", entity_id, "working", expected="open", guards={"attempt": attempt},
                            patch={"attempt": attempt + 1}, reason=STARTED, actor=SYSTEM, **kw)


async def count_facts(book: Book, entity_id: str | None = None) -> int:
    query = sa.select(sa.func.count()).select_from(facts_table)
    if entity_id is not None:
        query = query.where(facts_table.c.entity_id == entity_id)
    async with book.engine.connect() as conn:
        return (await conn.execute(query)).scalar_one()


async def row(book: Book, entity_id: str, entity_type: str = "task") -> dict[str, Any] | None:
    return await read_row(book, entity_type, entity_id)


async def execute(book: Book, statement: Any) -> Any:
    """Run raw SQL in its own transaction: how the audit cases tamper with rows and facts."""
    async with book.engine.begin() as conn:
        return await conn.execute(statement)
