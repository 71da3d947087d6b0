"""Conformance cases for the storage port itself (lifecycle/store.py): what a backend's writes promise on their
own, whatever the engine read before handing them over.

The engine always reads the rows it moves under lock (PostgreSQL) or under the single writer (SQLite) before it
plans, so the engine's cases cannot tell a backend whose compare-and-set is missing from one whose
compare-and-set holds. These cases hand the port plans made from a stale head directly.
"""

from __future__ import annotations

from typing import Any

import pytest

from statebook.lifecycle import Book, history, verify
from statebook.lifecycle.plan import plan_purge

from .support import OPERATOR, PURGED, count_facts, new_task, row, start


async def delete(book: Book, planned_from: list[tuple[str, dict[str, Any]]]) -> set[str]:
    """``Store.delete`` of purges planned from the given heads, in one unit of the store's own."""
    lc = book.policy("task")
    writes = [plan_purge(lc, entity_id, head, PURGED, OPERATOR, book.clock.now(), True)
              for entity_id, head in planned_from]
    async with book.store.unit(None) as unit:
        return await book.store.delete(unit, lc.table, writes)


class StoreCases:
    """L4 / L11 / L17: the port's ``delete`` is a compare-and-set of its own."""

    @pytest.mark.parametrize("stale", ["head", "version", "last_fact_id"])
    async def test_delete_of_a_plan_from_a_stale_head_deletes_nothing_and_writes_no_tombstone(
            self, book: Book, stale: str):
        """L4 / L11 / L17: ``delete`` given a purge planned from a head the row no longer has — its version and
        chain head both old, or either one alone — deletes no row and writes no tombstone; planned from the
        row's head it deletes it with its tombstone."""
        await new_task(book, "t1")
        read = await row(book, "t1")
        await start(book, "t1")  # the entity moves on after the purge was planned
        now = await row(book, "t1")
        assert now is not None and read is not None
        planned_from = {"head": read, "version": {**now, "version": read["version"]},
                        "last_fact_id": {**now, "last_fact_id": read["last_fact_id"]}}[stale]
        assert await delete(book, [("t1", planned_from)]) == set()
        assert await row(book, "t1") == now
        assert [f.status for f in await history(book, "task", "t1")] == ["open", "working"]
        assert await delete(book, [("t1", now)]) == {"t1"}
        assert await row(book, "t1") is None
        assert [f.status for f in await history(book, "task", "t1")] == ["open", "working", None]
        assert (await verify(book)).ok

    async def test_delete_of_a_batch_deletes_only_the_rows_whose_head_still_matches(self, book: Book):
        """L4 / L17: in one ``delete`` of many rows, those planned from a stale head stay, with no tombstone; the
        others go, each with its tombstone (SQLite's executemany reports a total only, PostgreSQL's statement the
        ids)."""
        heads = {}
        for entity_id in ("a", "b", "c", "d"):
            await new_task(book, entity_id)
            heads[entity_id] = await row(book, entity_id)
        for entity_id in ("b", "d"):
            await start(book, entity_id)
        assert await delete(book, list(heads.items())) == {"a", "c"}
        assert [entity_id for entity_id in heads if await row(book, entity_id) is not None] == ["b", "d"]
        assert await count_facts(book) == 4 + 2 + 2  # creations, the two moves, two tombstones
        assert (await verify(book)).ok
