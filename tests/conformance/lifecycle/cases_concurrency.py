"""Conformance cases for concurrent use: racing writers, honest interleavings and what pins the facts.

``RaceCases`` and ``HonestSeqCases`` hold on every backend. The last two classes are per concurrency
model: ``ConcurrentWriterCases`` for MVCC databases with many simultaneous writers (PostgreSQL),
``SerialWriterCases`` for a database with one writer at a time that others wait for (SQLite). The
tailing reader's own cases are in cases_tail.py.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statebook.adapters.audit import CHECKPOINT_FILE, export_bundle, verify_bundle
from statebook.lifecycle import (
    Book, Command, EntityNotFound, Fact, NewEntity, Reason, TransitionConflict, apply_many, create_many, history, purge,
    transition, verify)
from statebook.lifecycle.chain import checkpoint, key_chain
from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.errors import StorageError
from statebook.lifecycle.facts import Cursor, facts_table

from statebook.lifecycle.testing.cases import ClaimCases

from .cases_tail import ConcurrentTailCases, ids, read_tail
from .support import CREATED, PURGED, REFUSED, RELEASED, STARTED, SYSTEM, new_task, row, start, task_values

MakeEngine = Callable[[], AsyncEngine]


class RaceCases(ClaimCases):
    """L14: racing writers on one compare-and-set — exactly one wins, whatever the backend (the package's
    ClaimCases, and more)."""

    async def test_racing_retries_of_one_keyed_command(self, book: Book, more_engines: MakeEngine):
        """L9 / L14 / L15: the same command with the same idempotency key sent by many racers at once is applied
        once and every other racer gets that outcome replayed (not a conflict), on every backend."""
        await new_task(book, "t1")
        racer = Book(more_engines(), book.registry, book.clock)
        barrier = asyncio.Barrier(self.RACERS) if book.dialect == "postgresql" else None

        async def race():
            if barrier is None:  # one writer at a time: the racers queue on the write lock
                return await start(racer, "t1", idempotency_key="retry-1")
            async with racer.begin() as tx:
                assert tx.conn is not None
                await tx.conn.execute(sa.select(1))
                await barrier.wait()
                return await start(tx, "t1", idempotency_key="retry-1")

        outcomes = await asyncio.gather(*(race() for _ in range(self.RACERS)))
        assert Counter((o.kind, o.replayed) for o in outcomes) == {("applied", False): 1,
                                                                    ("applied", True): self.RACERS - 1}
        assert len({o.fact_id for o in outcomes}) == 1
        assert len(await history(book, "task", "t1")) == 2

    async def test_purges_racing_transitions_never_half_write(self, book: Book, more_engines: MakeEngine):
        """L5 / L14: purges and transitions of the same rows, racing on separate connections: each pair ends
        with exactly one winner — the row purged (the transition then a conflict or EntityNotFound) or moved
        (the purge then a conflict) — never a constraint error, and the history verifies."""
        names = [f"r{n}" for n in range(10)]
        for name in names:
            await new_task(book, name)
        racer = Book(more_engines(), book.registry, book.clock)

        async def move(name: str) -> str:
            try:
                return (await start(racer, name)).kind
            except EntityNotFound:
                return "gone"
            except TransitionConflict as lost:
                return lost.outcome.kind

        async def drop(name: str) -> str:
            try:
                return (await purge(racer, "task", name, reason=PURGED, actor=SYSTEM, expected="open",
                                    force=True)).kind
            except TransitionConflict as lost:
                return lost.outcome.kind

        results = await asyncio.gather(*(asyncio.gather(move(n), drop(n)) for n in names))
        for moved, dropped in results:
            assert (moved == "applied") != (dropped == "applied"), (moved, dropped)
        assert (await verify(book)).ok

async def all_entities(book: Book) -> list[tuple[str, str]]:
    """Every (entity type, entity id) with facts."""
    t = facts_table
    async with book.read() as conn:
        return [tuple(r) for r in (await conn.execute(sa.select(t.c.entity_type, t.c.entity_id).distinct()))]


async def seq_by_version(book: Book) -> dict[tuple[str, str], list[int]]:
    """Each entity's seqs in version order."""
    t = facts_table
    async with book.read() as conn:
        rows = (await conn.execute(sa.select(t.c.entity_type, t.c.entity_id, t.c.seq)
                                   .order_by(t.c.entity_type, t.c.entity_id, t.c.version))).all()
    found: dict[tuple[str, str], list[int]] = {}
    for entity_type, entity_id, seq in rows:
        found.setdefault((entity_type, entity_id), []).append(seq)
    return found


