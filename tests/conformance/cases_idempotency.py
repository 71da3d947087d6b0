"""Conformance cases for idempotency keys: a retried command replays, a reused key is refused."""

from __future__ import annotations

from typing import Any

import pytest

from statebook.lifecycle import Book, history, transition
from statebook.lifecycle.errors import IdempotencyMismatch

from .support import BLOCKED, OPERATOR, REFUSED, RELEASED, RETRIED, STARTED, SYSTEM, count_facts, new_task, row, start


class IdempotencyCases:
    """L9 on a real database (the concurrent retry is in cases_concurrency.py)."""


    async def test_idempotent_replay_returns_the_original_outcome(self, book: Book):
        """L9: the same key and command returns the first outcome (replayed) and writes nothing, even later."""
        await new_task(book, "t1")
        first = await start(book, "t1", idempotency_key="k1")
        assert first.applied and not first.replayed
        again = await start(book, "t1", idempotency_key="k1")
        assert again.replayed and (again.kind, again.fact_id, again.status, again.version) == (
            "applied", first.fact_id, "working", 2)
        await transition(book, "task", "t1", "blocked", expected="working", reason=BLOCKED, actor=SYSTEM)
        before = await row(book, "t1")
        late = await start(book, "t1", idempotency_key="k1")
        assert late.replayed and (late.fact_id, late.status, late.version) == (first.fact_id, "working", 2)
        assert await row(book, "t1") == before and await count_facts(book) == 3
        fact = (await history(book, "task", "t1"))[1]
        assert fact.idempotency_key == "k1" and fact.command_digest

    @pytest.mark.parametrize(
        "change",
        [dict(patch={"attempt": 5}), dict(guards={"attempt": 3}), dict(reason=RETRIED), dict(actor=OPERATOR),
         dict(expected=["open", "blocked"]), dict(target="rejected", reason=REFUSED, guards={}, patch={})],
        ids=["patch", "guard", "reason", "actor", "expected", "target"],
    )
    async def test_reused_key_with_another_command_is_an_error(self, book: Book, change: dict[str, Any]):
        """L9: a key bound to one command cannot be reused for a different one; nothing is written."""
        await new_task(book, "t1")
        original: dict[str, Any] = dict(target="working", expected="open", guards={"attempt": 0},
                                        patch={"attempt": 1}, reason=STARTED, actor=SYSTEM)
        first = await transition(book, "task", "t1", idempotency_key="k1", **original)
        await transition(book, "task", "t1", "open", expected="working", reason=RELEASED, actor=SYSTEM)
        before = await row(book, "t1")
        same = await transition(book, "task", "t1", idempotency_key="k1", **original)
        assert same.replayed and same.fact_id == first.fact_id, "the unchanged command replays"
        with pytest.raises(IdempotencyMismatch, match="'k1'"):
            await transition(book, "task", "t1", idempotency_key="k1", **{**original, **change})
        assert await row(book, "t1") == before and await count_facts(book) == 3

    async def test_idempotency_keys_are_per_entity_and_only_bound_when_applied(self, book: Book):
        """L9: a key is scoped to its entity, and a conflicting command does not consume it."""
        await new_task(book, "t1")
        await new_task(book, "t2")
        assert (await start(book, "t1", idempotency_key="k")).applied
        assert not (await start(book, "t2", idempotency_key="k")).replayed
        await new_task(book, "t3")
        missed = await start(book, "t3", attempt=7, idempotency_key="k3")
        assert missed.kind == "conflict"
        hit = await start(book, "t3", idempotency_key="k3")
        assert hit.applied and not hit.replayed
