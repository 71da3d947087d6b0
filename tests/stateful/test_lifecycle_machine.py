"""The lifecycle engine against the kit's reference model (L3–L11): statebook runs the machine it ships.

``statebook.lifecycle.testing.LifecycleMachine`` is subclassed here with a test lifecycle
(``ticket``: gated terminal exits, a declared self-edge, implicit same-status moves, JSON and
scalar patch fields) next to the built-in ``dispatch`` and ``schedule_run`` lifecycles. Several
actors, each with its own and possibly stale view, issue transitions — declared and undeclared
edges, the wrong actor type, missing patch or guard fields, stale expected statuses and guard
values, undeclared reason codes, shared idempotency keys — race as concurrent claimants, lose
commits, roll back and drop connections; the invariants compare the database with the model and
with the facts after every step.

SQLite gets a fresh file per example; PostgreSQL shares the session database, emptied before each
example. Profiles (``HYPOTHESIS_PROFILE``): ``ci`` and the default — 25 examples of up to 25 steps;
``deep`` — 300 examples of up to 80 steps.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import strategies as st

from statebook.adapters.db import connect, create_schema, reset_schema
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Book, FakeClock, Lifecycle, Registry, edges, managed_table
from statebook.lifecycle.testing import LifecycleMachine

TEST_META = sa.MetaData()
"""Kept apart from statebook's MetaData so the schema helpers never see the test table."""

tickets = managed_table(
    "stateful_tickets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("assignee", sa.Text, nullable=True),
    sa.Column("revision", sa.Integer, nullable=False, server_default="0"),
    sa.Column("notes", sa.JSON, nullable=True),
    sa.Column("score", sa.Float, nullable=True),
    meta=TEST_META,
)

TICKET = Lifecycle(
    entity_type="ticket",
    table=tickets,
    statuses=("draft", "open", "review", "done", "rejected"),
    initial={"draft", "open"},
    terminal={"done", "rejected"},
    edges=(
        *edges("draft", "open"),
        *edges("draft", "rejected", actors="operator"),
        *edges("open", "review", patch="assignee"),
        *edges("open", "rejected"),
        # A declared self-edge wins over the implicit one same_status="allow" gives.
        *edges("review", "review", guard="revision"),
        *edges("review", "open"),
        *edges("review", "done", actors="reviewer", guard="revision", patch="revision"),
        *edges("review", "rejected", actors="reviewer"),
        *edges("done", "open", actors="operator", patch="revision"),
        *edges("rejected", "draft", actors="operator"),
    ),
    patch_fields={"assignee", "revision", "notes", "score"},
    reason_prefixes={"ticket"},
    reasons={
        "ticket.draft.created", "ticket.open.created", "ticket.draft.edited", "ticket.open.submitted",
        "ticket.open.edited", "ticket.review.requested", "ticket.review.revised", "ticket.open.returned",
        "ticket.done.approved", "ticket.rejected.declined", "ticket.open.reopened", "ticket.draft.revived",
        "ticket.purged.operator",
    },
    same_status="allow",
    description="Test lifecycle: gated terminal exits, a declared self-edge, implicit same-status moves.",
)


def make_registry() -> Registry:
    """The built-ins plus ``ticket``, sealed."""
    registry = builtin_registry(seal=False)
    registry.register(TICKET)
    return registry.seal()


REGISTRY = make_registry()


class StatebookMachine(LifecycleMachine):
    """The kit's machine on ``ticket``, ``dispatch`` and ``schedule_run`` with five actors."""

    registry = REGISTRY
    entity_types = ("ticket", "dispatch", "schedule_run")
    actors = (
        Actor("system", "delivery"),
        Actor("system", "launcher"),
        Actor("operator", "alice"),
        Actor("reviewer", "bob"),
        Actor("consumer", "hook"),
    )
    url: str = ""
    shared_database = False

    def next_url(self) -> str:  # pragma: no cover - set by each test
        raise NotImplementedError

    async def make_book(self) -> Book:
        self.url = self.next_url()
        clock = FakeClock()
        engine = connect(self.url)
        await create_schema(engine, clock, registry=REGISTRY)  # the ticket table's CHECK from the registry
        if self.shared_database:
            await reset_schema(engine)
        async with engine.begin() as conn:
            await conn.execute(sa.delete(tickets))
        return Book(engine, REGISTRY, clock)

    async def close_book(self, book: Book) -> None:
        await book.engine.dispose()
        if self.url.startswith("sqlite:///"):
            for suffix in ("", "-wal", "-shm"):
                Path(self.url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)

    def creation_values(self, data: st.DataObject, lc: Lifecycle) -> dict[str, Any]:
        """Realistic data columns for a new entity of each lifecycle."""
        now = self.clock.now()
        if lc.entity_type == "dispatch":
            return {
                "kind": "webhook", "deliver_to": "https://hooks.example.test/in", "payload": {},
                "next_attempt_at": now, "created_at": now, "attempt": 0, "max_attempts": 8, "ack_required": 0,
            }
        if lc.entity_type == "schedule_run":
            return {
                "schedule_id": None, "trigger_context": {}, "action_kind": "command", "action_args": [],
                "fired_at": now, "created_at": now, "chain_depth": 0,
            }
        return {"title": "fix the flaky test", "revision": 0, "notes": {}}


def test_lifecycle_machine_sqlite(tmp_path_factory: pytest.TempPathFactory) -> None:
    """L3, L4, L5, L6, L7, L8, L9, L10, L11 on SQLite: a fresh database file per example."""
    folder = tmp_path_factory.mktemp("lifecycle_machine")
    numbers = itertools.count()

    class OnSqlite(StatebookMachine):
        def next_url(self) -> str:
            return f"sqlite:///{folder}/book-{next(numbers)}.db"

    OnSqlite.run_as_test()


async def _clean_postgres(url: str) -> None:
    engine = connect(url)
    try:
        await reset_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(TEST_META.drop_all)
    finally:
        await engine.dispose()


@pytest.mark.postgres
def test_lifecycle_machine_postgres(pg_url: str) -> None:
    """L3, L4, L5, L6, L7, L8, L9, L10, L11 on PostgreSQL: the session database, emptied per example."""

    class OnPostgres(StatebookMachine):
        shared_database = True

        def next_url(self) -> str:
            return pg_url

    try:
        OnPostgres.run_as_test()
    finally:
        asyncio.run(_clean_postgres(pg_url))
