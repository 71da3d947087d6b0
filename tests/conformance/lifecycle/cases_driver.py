"""Conformance cases for the hot paths run on the driver connection (lifecycle/driver.py).

``create_many``, ``apply_many`` and ``create`` send their statements straight to asyncpg / aiosqlite under a
SQLAlchemy connection. These cases check what that must not change: the statements join the caller's
transaction, a driver's integrity error is SQLAlchemy's and leaves nothing half-written, ``apply_many(seen=...)``
compares-and-sets against the rows the caller saw, and JSON values survive the PostgreSQL array (unnest) path.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from statebook.lifecycle import (
    Book,
    Command,
    NewEntity,
    Outcome,
    apply_many,
    create,
    create_many,
    history,
    purge,
    replay,
    transition,
    verify,
)
from statebook.lifecycle.errors import DuplicateEntity
from statebook.adapters.persistence import Driver
from statebook.lifecycle.errors import ConstraintViolation

from .support import (
    CREATED,
    FINISHED,
    OPERATOR,
    PURGED,
    REFUSED,
    REOPENED,
    STARTED,
    SYSTEM,
    count_facts,
    new_task,
    row,
    start,
    task_values,
    tasks,
)

JSON_VALUES: list[Any] = [
    ["docs"],
    [],
    {"k": [1, 2], "n": None},
    [["a", "b"], {"x": 1.5}],
    "plain",
    3,
    None,
    ['quote"s', "ünï", "back\\slash", "{brace}", "comma,", "NULL"],
]
"""Values for the JSON ``labels`` column: lists (a list of lists too), dicts, scalars, JSON null, and strings a
text-format array literal would have to escape."""


def fresh(title: str, **overrides: Any) -> NewEntity:
    """A task without an id: ``create_many`` generates one, so its first statement is the driver's insert."""
    return NewEntity(values=task_values(title, **overrides), status="open", reason=CREATED, actor=SYSTEM)


def claim(entity_id: str, attempt: int = 0, **patch: Any) -> Command:
    """open -> working under a guard on attempt."""
    return Command("task", entity_id, "working", STARTED, SYSTEM, ("open",), {"attempt": attempt},
                   {"attempt": attempt + 1, **patch})


def finish(entity_id: str, attempt: int) -> Command:
    """working -> done under a guard on attempt."""
    return Command("task", entity_id, "done", FINISHED, SYSTEM, ("working",), {"attempt": attempt})


def head(outcome: Outcome, attempt: int) -> dict[str, Any]:
    """The row an applied batch outcome left, as ``apply_many(seen=...)`` takes it."""
    assert outcome.applied and outcome.chain_hash is not None
    return {"status": outcome.status, "version": outcome.version, "last_fact_id": outcome.fact_id,
            "chain_hash": outcome.chain_hash, "attempt": attempt}


async def snapshot(book: Book) -> tuple[dict[str, dict[str, Any]], int]:
    """Every task row and the number of facts: what "nothing was written" compares."""
    async with book.engine.connect() as conn:
        rows = {r.id: dict(r._mapping) for r in await conn.execute(sa.select(tasks))}
    return rows, await count_facts(book)


async def assert_folds(book: Book, *entity_ids: str) -> None:
    """L6 / L7: each row equals the fold of its facts and its version counts them; verify is clean."""
    for entity_id in entity_ids:
        current = await row(book, entity_id)
        assert current == await replay(book, "task", entity_id)
        if current is not None:
            assert current["version"] == len(await history(book, "task", entity_id))
    report = await verify(book)
    assert report.ok, report


