"""L4: a single command that loses its compare-and-set raises TransitionConflict (entity, expected and
actual status, version), unless it asks for the outcome; a replay is no conflict; batches return outcomes."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from statebook.lifecycle import (
    Book,
    Command,
    NewEntity,
    TransitionConflict,
    apply_many,
    create,
    create_many,
    purge,
    transition,
)
from statebook.lifecycle.engine import apply, purge_many
from statebook.lifecycle.errors import InvalidArgument

from .support import (
    BLOCKED, CREATED, OPERATOR, PURGED, REFUSED, RETRIED, STARTED, SYSTEM, count_facts, new_task, row, start,
    task_values, tasks,
)


class TransitionConflictCases:
    """What a lost compare-and-set tells its caller, on each backend (the status and version come from the
    row the command read in its own unit)."""

    async def test_a_lost_compare_and_set_raises_naming_entity_expected_and_actual(self, book: Book):
        """L4: expected statuses that no longer hold raise with every field; the message names them; nothing written."""
        await new_task(book, "t1")
        await start(book, "t1")
        before, facts = await row(book, "t1"), await count_facts(book)
        with pytest.raises(TransitionConflict) as lost:
            await transition(book, "task", "t1", "rejected", expected=["open", "blocked"], reason=REFUSED,
                             actor=SYSTEM)
        error = lost.value
        assert (error.entity_type, error.entity_id, error.target) == ("task", "t1", "rejected")
        assert (set(error.expected), error.actual, error.version, error.guards) == ({"open", "blocked"}, "working", 2,
                                                                                     ())
        assert (error.outcome.kind, error.outcome.status, error.outcome.version) == ("conflict", "working", 2)
        message = str(error)
        assert "task 't1'" in message and "'rejected'" in message and "found 'working' (version 2)" in message
        assert "'open'" in message and "'blocked'" in message and "on_conflict" in message
        assert await row(book, "t1") == before and await count_facts(book) == facts

    async def test_a_guard_that_differed_is_named_without_its_value(self, book: Book):
        """L4: in an expected status, the guarded columns that differed are named (their values are not shown)."""
        await new_task(book, "t1")
        await start(book, "t1")  # attempt 1, owner NULL
        with pytest.raises(TransitionConflict) as lost:
            await transition(book, "task", "t1", "working", expected="working",
                             guards={"attempt": 41, "owner": None}, patch={"attempt": 42}, reason=RETRIED,
                             actor=SYSTEM)
        assert (lost.value.actual, lost.value.version, lost.value.guards) == ("working", 2, ("attempt",))
        assert "attempt differed" in str(lost.value) and "41" not in str(lost.value)
        assert await count_facts(book) == 2

    async def test_a_race_lost_under_the_row_lock_raises_with_the_winners_status(self, book: Book, rival: Book):
        """L4 / L14: the loser of a race waits for the winner's commit, then raises with the status and version
        the winner left: no extra read, the command's own read under lock names them."""
        await new_task(book, "t1")
        async with book.begin() as tx:
            assert (await start(tx, "t1")).applied
            late = asyncio.create_task(start(rival, "t1"))
            await asyncio.sleep(0.2)
        with pytest.raises(TransitionConflict) as lost:
            await late
        assert (lost.value.expected, lost.value.actual, lost.value.version) == (("open",), "working", 2)
        assert await count_facts(book) == 2

    async def test_asking_for_the_outcome_returns_it(self, book: Book):
        """L4: ``on_conflict="return"`` answers the conflict as an Outcome, from transition and from apply."""
        await new_task(book, "t1")
        await start(book, "t1")
        outcome = await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM,
                                   on_conflict="return")
        assert (outcome.kind, outcome.status, outcome.version, outcome.fact_id) == ("conflict", "working", 2, None)
        command = Command("task", "t1", "working", STARTED, SYSTEM, ("blocked",))
        assert (await apply(book, command, on_conflict="return")).conflict
        with pytest.raises(TransitionConflict) as lost:
            await apply(book, command)
        assert (lost.value.expected, lost.value.target, lost.value.actual) == (("blocked",), "working", "working")
        assert await count_facts(book) == 2

    async def test_an_idempotent_replay_is_not_a_conflict(self, book: Book):
        """L9: the same keyed command after the entity moved on replays its first outcome; nothing raises."""
        await new_task(book, "t1")
        first = await start(book, "t1", idempotency_key="k1")
        await transition(book, "task", "t1", "blocked", expected="working", reason=BLOCKED, actor=SYSTEM)
        again = await start(book, "t1", idempotency_key="k1")  # its expected "open" is long gone
        assert again.applied and again.replayed and again.fact_id == first.fact_id
        assert await count_facts(book) == 3

    async def test_batches_return_their_conflicts(self, book: Book):
        """L4: apply_many, purge_many, create_many and create with ``if_absent`` answer conflicts as outcomes."""
        await new_task(book, "t1")
        await start(book, "t1")
        [moved] = await apply_many(book, [Command("task", "t1", "rejected", REFUSED, SYSTEM, ("open",))])
        assert (moved.kind, moved.status, moved.version) == ("conflict", "working", 2)
        [purged] = await purge_many(book, "task", ["t1"], reason=PURGED, actor=OPERATOR, expected="done")
        assert (purged.kind, purged.status) == ("conflict", "working")
        taken = NewEntity({**task_values(), "id": "t1"}, "open", CREATED, SYSTEM)
        [made] = await create_many(book, "task", [taken], if_absent=True)
        assert made.kind == "conflict"
        again = await create(book, "task", values=task_values(), entity_id="t1", status="open", reason=CREATED,
                             actor=SYSTEM, if_absent=True)
        assert again.kind == "conflict"
        assert await count_facts(book) == 2

    async def test_a_purge_of_a_status_not_expected_raises(self, book: Book):
        """L11 / L4: purge is a single command too: a row not in ``expected`` raises (target None) or, asked,
        returns the conflict; the row stays."""
        await new_task(book, "t1")
        with pytest.raises(TransitionConflict) as lost:
            await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR, expected=["done", "rejected"])
        error = lost.value
        assert (error.target, set(error.expected), error.actual, error.version) == (None, {"done", "rejected"},
                                                                                    "open", 1)
        assert str(error).startswith("purge of task 't1'")
        outcome = await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR, expected="done",
                              on_conflict="return")
        assert (outcome.kind, outcome.status) == ("conflict", "open")
        assert (await row(book, "t1"))["status"] == "open" and await count_facts(book) == 1

    async def test_a_conflict_raised_in_the_callers_transaction_rolls_it_back(self, book: Book):
        """L5: raised inside ``book.begin()``, the conflict undoes the caller's own writes with it; asked for as
        an outcome, it leaves them to commit."""
        await new_task(book, "t1")
        await start(book, "t1")
        with pytest.raises(TransitionConflict):
            async with book.begin() as tx:
                await tx.conn.execute(sa.update(tasks).where(tasks.c.id == "t1").values(score=99.0))
                await start(tx, "t1")
        assert (await row(book, "t1"))["score"] == 1.5
        async with book.begin() as tx:
            await tx.conn.execute(sa.update(tasks).where(tasks.c.id == "t1").values(score=99.0))
            assert (await start(tx, "t1", on_conflict="return")).conflict
        assert (await row(book, "t1"))["score"] == 99.0

    @pytest.mark.parametrize("value", ["ignore", None, True])
    async def test_on_conflict_takes_raise_or_return_only(self, book: Book, value: object):
        """L3: another ``on_conflict`` is refused before anything is read or written."""
        await new_task(book, "t1")
        with pytest.raises(InvalidArgument) as refused:
            await start(book, "t1", on_conflict=value)
        assert (refused.value.argument, refused.value.rule) == ("on_conflict", "vocabulary")
        with pytest.raises(InvalidArgument):
            await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR, force=True, on_conflict=value)
        assert await count_facts(book) == 1
