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

from statebook.lifecycle import Actor, Book, Command, NewEntity, Reason, as_of, create, create_many, history, purge
from statebook.lifecycle import apply_many, transition, verify
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.facts import Cursor, tail

from statebook.lifecycle.testing.cases import BAD_VALUES, InputBoundCases, deep

from .support import CREATED, STARTED, SYSTEM, new_task, task_values


class InputCases(InputBoundCases):
    """Conformance cases for the engine's boundary (the package's InputBoundCases, and more)."""

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
