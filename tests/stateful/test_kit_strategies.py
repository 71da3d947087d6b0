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

from profiles import examples
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


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


def test_creation_values_now_and_then_copy_a_peers_unique_key():
    """K1: a drawn create sometimes takes the unique value an existing entity holds ("nightly" cannot be drawn
    from the column's own alphabet), so the model's knowledge of unique keys is exercised."""
    from hypothesis import find

    schedule = builtin_registry().get("schedule")
    peer = {"name": "nightly", "trigger_type": "cron"}
    found = find(creation_values(schedule, [peer]), lambda values: values.get("name") == "nightly",
                 settings=settings(database=None, max_examples=500))
    assert found["name"] == peer["name"]


def test_commands_now_and_then_patch_a_peers_unique_value():
    """K1: a drawn transition sometimes patches a unique column with the value another entity holds."""
    from hypothesis import find

    from statebook.lifecycle import Lifecycle, edges, managed_table
    from statebook.lifecycle.testing.strategies import actors_of, commands

    table = managed_table("kit_codes", sa.Column("id", sa.String(32), primary_key=True),
                          sa.Column("code", sa.Text, nullable=False, unique=True), meta=sa.MetaData())
    lc = Lifecycle(entity_type="code", table=table, statuses=("a", "b"), initial={"a"}, terminal={"b"},
                   edges=edges("a", "b"), patch_fields={"code"}, same_status="allow", reason_prefixes={"code"},
                   reasons={"code.a.x", "code.b.y"})
    seen = {"id": "c-1", "status": "a", "code": "mine"}
    found = find(commands(lc, seen, actors=actors_of([lc]), peers=[{"id": "c-2", "code": "THEIRS"}]),
                 lambda cmd: cmd.patch.get("code") == "THEIRS", settings=settings(database=None, max_examples=500))
    assert found.entity_id == "c-1"
