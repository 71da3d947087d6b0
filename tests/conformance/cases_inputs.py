"""L20: arguments the engine refuses (lifecycle/inputs.py), the same way on every backend, before any write.

Each case gives a command one bad value and checks three things: the error is an ``InvalidArgument``
(a ``StatebookError``), its ``argument`` names what was wrong, and neither the task table nor the
facts table changed. Without the boundary each of these inputs reached a backend, where SQLite stored
what PostgreSQL refused (a 40-character id in a ``String(32)``, ``2**31`` in an ``Integer``, NaN in a
``Float``) or the driver raised its own exception (a lone surrogate, a 3,000-level body).
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, NewEntity, Reason, as_of, create, create_many, history, purge
from statebook.lifecycle import apply_many, transition, verify
from statebook.lifecycle.errors import InvalidArgument, StatebookError
from statebook.lifecycle.facts import Cursor, tail

from .support import CREATED, STARTED, SYSTEM, count_facts, new_task, task_values, tasks


def deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


BAD_VALUES = [
    pytest.param("title", "\ud800", "utf8", id="surrogate-text"),
    pytest.param("title", "a\x00b", "nul", id="nul-text"),
    pytest.param("title", 12, "type", id="number-as-text"),
    pytest.param("attempt", 2**31, "range", id="int-over-32-bits"),
    pytest.param("attempt", -(2**63) - 1, "range", id="int-under-64-bits"),
    pytest.param("attempt", True, "type", id="bool-as-int"),
    pytest.param("attempt", 1.5, "type", id="float-as-int"),
    pytest.param("score", float("nan"), "finite", id="nan"),
    pytest.param("score", float("-inf"), "finite", id="inf"),
    pytest.param("score", 10**400, "finite", id="int-beyond-float"),
    pytest.param("labels", deep(3000), "depth", id="json-3000-deep"),
    pytest.param("labels", {"k": "\udfff"}, "utf8", id="json-surrogate"),
    pytest.param("labels", [float("nan")], "finite", id="json-nan"),
    pytest.param("labels", {1: "x"}, "json", id="json-int-key"),
    pytest.param("labels", {"x": object()}, "json", id="json-object"),
    pytest.param("labels", [2**64], "range", id="json-int-over-64-bits"),
    pytest.param("dedup_key", "k" * 256, "length", id="indexed-text-too-long"),
]


class InputCases:
    """Conformance cases for the engine's boundary."""

    async def counts(self, book: Book) -> tuple[int, int]:
        async with book.engine.connect() as conn:
            rows = (await conn.execute(sa.select(sa.func.count()).select_from(tasks))).scalar_one()
        return rows, await count_facts(book)

    async def refused(self, book: Book, call: Any, argument: str, rule: str | None = None) -> InvalidArgument:
        before = await self.counts(book)
        with pytest.raises(InvalidArgument) as caught:
            await call
        assert isinstance(caught.value, StatebookError)
        assert argument in caught.value.argument, caught.value.argument
        assert str(caught.value).startswith(caught.value.argument)
        if rule is not None:
            assert caught.value.rule == rule, (caught.value.rule, str(caught.value))
        assert await self.counts(book) == before
        return caught.value

    @pytest.mark.parametrize("column,value,rule", BAD_VALUES)
    async def test_a_create_with_a_bad_column_value_writes_nothing(self, book: Book, column: str, value: Any,
                                                                   rule: str) -> None:
        await self.refused(book, create(book, "task", values=task_values(**{column: value}), status="open",
                                        reason=CREATED, actor=SYSTEM), column, rule)

    @pytest.mark.parametrize("column,value,rule", [p for p in BAD_VALUES if p.values[0] in ("attempt", "labels")])
    async def test_a_patch_or_guard_with_a_bad_value_writes_nothing(self, book: Book, column: str, value: Any,
                                                                    rule: str) -> None:
        task = await new_task(book)
        await self.refused(book, transition(book, "task", task.entity_id, "working", expected="open",
                                            patch={column: value}, reason=STARTED, actor=SYSTEM), f"patch.{column}", rule)
        if column == "attempt":
            await self.refused(book, transition(book, "task", task.entity_id, "working", expected="open",
                                                guards={"attempt": value}, patch={"attempt": 1}, reason=STARTED,
                                                actor=SYSTEM), f"guards.{column}", rule)

    async def test_an_id_longer_than_its_column_is_refused_on_every_backend(self, book: Book) -> None:
        # conformance_tasks.id is String(32): PostgreSQL refused 33 characters, SQLite stored them.
        await self.refused(book, create(book, "task", values=task_values(), status="open", reason=CREATED,
                                        actor=SYSTEM, entity_id="x" * 33), "id", "length")
        await new_task(book, "x" * 32)  # the longest id the column holds is fine

    @pytest.mark.parametrize("field,reason,actor,metadata", [
        pytest.param("reason.summary", Reason("task.open.created", "\ud800"), SYSTEM, None, id="summary-surrogate"),
        pytest.param("reason.evidence", Reason("task.open.created", evidence=("a\x00",)), SYSTEM, None,
                     id="evidence-nul"),
        pytest.param("reason.code", Reason(["task"]), SYSTEM, None, id="code-not-text"),  # type: ignore[arg-type]
        pytest.param("actor.id", CREATED, Actor("system", "\ud800"), None, id="actor-surrogate"),
        pytest.param("actor.id", CREATED, Actor("system", "a" * 256), None, id="actor-too-long"),
        pytest.param("metadata", CREATED, SYSTEM, {"deep": deep(40)}, id="metadata-deep"),
        pytest.param("metadata", CREATED, SYSTEM, {"n": float("inf")}, id="metadata-inf"),
        pytest.param("metadata", CREATED, SYSTEM, ["not", "a", "mapping"], id="metadata-not-mapping"),
    ])
    async def test_a_bad_reason_actor_or_metadata_writes_nothing(self, book: Book, field: str, reason: Reason,
                                                                 actor: Actor, metadata: Any) -> None:
        await self.refused(book, create(book, "task", values=task_values(), status="open", reason=reason, actor=actor,
                                        metadata=metadata), field)

    async def test_metadata_beyond_the_books_size_bound_is_refused(self, book: Book) -> None:
        from dataclasses import replace

        from statebook.lifecycle.inputs import Limits

        small = replace(book, limits=Limits(json_bytes=100))
        await self.refused(small, create(small, "task", values=task_values(), status="open", reason=CREATED,
                                         actor=SYSTEM, metadata={"blob": "x" * 200}), "metadata", "size")
        await create(book, "task", values=task_values(), status="open", reason=CREATED, actor=SYSTEM,
                     metadata={"blob": "x" * 200})  # the default bound takes it

    async def test_bad_ids_keys_and_statuses_in_a_transition_write_nothing(self, book: Book) -> None:
        task = await new_task(book)
        cases = [
            ("entity_id", dict(entity_id="\ud800")),
            ("entity_id", dict(entity_id=7)),
            ("entity_id", dict(entity_id="")),
            ("target", dict(target=["working"])),
            ("expected", dict(expected=["open", None])),
            ("idempotency_key", dict(idempotency_key="k" * 256)),
            ("idempotency_key", dict(idempotency_key="a\x00")),
        ]
        for argument, change in cases:
            args: dict[str, Any] = dict(entity_id=task.entity_id, target="working", expected="open",
                                        patch={"attempt": 1}, reason=STARTED, actor=SYSTEM)
            args.update(change)
            await self.refused(book, transition(book, "task", args.pop("entity_id"), args.pop("target"), **args),
                               argument)

    async def test_batches_refuse_what_is_not_a_command_or_entity(self, book: Book) -> None:
        await self.refused(book, create_many(book, "task", [None]), "items", "type")  # type: ignore[list-item]
        await self.refused(book, apply_many(book, [Command("task", "\ud800", "working", STARTED, SYSTEM,
                                                            ("open",))]), "entity_id")
        ok = NewEntity(task_values(), "open", CREATED, SYSTEM)
        bad = NewEntity(task_values(score=float("nan")), "open", CREATED, SYSTEM)
        await self.refused(book, create_many(book, "task", [ok, bad]), "score", "finite")  # the good one neither

    async def test_reads_refuse_bad_ids_and_times(self, book: Book) -> None:
        task = await new_task(book)
        await self.refused(book, history(book, "task", "\ud800"), "entity_id", "utf8")
        await self.refused(book, as_of(book, "task", task.entity_id, float("nan")), "when", "finite")
        await self.refused(book, as_of(book, "task", task.entity_id, 1e300), "when", "range")
        await self.refused(book, purge(book, "task", "a\x00", reason=CREATED, actor=SYSTEM), "entity_id", "nul")
        await self.refused(book, verify(book, processes=-1), "processes", "range")
        async with book.engine.connect() as conn:
            with pytest.raises(InvalidArgument):
                await tail(conn, Cursor(), limit=0)
            with pytest.raises(InvalidArgument):
                await tail(conn, Cursor(seq=2**70))
        assert (await verify(book)).ok
