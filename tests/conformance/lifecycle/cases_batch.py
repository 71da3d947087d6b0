"""Conformance cases for the set-based forms ``create_many`` and ``apply_many``: the same rules as
``create`` and ``transition``, a batch at a time."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import sqlalchemy as sa

from statebook.lifecycle import (
    Book,
    Command,
    NewEntity,
    Reason,
    TransitionRejected,
    apply_many,
    create_many,
    history,
    purge,
    replay,
    transition,
    verify,
)
from statebook.lifecycle.engine import purge_many
from statebook.lifecycle.errors import IdempotencyMismatch

from .support import (
    CREATED,
    OPERATOR,
    PURGED,
    REFUSED,
    STARTED,
    SYSTEM,
    count_facts,
    new_task,
    row,
    task_values,
    tasks,
)


def item(entity_id: str, **overrides) -> NewEntity:
    return NewEntity(values={**task_values(entity_id), "id": entity_id, **overrides}, status="open", reason=CREATED,
                     actor=SYSTEM)


def claim(entity_id: str, attempt: int = 0, key: str | None = None, **changes) -> Command:
    """open -> working under a guard on attempt."""
    args = dict(entity_type="task", entity_id=entity_id, target="working", reason=STARTED, actor=SYSTEM,
                expected=("open",), guards={"attempt": attempt}, patch={"attempt": attempt + 1},
                idempotency_key=key)
    args.update(changes)
    return Command(**args)


class BatchCases:
    """create_many / apply_many on a real database."""

    async def test_create_many_writes_rows_and_first_facts(self, book: Book):
        """L5 / L7: every entity of a batch gets its row and its creation fact; outcomes follow input order."""
        outcomes = await create_many(book, "task", [item("b2"), item("b1"), item("b3", owner="dan")])
        assert [(o.entity_id, o.kind, o.version) for o in outcomes] == [("b2", "applied", 1), ("b1", "applied", 1),
                                                                          ("b3", "applied", 1)]
        for o in outcomes:
            (fact,) = await history(book, "task", o.entity_id)
            assert fact.id == o.fact_id and fact.previous_status is None and fact.status == "open"
            assert await row(book, o.entity_id) == await replay(book, "task", o.entity_id)
        assert (await row(book, "b3"))["owner"] == "dan"
        assert (await verify(book)).ok

    @pytest.mark.parametrize(
        "bad, rule",
        [(NewEntity(task_values(), "working", STARTED, SYSTEM), "initial"),
         (NewEntity(task_values(), "open", Reason("task.open.filed"), SYSTEM), "reason"),
         (NewEntity({**task_values(), "version": 3}, "open", CREATED, SYSTEM), "patch")],
        ids=["not_initial", "undeclared_reason", "lifecycle_column"],
    )
    async def test_create_many_refuses_the_whole_batch(self, book: Book, bad: NewEntity, rule: str):
        """L3: one invalid item refuses the batch before any write."""
        with pytest.raises(TransitionRejected) as excinfo:
            await create_many(book, "task", [item("b1"), bad])
        assert excinfo.value.rule == rule
        assert await row(book, "b1") is None and await count_facts(book) == 0

    async def test_create_many_if_absent_skips_existing_ids_and_keys(self, book: Book):
        """L5: under if_absent, items clashing on the id or another unique key are conflicts; the rest apply."""
        await new_task(book, "b1", dedup_key="k1")
        outcomes = await create_many(
            book, "task", [item("b1"), item("b2", dedup_key="k1"), item("b3", dedup_key="k3"),
                           item("b4", dedup_key="k3")],
            if_absent=True,
        )
        assert [o.kind for o in outcomes] == ["conflict", "conflict", "applied", "conflict"]
        assert await row(book, "b2") is None and await row(book, "b4") is None
        assert await count_facts(book) == 2
        assert (await verify(book)).ok

    async def test_create_many_if_absent_with_an_id_repeated_in_the_batch(self, book: Book):
        """L5 / L8: an id listed twice in one if_absent batch is created once; the repeat is a conflict."""
        outcomes = await create_many(book, "task", [item("b1"), item("b1"), item("b2")], if_absent=True)
        assert [o.kind for o in outcomes] == ["applied", "conflict", "applied"]
        assert await count_facts(book) == 2

    async def test_create_many_if_absent_with_a_purged_id(self, book: Book):
        """L5 / L11: a purged id is not reused: under if_absent it is a conflict and the batch's other items apply."""
        await new_task(book, "b1")
        await transition(book, "task", "b1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        await purge(book, "task", "b1", reason=PURGED, actor=OPERATOR)
        outcomes = await create_many(book, "task", [item("b1"), item("b2")], if_absent=True)
        assert [o.kind for o in outcomes] == ["conflict", "applied"]
        assert await row(book, "b1") is None

    async def test_apply_many_applies_what_matches_and_conflicts_the_rest(self, book: Book):
        """L4 / L6 / L7: per row compare-and-set — wrong status, stale guard or missing row are conflicts."""
        await create_many(book, "task", [item(i) for i in ("b1", "b2", "b3")])
        await transition(book, "task", "b2", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        outcomes = await apply_many(book, [claim("b1"), claim("b2"), claim("b3", attempt=4), claim("ghost")])
        assert [o.kind for o in outcomes] == ["applied", "conflict", "conflict", "conflict"]
        assert (outcomes[0].version, outcomes[1].status) == (2, "rejected")
        assert await count_facts(book) == 5
        for entity_id in ("b1", "b2", "b3"):
            current = await row(book, entity_id)
            assert current == await replay(book, "task", entity_id)
            assert current["version"] == len(await history(book, "task", entity_id))
        assert (await row(book, "b1"))["attempt"] == 1 and (await row(book, "b3"))["status"] == "open"
        assert (await verify(book)).ok

    async def test_apply_many_refuses_the_whole_batch(self, book: Book):
        """L3: a command the policy forbids raises before the batch writes anything."""
        await create_many(book, "task", [item("b1"), item("b2")])
        with pytest.raises(TransitionRejected) as excinfo:
            await apply_many(book, [claim("b1"), claim("b2", target="done", reason=Reason("task.done.finished"),
                                                      guards={}, patch={})])
        assert excinfo.value.rule == "edge"
        assert await count_facts(book) == 2 and (await row(book, "b1"))["status"] == "open"
        with pytest.raises(ValueError, match="distinct"):
            await apply_many(book, [claim("b1"), claim("b1")])

    async def test_apply_many_idempotency(self, book: Book):
        """L9: keyed commands in a batch replay or refuse exactly like single transitions."""
        await create_many(book, "task", [item("b1"), item("b2")])
        first = await apply_many(book, [claim("b1", key="k1"), claim("b2")])
        again = await apply_many(book, [claim("b1", key="k1")])
        assert again[0].replayed and again[0].fact_id == first[0].fact_id
        assert await count_facts(book) == 4
        with pytest.raises(IdempotencyMismatch):
            await apply_many(book, [claim("b1", key="k1", patch={"attempt": 9})])
        assert await count_facts(book) == 4

    async def test_apply_many_rolls_back_with_the_caller(self, book: Book):
        """L5: a batch joined to the caller's transaction is undone with it."""
        await create_many(book, "task", [item("b1"), item("b2")])
        with pytest.raises(RuntimeError):
            async with book.begin() as tx:
                await apply_many(tx, [claim("b1"), claim("b2")])
                raise RuntimeError("caller failed")
        assert await count_facts(book) == 2
        assert {(await row(book, i))["status"] for i in ("b1", "b2")} == {"open"}

    async def test_racing_batches_apply_each_row_once(self, book: Book, more_engines):
        """L14: concurrent batches over the same rows (waiting or skipping locked rows): each row moves once."""
        ids = [f"b{n}" for n in range(30)]
        await create_many(book, "task", [item(i) for i in ids])
        racer = Book(more_engines(), book.registry, book.clock)
        batches = await asyncio.gather(*(
            apply_many(racer, [claim(i) for i in ids], lock="skip_locked" if n % 2 else "wait") for n in range(6)
        ))
        applied = Counter(o.entity_id for batch in batches for o in batch if o.applied)
        assert applied == Counter(ids)
        assert await count_facts(book) == 2 * len(ids)
        assert (await verify(book)).ok

    async def test_fresh_ids_skip_the_purged_history_probe_and_chosen_ids_do_not(self, book: Book, monkeypatch):
        """L10 / issue 11: ids the caller drew with new_id just now (``fresh_ids=True``) cannot belong to a purged
        history, so the probe (a read whose plan went bad on a table analysed while empty: enqueue batches
        fell from 16,700 to 3,600 per second as 25,000 rows arrived) is not run; chosen ids are still probed."""
        from statebook.lifecycle.codec import new_id

        probed: list[list[str]] = []
        real = type(book.store).histories

        async def histories(store, unit, entity_type, ids):
            probed.append(list(ids))
            return await real(store, unit, entity_type, ids)

        monkeypatch.setattr(type(book.store), "histories", histories)
        fresh = [new_id()[:32] for _ in range(3)]
        await create_many(book, "task", [item(i) for i in fresh], fresh_ids=True)
        assert probed == []
        await create_many(book, "task", [item("chosen-1"), item("chosen-2")])
        assert probed == [["chosen-1", "chosen-2"]]
        assert {(await row(book, i))["status"] for i in [*fresh, "chosen-1"]} == {"open"}


class PurgeManyCases:
    """L5 / L17: ``purge_many`` is ``purge`` a batch at a time — one tombstone per row, a bounded number of
    statements, and a row that changed or vanished is a conflict that writes nothing."""

    async def test_purge_many_tombstones_each_row_with_few_statements(self, book: Book, monkeypatch):
        """L17: 1,200 rows purge in three batches with a bounded number of statements each (not one
        transaction per row), each row leaving its tombstone; verify still holds."""
        from statebook.adapters.persistence import Driver

        await create_many(book, "task", [NewEntity(task_values(f"t{n}"), "open", CREATED, SYSTEM) for n in range(1200)])
        async with book.read() as conn:
            ids = sorted(r.id for r in await conn.execute(sa.select(tasks.c.id)))
        sent: list[str] = []
        for name in ("fetch", "execute", "executemany"):
            method = getattr(Driver, name)

            async def spy(self, statement, params, _method=method):
                sent.append(name)
                return await _method(self, statement, params)

            monkeypatch.setattr(Driver, name, spy)
        outcomes = await purge_many(book, "task", ids, reason=PURGED, actor=OPERATOR, force=True)
        assert all(o.applied and o.status is None for o in outcomes)
        assert len(sent) <= 3 * 4, f"{len(sent)} statements for 1,200 rows: the purge is not set-based"
        monkeypatch.undo()
        async with book.read() as conn:
            assert (await conn.execute(sa.select(sa.func.count()).select_from(tasks))).scalar_one() == 0
        assert [f.status for f in await history(book, "task", ids[0])] == ["open", None]
        assert (await verify(book)).ok

    async def test_purge_many_leaves_rows_that_moved_or_vanished(self, book: Book):
        """L5: rows missing or not in an expected status are conflicts; the others purge; nothing half-done."""
        for name in ("a", "b", "c"):
            await new_task(book, name)
        await transition(book, "task", "b", "working", expected="open", guards={"attempt": 0},
                         patch={"attempt": 1}, reason=STARTED, actor=SYSTEM)
        outcomes = await purge_many(book, "task", ["a", "b", "gone", "c"], reason=PURGED, actor=OPERATOR,
                                    expected="open", force=True)
        assert [o.kind for o in outcomes] == ["applied", "conflict", "conflict", "applied"]
        assert await row(book, "a") is None and await row(book, "c") is None
        assert (await row(book, "b"))["status"] == "working"
        assert (await verify(book)).ok

    async def test_purge_many_refuses_a_live_row_without_force_and_writes_nothing(self, book: Book):
        """L5: one non-purgeable row refuses the whole batch before anything is deleted."""
        await new_task(book, "a")
        await new_task(book, "b")
        await transition(book, "task", "a", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        with pytest.raises(TransitionRejected):
            await purge_many(book, "task", ["a", "b"], reason=PURGED, actor=OPERATOR)
        assert await row(book, "a") is not None and await row(book, "b") is not None
        assert await count_facts(book) == 3

    async def test_a_batch_writes_every_value_back_exactly(self, book: Book):
        """A batch's values come back from the row and its facts exactly as given: text with quotes, backslashes,
        control and non-BMP characters, integers at their bounds, and a float that only its shortest repr
        carries (PostgreSQL sends a batch's rows as JSON text when every column is plain, issue 29). verify
        re-hashes what was stored, so a value changed on the way is a broken chain as well."""
        tricky = ['quote " and \\ backslash', "tab\tnewline\nreturn\r", "\u2028\u2029 separators", "emoji \U0001f600",
                  "é combining e\u0301", "{\"not\": json}", "", "\x7f del \x1b esc"]
        clock = book.clock
        clock.set(1_764_900_000.1234567)  # updated_at and each fact's at: 17 significant digits
        ids = [f"x{i}" for i in range(len(tricky))]
        await create_many(book, "task", [item(i, owner=t, attempt=2**31 - 1 - n) for n, (i, t) in enumerate(zip(ids, tricky))])
        clock.advance(0.1 + 0.2)
        commands = [claim(i, attempt=2**31 - 1 - n, patch={"attempt": -(2**31) + n, "note": t, "owner": t[::-1]})
                    for n, (i, t) in enumerate(zip(ids, tricky))]
        outcomes = await apply_many(book, commands)
        assert all(o.applied for o in outcomes), outcomes
        for n, (entity_id, text) in enumerate(zip(ids, tricky)):
            stored = await row(book, entity_id)
            assert stored is not None
            assert (stored["note"], stored["owner"], stored["attempt"]) == (text, text[::-1], -(2**31) + n)
            assert stored["updated_at"] == clock.now()
            assert stored == await replay(book, "task", entity_id)
            created, claimed = await history(book, "task", entity_id)
            assert created.patch["owner"] == text and claimed.patch["note"] == text
            assert (created.at, claimed.at) == (1_764_900_000.1234567, clock.now())
        assert (await verify(book)).ok