class HonestSeqCases:
    """L12d / L13a: however honest writers interleave, each entity's seq rises with its version, so verify's seq-order
    check never reports an honest history, and the tail gives each entity's facts in version order."""

    WORKERS = 8
    ROUNDS = 12

    async def honest_writers(self, book: Book, more_engines: MakeEngine) -> tuple[list[list[str]], Counter[str]]:
        """Workers on their own connections move tasks back and forth in transactions of several entities (a seq
        drawn for one entity, then a wait for another's row lock), in batches, create and purge them, at once.
        The fact ids of each transaction, in the order the commits returned, and counts of what was lost."""
        ids = [o.entity_id for o in await create_many(
            book, "task", [NewEntity(task_values(f"t{n}"), "open", CREATED, SYSTEM) for n in range(6)])]
        racer = Book(more_engines(), book.registry, book.clock)
        committed: list[list[str]] = []  # fact ids of each transaction, in the order the commits returned
        counts = Counter()
        rng = random.Random(25)

        def move(status: str | None) -> tuple[str, Reason, tuple[str, ...]]:
            return ("working", STARTED, ("open",)) if status == "open" else ("open", RELEASED, ("working",))

        async def several(chosen: list[str]) -> list[str]:
            written = []
            async with racer.begin() as tx:
                for entity_id in sorted(chosen):  # one lock order: no deadlock, seqs still drawn before waits
                    current = await row(tx, entity_id)
                    if current is None:
                        continue
                    target, reason, expected = move(current["status"])
                    try:
                        outcome = await transition(tx, "task", entity_id, target, expected=expected,
                                                   reason=reason, actor=SYSTEM, on_conflict="return")
                    except EntityNotFound:  # purged meanwhile
                        continue
                    if outcome.applied:
                        written.append(outcome.fact_id)
                    await asyncio.sleep(rng.random() / 500)
            return written

        async def batch(chosen: list[str]) -> list[str]:
            commands = []
            for entity_id in chosen:
                current = await row(racer, entity_id)
                if current is not None:
                    target, reason, expected = move(current["status"])
                    commands.append(Command("task", entity_id, target, reason, SYSTEM, expected))
            return [o.fact_id for o in await apply_many(racer, commands) if o.applied] if commands else []

        async def worker(n: int) -> None:
            for r in range(self.ROUNDS):
                chosen = rng.sample(ids, 3)
                try:
                    if r == n:  # now and then: a purge racing the others
                        done = await purge(racer, "task", chosen[0], reason=PURGED, actor=SYSTEM, force=True)
                        written = [done.fact_id] if done.applied else []
                    elif r % 4 == 3:
                        made = await create_many(racer, "task", [NewEntity(task_values("late"), "open", CREATED,
                                                                           SYSTEM) for _ in range(2)])
                        ids.extend(o.entity_id for o in made)
                        written = [o.fact_id for o in made]
                    elif r % 2:
                        written = await batch(chosen)
                    else:
                        written = await several(chosen)
                except EntityNotFound:
                    counts["gone"] += 1
                    continue
                except StorageError as exc:
                    if "deadlock" not in str(exc):
                        raise
                    counts["deadlocks"] += 1  # PostgreSQL chose a victim: rolled back, nothing written
                    continue
                if written:
                    committed.append(written)

        await asyncio.gather(*(worker(n) for n in range(self.WORKERS)))
        return committed, counts

    async def test_honest_concurrent_writers_keep_each_entitys_seq_in_version_order(
            self, book: Book, more_engines: MakeEngine):
        """L12d / L15: honest writers at once (``honest_writers``): every entity's seq rises with its version and
        verify finds nothing. On PostgreSQL seqs are drawn at insert and commit in another order across entities:
        the figure printed counts pairs of transactions that committed in the other order than their seqs."""
        committed, counts = await self.honest_writers(book, more_engines)
        report = await verify(book)
        assert report.ok, report.findings
        by_entity = await seq_by_version(book)
        assert all(seqs == sorted(set(seqs)) for seqs in by_entity.values()), by_entity
        seq_of = {f.id: f.seq for key in by_entity for f in await history(book, *key)}
        spans = [(min(seq_of[i] for i in t), max(seq_of[i] for i in t)) for t in committed]
        crossed = sum(1 for i, (_, top) in enumerate(spans) for low, _ in spans[i + 1:] if low < top)
        print(f"\n{book.dialect}: {len(committed)} transactions, {report.facts} facts on {report.entities} entities, "
              f"{counts['deadlocks']} deadlock victims, {crossed} pairs of transactions committed in another order "
              "than their seqs; seq rises with the version in every entity")


    async def test_a_tail_paging_through_honest_concurrent_writers_gives_each_entitys_versions_in_order(
            self, book: Book, more_engines: MakeEngine):
        """L13 / L13a / L15: while honest writers run at once (``honest_writers``), a reader pages through the tail
        a few facts at a time; with what it reads once they are done, it has every fact exactly once and, per
        entity, the versions 1..n in order. On PostgreSQL writers' transaction ids are assigned at their first
        write, not at commit, so one entity's facts were written by transactions whose ids run the other way: the
        figure printed counts such pairs."""
        seen: list[Fact] = []
        writing = True

        async def follow() -> None:
            cursor = Cursor()
            while True:
                page, cursor = await read_tail(book, cursor, limit=3)
                seen.extend(page)
                if not page:
                    if not writing:
                        return
                    await asyncio.sleep(0.005)

        reader = asyncio.create_task(follow())
        try:
            await self.honest_writers(book, more_engines)
        finally:
            writing = False
        await reader
        written = [f for key in await all_entities(book) for f in await history(book, *key)]
        assert sorted(ids(seen)) == sorted(ids(written)), "every committed fact, once"
        versions: dict[tuple[str, str], list[int]] = {}
        for f in seen:
            versions.setdefault((f.entity_type, f.entity_id), []).append(f.version)
        wrong = {k: v for k, v in versions.items() if v != list(range(1, len(v) + 1))}
        assert not wrong, f"the tail gave these entities' versions out of order: {wrong}"
        writer: dict[str, int] = {}
        if book.dialect == "postgresql":  # each fact's inserting transaction, as the row's system column keeps it
            async with book.read() as conn:
                writer = dict((await conn.execute(sa.text("SELECT id, xmin::text::bigint FROM status_transitions"))).all())
        inverted = sum(1 for f in written for g in written if (g.entity_type, g.entity_id) == (f.entity_type,
                       f.entity_id) and g.version < f.version and writer.get(g.id, 0) > writer.get(f.id, 0))
        print(f"\n{book.dialect}: the tail gave {len(seen)} facts of {len(versions)} entities in pages of 3, each "
              f"entity's in version order; {inverted} pairs of one entity's facts whose writers' ids run the other "
              "way")