class DriverCases:
    """Driver-run statements on a real database: transactions, errors, ``seen`` rows, JSON values."""

    # -- the caller's transaction ------------------------------------------------------------------
    async def test_create_many_rolls_back_with_the_callers_transaction(self, book: Book):
        """L5: a batch insert sent to the driver as the transaction's first statement, and a transition after it
        (through SQLAlchemy), are both undone when the caller's transaction rolls back. (On PostgreSQL this needs
        ``driver()`` to send the BEGIN SQLAlchemy defers: else the insert would commit on its own.)"""
        woken: list[str] = []
        book.on_commit.append(woken.append)
        with pytest.raises(RuntimeError, match="caller failed"):
            async with book.begin() as tx:
                outcomes = await create_many(tx, "task", [fresh("a"), fresh("b")])
                assert [o.kind for o in outcomes] == ["applied", "applied"]
                moved = await start(tx, outcomes[0].entity_id)
                assert moved.applied and (await row(tx, outcomes[0].entity_id))["status"] == "working"
                raise RuntimeError("caller failed")
        assert await snapshot(book) == ({}, 0)
        assert woken == []

    @pytest.mark.parametrize("when", ["before", "after"])
    async def test_a_connection_lost_inside_a_transaction_is_storage_unavailable_and_writes_nothing(
            self, book: Book, when: str):
        """L5: a transaction whose connection is lost (invalidated) before or after its writes raises
        statebook's StorageUnavailable — not the library's own error — nothing of it committed, no commit
        hook ran, and the book works afterwards."""
        from statebook.lifecycle.errors import StorageUnavailable

        woken: list[str] = []
        book.on_commit.append(woken.append)
        with pytest.raises(StorageUnavailable, match="nothing of it was committed"):
            async with book.begin() as tx:
                assert tx.conn is not None
                if when == "before":
                    await tx.conn.invalidate()
                await create_many(tx, "task", [fresh("a")])
                if when == "after":
                    await tx.conn.invalidate()
        assert await snapshot(book) == ({}, 0)
        assert woken == []
        await new_task(book, "t2")
        assert await count_facts(book) == 1

    async def test_create_many_commits_with_the_callers_transaction(self, book: Book):
        """L5 / L7: driver statements and SQLAlchemy statements of one caller transaction commit together."""
        async with book.begin() as tx:
            (made,) = await create_many(tx, "task", [fresh("a")])
            await start(tx, made.entity_id)
            await new_task(tx, "t2")  # a chosen id: a history probe, then the driver's insert
        assert (await row(book, made.entity_id))["status"] == "working"
        assert await count_facts(book) == 3
        await assert_folds(book, made.entity_id, "t2")

    @pytest.mark.parametrize("with_seen", [True, False], ids=["seen", "read"])
    async def test_apply_many_rolls_back_with_the_callers_transaction(self, book: Book, with_seen: bool):
        """L5: apply_many joined to a caller's transaction — its row read and its set-based update, or with
        ``seen`` rows the update alone — is undone with it."""
        await create_many(book, "task", [fresh("a", dedup_key="a"), fresh("b", dedup_key="b")])
        before = await snapshot(book)
        ids = sorted(before[0])
        seen = {i: before[0][i] for i in ids} if with_seen else None
        with pytest.raises(RuntimeError, match="caller failed"):
            async with book.begin() as tx:
                outcomes = await apply_many(tx, [claim(i) for i in ids], seen=seen)
                assert [o.kind for o in outcomes] == ["applied", "applied"]
                raise RuntimeError("caller failed")
        assert await snapshot(book) == before

    # -- integrity errors -----------------------------------------------------------------------------
    @pytest.mark.parametrize("clash", ["existing_row", "within_batch"])
    async def test_integrity_error_in_create_many_writes_nothing(self, book: Book, clash: str):
        """L5: a unique-constraint violation in a driver statement is raised as DuplicateEntity (from
        ConstraintViolation) and no row or fact of the batch remains — not even of the items that
        were inserted before the clashing one."""
        await new_task(book, "t1", dedup_key="k1")
        before = await snapshot(book)
        batch = [fresh("a"), fresh("b"), fresh("c", dedup_key="k1" if clash == "existing_row" else "k2"),
                 fresh("d", dedup_key="k2")]
        with pytest.raises(DuplicateEntity) as excinfo:
            await create_many(book, "task", batch)
        assert isinstance(excinfo.value.__cause__, ConstraintViolation)
        assert await snapshot(book) == before
        (again,) = await create_many(book, "task", [fresh("e")])  # the book still works
        assert again.applied
        await assert_folds(book, "t1", again.entity_id)

    async def test_integrity_error_undoes_the_callers_earlier_writes(self, book: Book):
        """L5: a driver statement's integrity error inside the caller's transaction rolls back everything the
        transaction wrote before it."""
        await new_task(book, "t1", dedup_key="k1")
        before = await snapshot(book)
        with pytest.raises(DuplicateEntity):
            async with book.begin() as tx:
                await create_many(tx, "task", [fresh("a")])
                await start(tx, "t1")
                await create_many(tx, "task", [fresh("b", dedup_key="k1")])
        assert await snapshot(book) == before

    async def test_if_absent_batch_keeps_the_callers_transaction_usable(self, book: Book):
        """L5: under if_absent a clash is a conflict, not an error, so the caller's transaction goes on."""
        await new_task(book, "t1", dedup_key="k1")
        async with book.begin() as tx:
            clash, made = await create_many(tx, "task", [fresh("a", dedup_key="k1"), fresh("b")], if_absent=True)
            assert (clash.kind, made.kind) == ("conflict", "applied")
            assert (await start(tx, made.entity_id)).applied
        assert await count_facts(book) == 3
        await assert_folds(book, "t1", made.entity_id)

    async def test_integrity_error_in_a_single_create_writes_nothing(self, book: Book):
        """L5 / L15: a create with a generated id (on PostgreSQL one autocommit statement on a bare pooled
        connection) that clashes raises DuplicateEntity, writes nothing, and leaves the pool usable."""
        await new_task(book, "t1", dedup_key="k1")
        before = await snapshot(book)
        with pytest.raises(DuplicateEntity) as excinfo:
            await create(book, "task", values=task_values(dedup_key="k1"), status="open", reason=CREATED,
                         actor=SYSTEM, fresh_id=True)
        assert isinstance(excinfo.value.__cause__, ConstraintViolation)
        skipped = await create(book, "task", values=task_values(dedup_key="k1"), status="open", reason=CREATED,
                               actor=SYSTEM, if_absent=True)
        assert skipped.conflict
        assert await snapshot(book) == before
        made = [await create(book, "task", values=task_values(), status="open", reason=CREATED, actor=SYSTEM)
                for _ in range(3)]
        assert all(o.applied for o in made)
        await assert_folds(book, "t1", *(o.entity_id for o in made))

    # -- apply_many(seen=...) ---------------------------------------------------------------------------
    @pytest.mark.parametrize("bound", [False, True], ids=["own_transaction", "callers_transaction"])
    async def test_seen_rows_that_match_apply_and_chain(self, book: Book, bound: bool):
        """L4 / L6 / L7 / L8: with current seen rows the batch applies; a seen row built from the previous
        batch's outcome (as the outbox keeps it) chains the next fact onto it; verify is clean."""
        await create_many(book, "task", [fresh("a", dedup_key="a"), fresh("b", dedup_key="b")])
        rows, _ = await snapshot(book)
        ids = sorted(rows)

        async def run(commands: list[Command], seen: dict[str, Any]) -> list[Outcome]:
            if not bound:
                return await apply_many(book, commands, seen=seen)
            async with book.begin() as tx:
                return await apply_many(tx, commands, seen=seen)

        claimed = await run([claim(i) for i in ids], {i: rows[i] for i in ids})
        assert [(o.kind, o.version) for o in claimed] == [("applied", 2), ("applied", 2)]
        for o in claimed:
            current = await row(book, o.entity_id)
            assert (current["last_fact_id"], current["chain_hash"]) == (o.fact_id, o.chain_hash)
        done = await run([finish(i, 1) for i in ids], {o.entity_id: head(o, attempt=1) for o in claimed})
        assert [(o.kind, o.status, o.version) for o in done] == [("applied", "done", 3)] * 2
        assert await count_facts(book) == 6
        for o in done:
            facts = await history(book, "task", o.entity_id)
            assert [f.status for f in facts] == ["open", "working", "done"]
            assert facts[2].prev_fact_id == facts[1].id and facts[2].prev_hash == facts[1].hash
        await assert_folds(book, *ids)

    @pytest.mark.parametrize("bound", [False, True], ids=["own_transaction", "callers_transaction"])
    async def test_stale_seen_row_is_a_conflict_that_writes_nothing(self, book: Book, bound: bool):
        """L4: a seen row whose entity moved on since (another status, or purged) is a conflict that writes
        nothing for it; the batch's other commands apply."""
        await create_many(book, "task", [fresh(i, dedup_key=i) for i in ("a", "b", "c")])
        rows, _ = await snapshot(book)
        a, b, c = sorted(rows, key=lambda i: rows[i]["title"])
        await start(book, b)  # b: open -> working since it was seen
        await transition(book, "task", c, "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        await purge(book, "task", c, reason=PURGED, actor=OPERATOR)  # c: gone since it was seen
        before = await snapshot(book)
        commands = [claim(a), claim(b), claim(c)]
        if bound:
            async with book.begin() as tx:
                outcomes = await apply_many(tx, commands, seen=rows)
        else:
            outcomes = await apply_many(book, commands, seen=rows)
        assert [o.kind for o in outcomes] == ["applied", "conflict", "conflict"]
        after = await snapshot(book)
        assert after[1] == before[1] + 1
        assert after[0][b] == before[0][b] and c not in after[0]
        assert len(await history(book, "task", b)) == 2 and len(await history(book, "task", c)) == 3
        await assert_folds(book, a, b, c)

    @pytest.mark.parametrize("bound", [False, True], ids=["own_transaction", "callers_transaction"])
    async def test_seen_row_with_a_wrong_chain_head_is_a_conflict(self, book: Book, bound: bool):
        """L4 / L8: a seen row with the right version but another chain head (a caller's mistake) is a
        conflict: the compare-and-set includes ``last_fact_id``, so the new fact cannot link to the wrong
        predecessor and break the chain."""
        await create_many(book, "task", [fresh(i, dedup_key=i) for i in ("a", "b")])
        rows, _ = await snapshot(book)
        a, b = sorted(rows, key=lambda i: rows[i]["title"])
        wrong = {**rows[b], "last_fact_id": "0" * 32, "chain_hash": "f" * 64}
        before = await snapshot(book)
        commands = [claim(a), claim(b)]
        if bound:
            async with book.begin() as tx:
                outcomes = await apply_many(tx, commands, seen={a: rows[a], b: wrong})
        else:
            outcomes = await apply_many(book, commands, seen={a: rows[a], b: wrong})
        assert [o.kind for o in outcomes] == ["applied", "conflict"]
        after = await snapshot(book)
        assert after[0][b] == before[0][b] and after[1] == before[1] + 1
        assert (await verify(book, "task")).ok
        await assert_folds(book, a, b)

    @pytest.mark.parametrize("bound", [False, True], ids=["own_transaction", "callers_transaction"])
    async def test_seen_row_with_only_a_wrong_chain_hash_is_a_conflict(self, book: Book, bound: bool):
        """L4 / L8: a seen row whose fact id, version and status are right but whose chain hash is not (a
        forged or corrupted head) is a conflict: the new fact's ``prev_hash`` comes from that hash, so the
        compare-and-set covers it and nothing that would fail verify is written."""
        await create_many(book, "task", [fresh(i, dedup_key=i) for i in ("a", "b")])
        rows, _ = await snapshot(book)
        a, b = sorted(rows, key=lambda i: rows[i]["title"])
        forged = {**rows[b], "chain_hash": "f" * 64}
        before = await snapshot(book)
        if bound:
            async with book.begin() as tx:
                outcomes = await apply_many(tx, [claim(a), claim(b)], seen={a: rows[a], b: forged})
        else:
            outcomes = await apply_many(book, [claim(a), claim(b)], seen={a: rows[a], b: forged})
        assert [o.kind for o in outcomes] == ["applied", "conflict"]
        after = await snapshot(book)
        assert after[0][b] == before[0][b] and after[1] == before[1] + 1
        assert (await verify(book, "task")).ok
        await assert_folds(book, a, b)

    @pytest.mark.parametrize("bound", [False, True], ids=["own_transaction", "callers_transaction"])
    async def test_seen_row_with_an_old_version_is_a_conflict(self, book: Book, bound: bool):
        """L4 / L15: a seen row whose entity left and came back to the same status and guard values differs
        from the current row only in its version; the compare-and-set on the version makes the command a
        conflict that writes nothing (it would otherwise chain a fact onto a superseded head)."""
        await create_many(book, "task", [fresh("a", dedup_key="a"), fresh("b", dedup_key="b")])
        rows, _ = await snapshot(book)
        a, b = sorted(rows, key=lambda i: rows[i]["title"])
        await transition(book, "task", b, "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        await transition(book, "task", b, "open", expected="rejected", reason=REOPENED, actor=OPERATOR,
                         patch={"note": "again"})
        before = await snapshot(book)
        if bound:
            async with book.begin() as tx:
                outcomes = await apply_many(tx, [claim(a), claim(b)], seen=rows)
        else:
            outcomes = await apply_many(book, [claim(a), claim(b)], seen=rows)
        assert [o.kind for o in outcomes] == ["applied", "conflict"]
        after = await snapshot(book)
        assert after[0][b] == before[0][b] and after[1] == before[1] + 1
        assert len(await history(book, "task", b)) == 3
        await assert_folds(book, a, b)

    async def test_every_row_seen_is_one_statement_on_postgresql(self, book: Book, monkeypatch):
        """L5 / L15: on PostgreSQL an unbound batch whose rows were all seen is ONE driver statement in
        autocommit (no transaction, no read); SQLite writes it in a write transaction. on_commit runs once
        when the batch wrote, and not when every command was a conflict."""
        await create_many(book, "task", [fresh(i, dedup_key=i) for i in ("a", "b", "c")])
        rows, _ = await snapshot(book)
        ids = sorted(rows)
        sent: list[str] = []
        opened: list[str] = []
        for name in ("fetch", "execute", "executemany"):
            method = getattr(Driver, name)

            async def spy(self, statement, params, _method=method):
                sent.append(str(statement))
                return await _method(self, statement, params)

            monkeypatch.setattr(Driver, name, spy)
        store_type = type(book.store)
        own_unit = store_type.own_unit

        def spy_open(self, one_statement, _own=own_unit):
            opened.append("autocommit" if one_statement else "transaction")
            return _own(self, one_statement)

        monkeypatch.setattr(store_type, "own_unit", spy_open)
        woken: list[str] = []
        book.on_commit.append(woken.append)
        outcomes = await apply_many(book, [claim(i) for i in ids], seen=rows)
        assert all(o.applied for o in outcomes)
        if book.dialect == "postgresql":
            assert opened == ["autocommit"] and len(sent) == 1
        else:
            assert len(opened) == 1 and len(sent) >= 2  # SQLite: one BEGIN IMMEDIATE unit, update + facts
        assert woken == ["task"]
        stale = await apply_many(book, [claim(i) for i in ids], seen=rows)
        assert all(o.conflict for o in stale)
        assert woken == ["task"]
        await assert_folds(book, *ids)

    # -- JSON values --------------------------------------------------------------------------------------
    async def test_json_values_round_trip_through_batches(self, book: Book):
        """L7: JSON column values — lists (one holding lists), dicts, scalars, JSON null, strings with quotes,
        braces and commas — are stored as given by create_many and apply_many (on PostgreSQL as one JSON text per
        element of a text[] array), with seen rows and without; each row equals the fold of its facts."""
        items = [NewEntity(values={**task_values(f"t{n}"), "id": f"t{n}", "labels": value}, status="open",
                           reason=CREATED, actor=SYSTEM, metadata={"labels": value})
                 for n, value in enumerate(JSON_VALUES)]
        outcomes = await create_many(book, "task", items)
        assert all(o.applied for o in outcomes)
        ids = [o.entity_id for o in outcomes]
        for entity_id, value in zip(ids, JSON_VALUES):
            assert (await row(book, entity_id))["labels"] == value
            (fact,) = await history(book, "task", entity_id)
            assert fact.patch["labels"] == value and fact.metadata == {"labels": value}
        await assert_folds(book, *ids)
        rows, _ = await snapshot(book)
        shifted = JSON_VALUES[1:] + JSON_VALUES[:1]
        half = len(ids) // 2
        claims = [claim(i, labels=v) for i, v in zip(ids, shifted)]
        seen_half = await apply_many(book, claims[:half], seen={i: rows[i] for i in ids[:half]})
        read_half = await apply_many(book, claims[half:])
        assert all(o.applied for o in seen_half + read_half)
        for entity_id, value in zip(ids, shifted):
            assert (await row(book, entity_id))["labels"] == value
            assert (await history(book, "task", entity_id))[1].patch == {"attempt": 1, "labels": value}
        await assert_folds(book, *ids)
