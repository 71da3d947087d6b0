"""The kit's column strategies honour a table's ``CHECK (column IN (...))`` lists (issue 17: the kit failed on
the built-in ``schedule`` lifecycle, whose action kind, trigger type and policies are such lists)."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statebook.adapters.db import open_book
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Reason, create
from statebook.lifecycle.testing.strategies import column_values, creation_values, listed_values
from statebook.scheduler.schema import ACTION_KINDS, TRIGGER_TYPES, schedules


def test_listed_values_are_the_check_lists_and_nothing_else():
    assert listed_values(schedules.c.action_kind) == tuple(ACTION_KINDS)
    assert listed_values(schedules.c.trigger_type) == tuple(TRIGGER_TYPES)
    assert listed_values(schedules.c.enabled) == (0, 1)
    assert listed_values(schedules.c.overlap_policy) == ("skip", "allow")
    assert listed_values(schedules.c.name) is None  # no CHECK lists it
    table = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True), sa.Column("k", sa.Text),
                     sa.CheckConstraint("k IN ('a', 'it''s')"), sa.CheckConstraint("k <> 'b'"))
    assert listed_values(table.c.k) == ("a", "it's")


@given(st.data())
def test_column_values_draw_only_listed_values(data):
    for column in (schedules.c.action_kind, schedules.c.missed_fire_policy):
        assert data.draw(column_values(column)) in listed_values(column)


_folder = tempfile.mkdtemp(prefix="statebook-kit-")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=creation_values(builtin_registry().get("schedule")))
def test_drawn_schedules_are_accepted_by_the_database(values):
    """Every drawn creation passes the schedules table's CHECKs (before the fix: ck_schedules_action); a
    fresh database each, so a drawn name never meets the one of an earlier example."""

    async def go() -> None:
        book = await open_book(f"sqlite:///{Path(_folder) / (uuid.uuid4().hex + '.db')}")
        try:
            out = await create(book, "schedule", values=values, status="active",
                               reason=Reason("schedule.active.created", "kit"), actor=Actor("system", "kit"),
                               fresh_id=True)
            assert out.status == "active"
        finally:
            await book.engine.dispose()

    asyncio.run(go())
