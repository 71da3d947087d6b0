"""The conformance suite's own lifecycle (``task``) and small helpers shared by its cases.

``task`` and the helpers live with the storage cases users run (statebook.lifecycle.testing.cases); this
module adds what only our suite needs: older versions of the policy and the registry with the built-ins.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statebook.adapters.db import create_schema, reset_schema
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Clock, Lifecycle, Registry, edges
from statebook.lifecycle.testing.cases import (  # noqa: F401  (re-exported for the suite's cases)
    BLOCKED,
    CREATED,
    FINISHED,
    OPERATOR,
    PURGED,
    REFUSED,
    RELEASED,
    REOPENED,
    RETRIED,
    STARTED,
    SYSTEM,
    TASK,
    TASK_META,
    TASK_REASONS,
    TASK_STATUSES,
    count_facts,
    execute,
    new_task,
    row,
    start,
    task_values,
    tasks,
)

TASK_WITH_SHORTCUT = TASK.extend(edges=edges("open", "done"))
"""An older version of the policy: it allowed open -> done, which TASK no longer does."""

TASK_CREATED_WORKING = TASK.extend(initial=["working"])
"""An older version of the policy whose tasks could be created already working."""


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
