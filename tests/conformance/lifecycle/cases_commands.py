"""Conformance cases for commands: create, transition, compare-and-set, atomicity, versions and the fold."""

from __future__ import annotations

from typing import Any

import pytest

from statebook.lifecycle import (
    Book,
    Command,
    EntityNotFound,
    Reason,
    TransitionConflict,
    TransitionRejected,
    apply_many,
    as_of,
    create,
    history,
    purge,
    replay,
    transition,
    verify,
)
from statebook.lifecycle.errors import DuplicateEntity
from statebook.lifecycle.schema import LIFECYCLE_COLUMNS

from statebook.lifecycle.testing.cases import Boom

from .support import (
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
    count_facts,
    new_task,
    row,
    start,
    task_values,
    tasks,
)


class CommandCases:
    """Create and transition through the engine on a real database (the ``book`` fixture)."""

    # -- create ---------------------------------------------------------------------------------

    async def test_a_create_records_the_defaults_of_columns_it_was_not_given(self, book: Book):
        """L7: a create given only some data columns records every column in its fact — the omitted ones
        with their declared default (``attempt`` 0, ``score`` NULL) — so the fold is the whole row."""
        await create(book, "task", values={"title": "short", "labels": []}, status="open", reason=CREATED,
                     actor=SYSTEM, entity_id="t9")
        [first] = await history(book, "task", "t9")
        assert first.patch["attempt"] == 0 and first.patch["score"] is None and first.patch["note"] is None
        assert set(first.patch) == {c.name for c in tasks.columns} - set(LIFECYCLE_COLUMNS)
        current = await row(book, "t9")
        assert {k: current[k] for k in first.patch} == first.patch

    async def test_create_generates_an_id_when_none_is_given(self, book: Book):
        """L5: without an id, create picks one and reports it."""
        outcome = await new_task(book)
        assert outcome.entity_id and (await row(book, outcome.entity_id))["status"] == "open"

    @pytest.mark.parametrize(
        "kwargs, rule",
        [
            (dict(status="working"), "initial"),
            (dict(reason=Reason("task.open.filed")), "reason"),
            (dict(values={**task_values(), "status": "done"}), "patch"),
            (dict(values={**task_values(), "version": 7}), "patch"),
            (dict(values={**task_values(), "colour": "red"}), "patch"),
        ],
        ids=["not_initial", "undeclared_reason", "status_column", "version_column", "unknown_column"],
    )
    async def test_create_refusals_write_nothing(self, book: Book, kwargs: dict[str, Any], rule: str):
        """L3: create refuses a non-initial status, an undeclared reason and lifecycle/unknown columns."""
        args: dict[str, Any] = dict(values=task_values(), status="open", reason=CREATED, actor=SYSTEM,
                                    entity_id="t1")
        args.update(kwargs)
        with pytest.raises(TransitionRejected) as excinfo:
            await create(book, "task", **args)
        assert excinfo.value.rule == rule
        assert await row(book, "t1") is None and await count_facts(book) == 0

    async def test_duplicate_create_raises_or_conflicts_and_writes_nothing(self, book: Book):
        """L5: a second create of an id fails (DuplicateEntity) or, with if_absent, is a conflict."""
        await new_task(book, "t1")
        before = await row(book, "t1")
        with pytest.raises(DuplicateEntity, match="'t1'"):
            await create(book, "task", values=task_values("again"), status="open", reason=CREATED, actor=SYSTEM,
                         entity_id="t1")
        outcome = await create(book, "task", values=task_values("again"), status="open", reason=CREATED,
                               actor=SYSTEM, entity_id="t1", if_absent=True)
        assert outcome.kind == "conflict" and outcome.fact_id is None
        assert await row(book, "t1") == before and await count_facts(book) == 1

    async def test_if_absent_conflicts_on_any_unique_constraint_and_keeps_the_transaction(self, book: Book):
        """L5: a dedup-key clash under if_absent writes nothing and the caller's transaction stays usable."""
        await new_task(book, "t1", dedup_key="k")
        async with book.begin() as tx:
            clash = await create(tx, "task", values=task_values(dedup_key="k"), status="open", reason=CREATED,
                                 actor=SYSTEM, entity_id="t2", if_absent=True)
            assert clash.kind == "conflict"
            fresh = await create(tx, "task", values=task_values(dedup_key="other"), status="open",
                                 reason=CREATED, actor=SYSTEM, entity_id="t3", if_absent=True)
            assert fresh.applied
        assert await row(book, "t2") is None and (await row(book, "t3"))["status"] == "open"
        assert await count_facts(book) == 2

    async def test_recreating_a_purged_id_is_refused_cleanly(self, book: Book):
        """L5 / L8 / L11: a purged id keeps its history, so create refuses the id (DuplicateEntity, or a
        conflict with if_absent) instead of failing on the fact chain's unique constraint."""
        await new_task(book, "t1")
        await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR)
        with pytest.raises(DuplicateEntity):
            await create(book, "task", values=task_values(), status="open", reason=CREATED, actor=SYSTEM,
                         entity_id="t1")
        outcome = await create(book, "task", values=task_values(), status="open", reason=CREATED, actor=SYSTEM,
                               entity_id="t1", if_absent=True)
        assert outcome.kind == "conflict"
        assert await row(book, "t1") is None and await count_facts(book) == 3

    # -- transition: applied, conflict, rejected --------------------------------------------------

    async def test_a_guard_can_expect_an_unset_column(self, book: Book):
        """L4: a guard of None means "still NULL" (a NULL-safe comparison), in one and in many commands."""
        await new_task(book, "t1")
        await start(book, "t1")
        claimed = await transition(book, "task", "t1", "working", expected="working",
                                   guards={"attempt": 1, "owner": None}, patch={"attempt": 2, "owner": "ana"},
                                   reason=RETRIED, actor=SYSTEM)
        assert claimed.applied and (await row(book, "t1"))["owner"] == "ana"
        with pytest.raises(TransitionConflict) as again:
            await transition(book, "task", "t1", "working", expected="working",
                             guards={"attempt": 2, "owner": None}, patch={"attempt": 3, "owner": "bob"},
                             reason=RETRIED, actor=SYSTEM)
        assert again.value.guards == ("owner",) and (await row(book, "t1"))["owner"] == "ana"
        await new_task(book, "t2")
        await start(book, "t2")
        batch = await apply_many(book, [
            Command("task", "t2", "working", RETRIED, SYSTEM, ("working",), {"attempt": 1, "owner": None},
                    {"attempt": 2, "owner": "cy"}),
        ])
        assert batch[0].applied and (await row(book, "t2"))["owner"] == "cy"

    async def test_any_of_several_expected_statuses_applies(self, book: Book):
        """L4: ``expected`` may list several statuses; the row matching any one of them moves."""
        await new_task(book, "t1")
        outcome = await transition(book, "task", "t1", "rejected", expected=["open", "blocked"], reason=REFUSED,
                                   actor=SYSTEM)
        assert outcome.applied and (await row(book, "t1"))["status"] == "rejected"

    @pytest.mark.parametrize(
        "command, rule",
        [
            (dict(target="done", expected="open", reason=FINISHED), "edge"),
            (dict(target="open", expected="rejected", reason=REOPENED, patch={"note": "n"}), "actor"),
            (dict(target="open", expected="rejected", reason=REOPENED, actor=OPERATOR), "patch"),
            (dict(target="working", expected="open", reason=STARTED, patch={"score": 9.0}), "patch"),
            (dict(target="working", expected="open", reason=STARTED, patch={"status": "done"}), "patch"),
            (dict(target="working", expected="open", reason=STARTED, guards={"title": "x"}), "patch"),
            (dict(target="working", expected="working", reason=RETRIED, patch={"attempt": 1}), "guard"),
            (dict(target="working", expected="open", reason=Reason("task.working.whim")), "reason"),
            (dict(target="working", expected="open", reason=Reason("dispatch.pending.enqueued")), "reason"),
            (dict(target="finished", expected="open", reason=FINISHED), "status"),
        ],
        ids=["undeclared_edge", "gated_edge_wrong_actor", "gated_edge_missing_patch", "non_patch_column",
             "lifecycle_column", "guard_on_non_patch_column", "missing_guard", "undeclared_reason",
             "foreign_reason", "unknown_status"],
    )
    async def test_rejected_commands_write_nothing(self, book: Book, command: dict[str, Any], rule: str):
        """L3: the policy refuses before any write, naming the rule; row and facts are unchanged."""
        await new_task(book, "t1")
        await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        await new_task(book, "t2")
        before = {i: await row(book, i) for i in ("t1", "t2")}
        facts = await count_facts(book)
        args: dict[str, Any] = dict(actor=SYSTEM)
        args.update(command)
        target, entity = args.pop("target"), "t1" if args["expected"] == "rejected" else "t2"
        with pytest.raises(TransitionRejected) as excinfo:
            await transition(book, "task", entity, target, **args)
        assert excinfo.value.rule == rule
        assert {i: await row(book, i) for i in ("t1", "t2")} == before
        assert await count_facts(book) == facts

    async def test_missing_entity_is_not_found(self, book: Book):
        """L3: a transition of a row that does not exist raises EntityNotFound (a LookupError); nothing written."""
        with pytest.raises(EntityNotFound, match="'ghost'") as excinfo:
            await transition(book, "task", "ghost", "working", expected="open", reason=STARTED, actor=SYSTEM)
        assert isinstance(excinfo.value, LookupError)
        assert await count_facts(book) == 0

    async def test_terminal_status_is_left_only_through_its_gate(self, book: Book):
        """L10: rejected -> open is refused to the system actor and applied for an operator with its patch."""
        await new_task(book, "t1")
        await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        with pytest.raises(TransitionRejected) as excinfo:
            await transition(book, "task", "t1", "open", expected="rejected", reason=REOPENED, actor=SYSTEM,
                             patch={"note": "retry"})
        assert excinfo.value.rule == "actor"
        outcome = await transition(book, "task", "t1", "open", expected="rejected", reason=REOPENED,
                                   actor=OPERATOR, patch={"note": "retry"})
        assert outcome.applied
        assert (await history(book, "task", "t1"))[-1].actor_type == "operator"
        done = await new_task(book, "t2")
        await start(book, done.entity_id)
        await transition(book, "task", "t2", "done", expected="working", reason=FINISHED, actor=SYSTEM)
        for target in ("open", "working", "rejected"):
            with pytest.raises(TransitionRejected):
                await transition(book, "task", "t2", target, expected="done", reason=REOPENED, actor=OPERATOR,
                                 patch={"note": "x"})
        assert (await verify(book)).ok

    async def test_builtin_dispatch_walk(self, book: Book):
        """L3 / L4 / L10: the built-in dispatch policy through the engine: claim, reclaim, dead-letter, reopen."""
        values = dict(kind="k", deliver_to="log:", payload={"n": 1}, next_attempt_at=0.0, created_at=0.0)
        await create(book, "dispatch", values=values, entity_id="d1", status="pending",
                     reason=Reason("dispatch.pending.enqueued"), actor=SYSTEM)
        claim = dict(reason=Reason("dispatch.delivering.attempt"), actor=SYSTEM)
        assert (await transition(book, "dispatch", "d1", "delivering", expected="pending", guards={"attempt": 0},
                                 patch={"attempt": 1}, **claim)).applied
        reclaim = dict(reason=Reason("dispatch.delivering.reclaimed"), actor=SYSTEM, expected="delivering")
        assert (await transition(book, "dispatch", "d1", "delivering", guards={"attempt": 0},
                                 patch={"attempt": 2}, on_conflict="return", **reclaim)).conflict
        assert (await transition(book, "dispatch", "d1", "delivering", guards={"attempt": 1},
                                 patch={"attempt": 2}, **reclaim)).applied
        await transition(book, "dispatch", "d1", "dead_letter", expected="delivering", actor=SYSTEM,
                         reason=Reason("dispatch.dead_letter.max_attempts"))
        reopen = dict(expected="dead_letter", reason=Reason("dispatch.pending.operator_retry"),
                      patch={"attempt": 0, "next_attempt_at": 10.0, "last_error": None})
        with pytest.raises(TransitionRejected):
            await transition(book, "dispatch", "d1", "pending", actor=SYSTEM, **reopen)
        assert (await transition(book, "dispatch", "d1", "pending", actor=OPERATOR, **reopen)).applied
        current = await row(book, "d1", "dispatch")
        assert (current["status"], current["version"], current["attempt"]) == ("pending", 5, 0)
        folded = await replay(book, "dispatch", "d1")
        assert {k: current[k] for k in folded} == folded
        assert (await verify(book)).ok

    # -- atomicity -------------------------------------------------------------------------------

    async def test_on_commit_runs_after_commit_only(self, book: Book):
        """L5: wake-up callbacks see committed work only: called after commit, never after a rollback."""
        seen: list[str] = []
        book.on_commit.append(seen.append)
        await new_task(book, "t1")
        assert seen == ["task"]
        with pytest.raises(Boom):
            async with book.begin() as tx:
                await start(tx, "t1")
                raise Boom
        assert seen == ["task"]
        async with book.begin() as tx:
            await start(tx, "t1")
            assert seen == ["task"], "not before the commit"
        assert seen == ["task", "task"]

    # -- versions and the fold -------------------------------------------------------------------

    async def test_version_and_fold_after_every_step(self, book: Book):
        """L6 / L7: after each step version == number of facts and the row equals the fold; as_of replays
        every intermediate state at its time."""
        clock = book.clock
        created_at = clock.now()
        await new_task(book, "t1")
        steps = [
            dict(target="working", expected="open", guards={"attempt": 0}, patch={"attempt": 1}, reason=STARTED),
            dict(target="blocked", expected="working", patch={"note": "needs review"}, reason=BLOCKED),
            dict(target="working", expected="blocked", patch={"owner": "carol", "labels": ["a", "b"]},
                 reason=STARTED),
            dict(target="working", expected="working", guards={"attempt": 1}, patch={"attempt": 2},
                 reason=RETRIED),
            dict(target="open", expected="working", patch={"owner": None}, reason=RELEASED),
            dict(target="rejected", expected="open", reason=REFUSED),
            dict(target="open", expected="rejected", patch={"note": "again"}, reason=REOPENED, actor=OPERATOR),
        ]
        snapshots = [(clock.now(), await row(book, "t1"))]
        for n, step in enumerate(steps, start=2):
            clock.advance(10)
            args = dict(step)
            target = args.pop("target")
            args.setdefault("actor", SYSTEM)
            outcome = await transition(book, "task", "t1", target, **args)
            assert outcome.applied and outcome.version == n
            current = await row(book, "t1")
            assert current["version"] == n == len(await history(book, "task", "t1"))
            assert current == await replay(book, "task", "t1")
            snapshots.append((clock.now(), current))
        assert await as_of(book, "task", "t1", created_at - 1) is None
        for when, snapshot in snapshots:
            assert await as_of(book, "task", "t1", when) == snapshot
            assert await as_of(book, "task", "t1", when + 5) == snapshot
        assert [f.version for f in await history(book, "task", "t1")] == list(range(1, len(steps) + 2))