class ConcurrentWriterCases(ConcurrentTailCases):
    """Backends where many transactions write at once (PostgreSQL); the tail's cases of them are ConcurrentTailCases."""

    async def test_racers_released_together_on_separate_connections(self, book: Book, more_engines: MakeEngine):
        """L14: 20 connections each hold an open transaction, then all fire different commands on one row at
        once; exactly one is applied and exactly one fact follows the creation."""
        await new_task(book, "t1")
        racer = Book(more_engines(), book.registry, book.clock)
        barrier = asyncio.Barrier(RaceCases.RACERS)

        async def race(n: int):
            async with racer.begin() as tx:
                assert tx.conn is not None
                await tx.conn.execute(sa.select(1))
                await barrier.wait()
                if n % 2:
                    return await transition(tx, "task", "t1", "rejected", expected="open", reason=REFUSED,
                                            actor=SYSTEM, on_conflict="return")
                return await start(tx, "t1", on_conflict="return")

        outcomes = await asyncio.gather(*(race(n) for n in range(RaceCases.RACERS)))
        assert Counter(o.kind for o in outcomes) == {"applied": 1, "conflict": RaceCases.RACERS - 1}
        facts = await history(book, "task", "t1")
        assert len(facts) == 2 and facts[1].id == next(o.fact_id for o in outcomes if o.applied)
        assert (await verify(book)).ok

    async def test_a_seq_drawn_before_another_commit_is_honest(self, book: Book, more_engines: MakeEngine):
        """L12d: T2 writes A (its seq drawn), T1 writes B and commits, T2 then waits for and writes B, and commits:
        across entities the seqs committed out of order (A's is below T1's B), within B they rise with the
        version — the row lock made T2 draw its seq for B after T1 committed. verify finds nothing."""
        await new_task(book, "a")
        await new_task(book, "b")
        early, late = Book(more_engines(), book.registry, book.clock), Book(more_engines(), book.registry, book.clock)
        async with early.begin() as t2:
            on_a = await start(t2, "a")
            async with late.begin() as t1:
                first_on_b = await start(t1, "b")
                waiting = asyncio.create_task(transition(t2, "task", "b", "open", expected="working",
                                                         reason=RELEASED, actor=SYSTEM))
                await asyncio.sleep(0.3)
                assert not waiting.done(), "T2 must wait for T1's row lock on b"
            second_on_b = await waiting  # T1 committed: T2 goes on with b's new head
            assert second_on_b.applied
        seq = {f.id: f.seq for key in (("task", "a"), ("task", "b")) for f in await history(book, *key)}
        assert seq[on_a.fact_id] < seq[first_on_b.fact_id] < seq[second_on_b.fact_id]
        report = await verify(book)
        assert report.ok, report.findings

    async def test_a_checkpoint_waits_for_a_writer_holding_a_lower_seq(self, book: Book, more_engines: MakeEngine):
        """A2 / L12d: a writer drew its seq (for a) before another writer's fact (b) committed with a higher one. A
        checkpoint taken meanwhile waits for the first writer to end before it reads, so its heads are final: once
        both committed, the honest history verifies against it."""
        await new_task(book, "a")
        await new_task(book, "b")
        slow = Book(more_engines(), book.registry, book.clock)
        async with slow.begin() as tx:
            await start(tx, "a")
            await start(book, "b")
            taking = asyncio.create_task(checkpoint(book))
            await asyncio.sleep(0.3)
            assert not taking.done(), "the checkpoint must wait for the open writer below its seq"
        body = await taking
        report = await verify(book, checkpoint=body)
        assert report.ok, report.findings
        assert body["facts"] == 4

    async def test_an_export_waits_for_a_writer_holding_a_lower_seq(self, book: Book, more_engines: MakeEngine,
                                                                     tmp_path: Path):
        """A3 / L12d: a writer drew its seq (for a) before another writer's fact (b) committed with a higher one. An
        export taken meanwhile waits for the first writer to end before it reads, so the bundle's checkpoint is
        final: once both committed, the honest database verifies against it, and the bundle verifies."""
        await new_task(book, "a")
        await new_task(book, "b")
        slow = Book(more_engines(), book.registry, book.clock)
        async with slow.begin() as tx:
            await start(tx, "a")
            await start(book, "b")
            exporting = asyncio.create_task(export_bundle(book, tmp_path / "bundle"))
            await asyncio.sleep(0.3)
            assert not exporting.done(), "the export must wait for the open writer below its seq"
        manifest = await exporting
        body = json.loads((tmp_path / "bundle" / CHECKPOINT_FILE).read_text())["checkpoint"]
        report = await verify(book, checkpoint=body)
        assert report.ok, report.findings
        assert manifest["facts"] == body["facts"] == 4
        assert verify_bundle(tmp_path / "bundle").ok

    async def test_the_switch_over_waits_for_a_writer_holding_a_lower_seq(self, book: Book, more_engines: MakeEngine):
        """A1 / L12d: keying the chain while a writer holds a seq below the highest committed one waits for it, so
        the recorded root covers its fact: the honest history verifies with the key."""
        await new_task(book, "a")
        await new_task(book, "b")
        slow = Book(more_engines(), book.registry, book.clock)
        keyed = book.with_chain_key(ChainKey(b"a key for the switch-over case"))
        async with slow.begin() as tx:
            await start(tx, "a")
            await start(book, "b")
            keying = asyncio.create_task(key_chain(keyed))
            await asyncio.sleep(0.3)
            assert not keying.done(), "the switch-over must wait for the open writer below its seq"
        switch = await keying
        assert switch.facts == 4
        await transition(keyed, "task", "b", "open", expected="working", reason=RELEASED, actor=SYSTEM)
        report = await verify(keyed)
        assert report.ok, report.findings

class SerialWriterCases:
    """Backends with one writer at a time, where the others wait (SQLite with BEGIN IMMEDIATE)."""

    async def test_writer_waits_for_a_held_lock_then_applies(self, book: Book, more_engines: MakeEngine):
        """L14 / L15: while another connection holds the write lock for about a second, a transition waits
        (busy timeout) instead of failing with 'database is locked', then applies."""
        await new_task(book, "t1")
        holder_engine = more_engines()
        async with holder_engine.connect() as conn:
            await conn.begin()  # BEGIN IMMEDIATE: the write lock is ours until commit
            await conn.execute(sa.text("SELECT 1"))
            waiting = asyncio.create_task(start(book, "t1"))
            await asyncio.sleep(1.0)
            assert not waiting.done(), "the transition must wait for the lock holder"
            await conn.commit()
        outcome = await waiting
        assert outcome.applied and (await row(book, "t1"))["status"] == "working"
