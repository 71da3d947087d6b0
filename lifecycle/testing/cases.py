"""Storage conformance cases a user subclasses to check their own database set-up (``statebook[testing]``).

A team runs these against the database it deploys — its PostgreSQL with its roles, extensions and pooler,
its SQLite file with its pragmas — the way eventsourcing ships recorder test cases: subclass
:class:`StorageConformance`, say how to open a Book, and pytest collects every case::

    from statebook.adapters.db import open_book
    from statebook.lifecycle.testing.cases import StorageConformance

    class TestOurPostgres(StorageConformance):
        async def make_book(self, registry, clock):
            return await open_book(os.environ["SCRATCH_PG_URL"], registry=registry, clock=clock)

``make_book`` must return a Book on that storage with statebook's schema created for ``registry`` (as
``open_book`` does); it is called once per test, and again by the cases that need more connections. The
cases write through the conformance lifecycle ``task`` (its own table, ``conformance_tasks``) and delete
those rows and their facts before and after each test: point them at a scratch database, not production.

The cases are the storage-level part of statebook's own conformance suite (tests/conformance), one copy:
a guarded transition commits row and fact together, a conflict writes nothing, racing claimants on
separate connections — exactly one wins, idempotency keys, the caller's rollback, the hash chain and
verify, the input bounds, and the storage port (every member implemented, ``ids_in`` and ``lock_rows`` run).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from statebook.lifecycle import (
    Actor,
    Book,
    Clock,
    FakeClock,
    Lifecycle,
    Outcome,
    Reason,
    Registry,
    TransitionConflict,
    create,
    edges,
    history,
    managed_table,
    purge,
    replay,
    transition,
    verify,
)
from statebook.lifecycle.errors import ConstraintViolation, IdempotencyMismatch, InvalidArgument, StatebookError
from statebook.lifecycle.facts import GENESIS, fact_hash, facts_table
from statebook.lifecycle.queries import ids_in, lock_rows
from statebook.lifecycle.replay import read_row
from statebook.lifecycle.store import missing

__all__ = [
    "AtomicityCases", "ChainCases", "ClaimCases", "ConflictCases", "IdempotencyCases", "InputBoundCases",
    "PortCases", "StorageConformance", "StorageFixtures", "TASK", "conformance_registry",
]

# -- the conformance lifecycle ------------------------------------------------------------------

TASK_META = sa.MetaData()
"""Apart from statebook's MetaData: the adapters' schema helpers never see the task table."""

TASK_STATUSES = ("open", "working", "blocked", "done", "rejected")

tasks = managed_table(
    "conformance_tasks",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("owner", sa.Text, nullable=True),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("labels", sa.JSON, nullable=False),
    sa.Column("dedup_key", sa.Text, nullable=True, unique=True),
    sa.Column("score", sa.Float, nullable=True),  # a data column that is NOT a patch field
    meta=TASK_META,
)

TASK_REASONS = frozenset(
    {
        "task.open.created",
        "task.working.started",
        "task.working.retried",
        "task.blocked.waiting",
        "task.done.finished",
        "task.rejected.refused",
        "task.open.released",
        "task.open.reopened",
        "task.purged.cleanup",
    }
)

TASK = Lifecycle(
    entity_type="task",
    table=tasks,
    statuses=TASK_STATUSES,
    initial={"open"},
    terminal={"done", "rejected"},
    edges=(
        *edges("open", "working", "rejected"),
        *edges("working", "working", guard="attempt"),
        *edges("working", "blocked", "done", "open"),
        *edges("blocked", "working", "rejected"),
        *edges("rejected", "open", actors="operator", patch="note"),
    ),
    patch_fields={"attempt", "owner", "note", "labels"},
    reason_prefixes={"task"},
    reasons=TASK_REASONS,
    description="A unit of work used by the conformance suite.",
)
"""The lifecycle the cases drive: a self-edge under a guard, a gated exit from a terminal status, JSON."""

SYSTEM = Actor("system", "worker-1")
OPERATOR = Actor("operator", "alice")
CREATED = Reason("task.open.created", "filed by the suite", evidence=("ticket:1",))
STARTED = Reason("task.working.started", "picked up")
RETRIED = Reason("task.working.retried", "picked up again")
BLOCKED = Reason("task.blocked.waiting", "waiting on a dependency")
FINISHED = Reason("task.done.finished", "all good")
REFUSED = Reason("task.rejected.refused", "out of scope")
RELEASED = Reason("task.open.released", "put back")
REOPENED = Reason("task.open.reopened", "operator reopened it")
PURGED = Reason("task.purged.cleanup", "retention")


def conformance_registry() -> Registry:
    """A sealed registry holding only ``task``: what :class:`StorageFixtures` opens books with by default."""
    return Registry([TASK]).seal()


def task_values(title: str = "write the spec", **overrides: Any) -> dict[str, Any]:
    """Every data column of a task, so the fold of its facts equals its whole row."""
    values: dict[str, Any] = {
        "title": title, "owner": None, "attempt": 0, "note": None, "labels": ["docs"], "dedup_key": None,
        "score": 1.5,
    }
    values.update(overrides)
    return values


async def new_task(book: Book, entity_id: str | None = None, **overrides: Any) -> Outcome:
    """Create a task (status ``open``) with :func:`task_values`."""
    outcome = await create(book, "task", values=task_values(**overrides), status="open", reason=CREATED,
                           actor=SYSTEM, entity_id=entity_id, metadata={"source": "suite"})
    assert outcome.applied
    return outcome


async def start(book: Book, entity_id: str, *, attempt: int = 0, **kw: Any) -> Outcome:
    """open -> working, bumping attempt under a guard on its current value."""
    return await transition(book, "task", entity_id, "working", expected="open", guards={"attempt": attempt},
                            patch={"attempt": attempt + 1}, reason=STARTED, actor=SYSTEM, **kw)


async def walked(book: Book, entity_id: str) -> None:
    """A task with four facts: open -> working -> blocked -> working."""
    await new_task(book, entity_id)
    await start(book, entity_id)
    await transition(book, "task", entity_id, "blocked", expected="working", reason=BLOCKED, actor=SYSTEM)
    await transition(book, "task", entity_id, "working", expected="blocked", reason=STARTED, actor=SYSTEM)


def kinds_for(report: Any, entity_id: str) -> set[str]:
    """The kinds of verify's findings on one entity."""
    return {f.kind for f in report.findings if f.entity_id == entity_id}


async def count_facts(book: Book, entity_id: str | None = None) -> int:
    """The number of facts (of one entity, or of all)."""
    query = sa.select(sa.func.count()).select_from(facts_table)
    if entity_id is not None:
        query = query.where(facts_table.c.entity_id == entity_id)
    async with book.engine.connect() as conn:
        return (await conn.execute(query)).scalar_one()


async def row(book: Book, entity_id: str, entity_type: str = "task") -> dict[str, Any] | None:
    """The entity's current row, or None."""
    return await read_row(book, entity_type, entity_id)


async def present(book: Book, entity_id: str, entity_type: str = "task") -> dict[str, Any]:
    """The entity's current row; fails the case when there is none."""
    found = await read_row(book, entity_type, entity_id)
    assert found is not None, f"{entity_type} {entity_id} does not exist"
    return found


async def execute(book: Book, statement: Any) -> Any:
    """Run raw SQL in its own transaction: how the cases tamper with rows and facts."""
    async with book.engine.begin() as conn:
        return await conn.execute(statement)


def deep(levels: int) -> Any:
    """A JSON value nested ``levels`` lists deep."""
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
"""(column, value, rule): one value each column of ``task`` must refuse, before any backend sees it."""


class Boom(Exception):
    """Raised by a caller after its transition, to prove the rollback."""


MoreBooks = Callable[[], Awaitable[Book]]


# -- the fixtures a subclass configures -----------------------------------------------------------

class StorageFixtures:
    """``clock``, ``book`` and ``more_books`` for the cases, from :meth:`make_book`, which a subclass provides."""

    async def make_book(self, registry: Registry, clock: Clock) -> Book:
        """A Book on the storage under test, its schema created for ``registry`` (override this)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define 'async def make_book(self, registry, clock)' returning a Book on the "
            "database to check, e.g. 'return await open_book(url, registry=registry, clock=clock)'"
        )

    async def close_book(self, book: Book) -> None:
        """Release what :meth:`make_book` opened (default: dispose of its engine)."""
        await book.engine.dispose()

    def conformance_registry(self) -> Registry:
        """The registry the books are opened with; it must hold :data:`TASK` (default: nothing else)."""
        return conformance_registry()

    async def empty_book(self, book: Book) -> None:
        """Delete the conformance tasks and their facts; run before and after each test."""
        async with book.engine.begin() as conn:
            await conn.execute(sa.delete(facts_table).where(facts_table.c.entity_type == TASK.entity_type))
            await conn.execute(sa.delete(tasks))

    @pytest.fixture
    def clock(self) -> FakeClock:
        """The clock of every book of the test."""
        return FakeClock()

    @pytest_asyncio.fixture
    async def book(self, clock: FakeClock) -> AsyncIterator[Book]:
        """A Book from :meth:`make_book`, with no conformance task or fact in it."""
        book = await self.make_book(self.conformance_registry(), clock)
        try:
            await self.empty_book(book)
            yield book
            await self.empty_book(book)
        finally:
            await self.close_book(book)

    @pytest_asyncio.fixture
    async def more_books(self, book: Book, clock: FakeClock) -> AsyncIterator[MoreBooks]:
        """Open another Book on the same storage (its own engine, its own connections), closed after the test."""
        made: list[Book] = []

        async def make() -> Book:
            made.append(await self.make_book(book.registry, clock))
            return made[-1]

        yield make
        for other in made:
            await self.close_book(other)


# -- the cases ------------------------------------------------------------------------------------

class AtomicityCases:
    """A command writes its row and its fact together, or neither; joined to the caller's transaction."""

    async def test_create_writes_the_row_and_its_first_fact(self, book: Book) -> None:
        """L5 / L7 / L8: create inserts the full row and one creation fact (previous status NULL) together."""
        outcome = await new_task(book, "t1")
        assert (outcome.kind, outcome.status, outcome.version) == ("applied", "open", 1)
        facts = await history(book, "task", "t1")
        assert len(facts) == 1
        first = facts[0]
        assert first.id == outcome.fact_id
        assert (first.previous_status, first.status, first.version) == (None, "open", 1)
        assert (first.prev_fact_id, first.prev_hash) == ("", "")
        assert (first.actor_type, first.actor_id) == ("system", "worker-1")
        assert (first.reason_code, first.reason_summary) == ("task.open.created", "filed by the suite")
        assert list(first.evidence_refs) == ["ticket:1"]
        assert first.metadata == {"source": "suite"}
        assert first.patch == {**task_values(), "id": "t1"}, "a creation fact records every data column"
        assert first.policy_fingerprint == TASK.fingerprint
        assert first.hash == fact_hash(first.content(), "")
        current = await row(book, "t1")
        assert current == {**task_values(), "id": "t1", "status": "open", "version": 1,
                           "updated_at": book.clock.now(), "status_reason_code": "task.open.created",
                           "status_reason_summary": "filed by the suite", "last_fact_id": first.id,
                           "chain_hash": first.hash}
        assert (await verify(book)).ok

    async def test_applied_transition_appends_a_fact_and_projects_the_row(self, book: Book) -> None:
        """L6 / L7: an applied transition bumps the version, patches declared columns and records why."""
        await new_task(book, "t1")
        clock = book.clock
        assert isinstance(clock, FakeClock), "the cases' books run on the clock fixture"
        clock.advance(5)
        outcome = await transition(book, "task", "t1", "working", expected="open", guards={"attempt": 0},
                                   patch={"attempt": 1, "owner": "bob"}, reason=STARTED, actor=SYSTEM,
                                   metadata={"host": "h1"})
        assert (outcome.kind, outcome.status, outcome.version) == ("applied", "working", 2)
        first, second = await history(book, "task", "t1")
        assert (second.prev_fact_id, second.prev_hash) == (first.id, first.hash)
        assert (second.previous_status, second.status, second.version) == ("open", "working", 2)
        assert second.patch == {"attempt": 1, "owner": "bob"} and second.metadata == {"host": "h1"}
        assert second.at == book.clock.now()
        current = await present(book, "t1")
        assert current["attempt"] == 1 and current["owner"] == "bob" and current["score"] == 1.5
        assert current["last_fact_id"] == second.id and current["chain_hash"] == second.hash
        assert current == await replay(book, "task", "t1")

    async def test_caller_transaction_that_fails_rolls_back_row_and_fact(self, book: Book) -> None:
        """L5: a transition joined to the caller's transaction is undone with it, with the caller's own write."""
        await new_task(book, "t1")
        before = await row(book, "t1")
        with pytest.raises(Boom):
            async with book.begin() as tx:
                await tx.conn.execute(sa.update(tasks).where(tasks.c.id == "t1").values(score=99.0))
                assert (await start(tx, "t1")).applied
                raise Boom
        assert await row(book, "t1") == before
        assert await count_facts(book) == 1
        async with book.begin() as tx:
            await tx.conn.execute(sa.update(tasks).where(tasks.c.id == "t1").values(score=99.0))
            await start(tx, "t1")
        after = await present(book, "t1")
        assert (after["status"], after["score"]) == ("working", 99.0)

    async def test_create_and_purge_roll_back_with_the_caller(self, book: Book) -> None:
        """L5: create and purge are atomic with the caller's transaction too."""
        with pytest.raises(Boom):
            async with book.begin() as tx:
                await new_task(tx, "t1")
                raise Boom
        assert await row(book, "t1") is None and await count_facts(book) == 0
        await new_task(book, "t2")
        await transition(book, "task", "t2", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        before = await row(book, "t2")
        with pytest.raises(Boom):
            async with book.begin() as tx:
                assert (await purge(tx, "task", "t2", reason=PURGED, actor=OPERATOR)).applied
                raise Boom
        assert await row(book, "t2") == before and await count_facts(book) == 2

    async def test_failed_fact_append_undoes_the_row_update(self, book: Book) -> None:
        """L5 / L8: when the fact cannot be appended (a planted fork holds its chain slot), the row is not moved."""
        await new_task(book, "t1")
        (first,) = await history(book, "task", "t1")
        planted = {**first.content(), "id": "planted", "previous_status": "open", "status": "rejected",
                   "version": 2, "prev_fact_id": first.id, "prev_hash": first.hash, "hash": "x" * 64}
        await execute(book, sa.insert(facts_table).values(planted))
        before = await row(book, "t1")
        with pytest.raises(ConstraintViolation):  # ours, not the driver's (L18)
            await start(book, "t1")
        assert await row(book, "t1") == before


class ConflictCases:
    """L4: a compare-and-set that does not match is a conflict and writes nothing; a single command raises
    :class:`TransitionConflict` unless it asks for the outcome (``on_conflict="return"``)."""

    async def test_wrong_expected_status_is_a_conflict_that_writes_nothing(self, book: Book) -> None:
        """L4: the compare-and-set fails when the row is not in an expected status; nothing is written."""
        await new_task(book, "t1")
        await start(book, "t1")
        before, facts = await row(book, "t1"), await count_facts(book)
        with pytest.raises(TransitionConflict) as lost:
            await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        assert (lost.value.expected, lost.value.actual, lost.value.version) == (("open",), "working", 2)
        outcome = await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM,
                                   on_conflict="return")
        assert (outcome.kind, outcome.status, outcome.version, outcome.fact_id) == ("conflict", "working", 2, None)
        assert lost.value.outcome == outcome
        assert await row(book, "t1") == before and await count_facts(book) == facts

    async def test_guard_mismatch_is_a_conflict_that_writes_nothing(self, book: Book) -> None:
        """L4: every guard column must equal its expected value, or the command is a conflict."""
        await new_task(book, "t1")
        await start(book, "t1")
        before = await row(book, "t1")
        with pytest.raises(TransitionConflict) as lost:
            await transition(book, "task", "t1", "working", expected="working", guards={"attempt": 0},
                             patch={"attempt": 1}, reason=RETRIED, actor=SYSTEM)
        assert lost.value.guards == ("attempt",) and lost.value.outcome.kind == "conflict"
        stale = await transition(book, "task", "t1", "working", expected="working", guards={"attempt": 0},
                                 patch={"attempt": 1}, reason=RETRIED, actor=SYSTEM, on_conflict="return")
        assert stale.kind == "conflict"
        assert await row(book, "t1") == before and await count_facts(book) == 2
        fresh = await transition(book, "task", "t1", "working", expected="working", guards={"attempt": 1},
                                 patch={"attempt": 2}, reason=RETRIED, actor=SYSTEM)
        assert (fresh.kind, fresh.version) == ("applied", 3)
        assert (await present(book, "t1"))["attempt"] == 2



class IdempotencyCases:
    """L9: a retried command replays its first outcome; a key reused for another command is refused."""

    async def test_idempotent_replay_returns_the_original_outcome(self, book: Book) -> None:
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
    async def test_reused_key_with_another_command_is_an_error(self, book: Book, change: dict[str, Any]) -> None:
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

    async def test_idempotency_keys_are_per_entity_and_only_bound_when_applied(self, book: Book) -> None:
        """L9: a key is scoped to its entity, and a conflicting command does not consume it."""
        await new_task(book, "t1")
        await new_task(book, "t2")
        assert (await start(book, "t1", idempotency_key="k")).applied
        assert not (await start(book, "t2", idempotency_key="k")).replayed
        await new_task(book, "t3")
        missed = await start(book, "t3", attempt=7, idempotency_key="k3", on_conflict="return")
        assert missed.kind == "conflict"
        hit = await start(book, "t3", idempotency_key="k3")
        assert hit.applied and not hit.replayed


class ClaimCases:
    """L14: claimants racing on separate connections — exactly one wins, whatever the backend."""

    RACERS = 20

    async def test_racers_on_one_compare_and_set(self, book: Book, more_books: MoreBooks) -> None:
        """L14: many concurrent identical transitions (each on its own connection): one applied, the rest conflict."""
        await new_task(book, "t1")
        racer = await more_books()
        outcomes = await asyncio.gather(*(start(racer, "t1", on_conflict="return") for _ in range(self.RACERS)))
        assert Counter(o.kind for o in outcomes) == {"applied": 1, "conflict": self.RACERS - 1}
        assert len(await history(book, "task", "t1")) == 2
        assert (await present(book, "t1"))["attempt"] == 1
        assert (await verify(book)).ok

    async def test_keyed_retry_while_the_first_is_uncommitted_replays(self, book: Book, more_books: MoreBooks) -> None:
        """L9 / L14: a keyed command is retried on another connection while the first one's transaction is still
        open, and its target is still one of the command's expected statuses (so a re-read alone would match
        again). When the first commits, the retry is that outcome replayed — never a second fact, never an
        error from the idempotency index."""
        await new_task(book, "t1")

        def keyed(on: Book) -> Coroutine[Any, Any, Outcome]:
            return transition(on, "task", "t1", "working", expected=("open", "working"), guards={"attempt": 0},
                              reason=STARTED, actor=SYSTEM, idempotency_key="k-1")

        holder = await more_books()
        retrier = await more_books()
        async with holder.begin() as tx:
            first = await keyed(tx)
            retry = asyncio.create_task(keyed(retrier))
            await asyncio.sleep(0.3)  # let the retry reach the row (it must wait there, not decide)
            assert not retry.done(), "the retry must wait for the open transaction"
        second = await retry
        assert first.applied and not first.replayed
        assert second.applied and second.replayed and second.fact_id == first.fact_id
        assert len(await history(book, "task", "t1")) == 2
        assert (await verify(book)).ok

    async def test_racing_creates_of_one_id(self, book: Book, more_books: MoreBooks) -> None:
        """L14 / L5: concurrent if_absent creates of one id: one applied, the others conflict, one fact."""
        racer = await more_books()
        outcomes = await asyncio.gather(*(
            create(racer, "task", values=task_values(f"copy {n}"), status="open", reason=CREATED, actor=SYSTEM,
                   entity_id="t1", if_absent=True)
            for n in range(self.RACERS)
        ))
        assert Counter(o.kind for o in outcomes) == {"applied": 1, "conflict": self.RACERS - 1}
        assert len(await history(book, "task", "t1")) == 1
        assert (await verify(book)).ok


class ChainCases:
    """L8 / L12: the history is a hash chain, and verify finds damage done behind the engine."""

    async def test_facts_form_a_hash_chain(self, book: Book) -> None:
        """L8: each fact links to its predecessor by id and hash; the row carries the head of the chain."""
        await walked(book, "t1")
        facts = await history(book, "task", "t1")
        prev_id, prev_hash = GENESIS, GENESIS
        for fact in facts:
            assert (fact.prev_fact_id, fact.prev_hash) == (prev_id, prev_hash)
            assert fact.hash == fact_hash(fact.content(), fact.prev_hash)
            prev_id, prev_hash = fact.id, fact.hash
        current = await present(book, "t1")
        assert (current["last_fact_id"], current["chain_hash"]) == (prev_id, prev_hash)
        assert len({f.hash for f in facts}) == len(facts)

    async def test_clean_database_verifies(self, book: Book) -> None:
        """L12: untouched histories give no findings, and the report counts what it checked."""
        await walked(book, "t1")
        await new_task(book, "t2")
        seen: list[tuple[int, int]] = []
        report = await verify(book, progress=lambda done, total: seen.append((done, total)))
        assert report.ok and report.findings == []
        assert (report.entities, report.facts) == (2, 5)
        assert seen and seen[-1] == (5, 5)
        assert report.to_json()["ok"] is True

    async def test_row_status_changed_behind_the_engine(self, book: Book) -> None:
        """L12: a status written by plain SQL no longer matches the facts: row_mismatch on that entity."""
        await walked(book, "t1")
        await new_task(book, "t2")
        await execute(book, sa.update(tasks).where(tasks.c.id == "t1").values(status="done"))
        report = await verify(book)
        assert kinds_for(report, "t1") == {"row_mismatch"} and kinds_for(report, "t2") == set()
        assert any("'status'" in f.detail for f in report.findings)

    async def test_fact_edited(self, book: Book) -> None:
        """L12: an edited fact (reason summary) no longer matches its hash."""
        await walked(book, "t1")
        victim = (await history(book, "task", "t1"))[1]
        await execute(book, sa.update(facts_table).where(facts_table.c.id == victim.id)
                      .values(reason_summary="nothing happened"))
        report = await verify(book)
        assert [(f.kind, f.fact_id) for f in report.findings] == [("hash_mismatch", victim.id)]

    async def test_middle_fact_deleted(self, book: Book) -> None:
        """L12: deleting a middle fact breaks the chain at its successor."""
        await walked(book, "t1")
        facts = await history(book, "task", "t1")
        await execute(book, sa.delete(facts_table).where(facts_table.c.id == facts[1].id))
        report = await verify(book)
        found = {(f.kind, f.fact_id) for f in report.findings}
        assert ("broken_chain", facts[2].id) in found and ("version_gap", facts[2].id) in found
        # The lost fact's patch (attempt=1) is missing from the fold too; nothing claims a fact was edited.
        assert kinds_for(report, "t1") == {"broken_chain", "version_gap", "row_mismatch"}


class InputBoundCases:
    """L20: values the engine refuses (lifecycle/inputs.py) before any write, whatever the backend would store."""

    async def counts(self, book: Book) -> tuple[int, int]:
        """The number of task rows and of facts in ``book``."""
        async with book.engine.connect() as conn:
            rows = (await conn.execute(sa.select(sa.func.count()).select_from(tasks))).scalar_one()
        return rows, await count_facts(book)

    async def refused(self, book: Book, call: Any, argument: str, rule: str | None = None) -> InvalidArgument:
        """Await ``call``, assert it raises ``InvalidArgument`` about ``argument`` (and ``rule``) and that it wrote
        nothing; return the error.
        """
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
        """A create with a column value of the wrong type or size is refused, naming the column, and writes nothing.
        """
        await self.refused(book, create(book, "task", values=task_values(**{column: value}), status="open",
                                        reason=CREATED, actor=SYSTEM), column, rule)

    async def test_an_id_longer_than_its_column_is_refused_on_every_backend(self, book: Book) -> None:
        # conformance_tasks.id is String(32): PostgreSQL refused 33 characters, SQLite stored them.
        """An id longer than its column is refused on every backend (SQLite would store it); the longest that fits
        is accepted.
        """
        await self.refused(book, create(book, "task", values=task_values(), status="open", reason=CREATED,
                                        actor=SYSTEM, entity_id="x" * 33), "id", "length")
        await new_task(book, "x" * 32)  # the longest id the column holds is fine

    async def test_metadata_beyond_the_books_size_bound_is_refused(self, book: Book) -> None:
        """Metadata larger than the book's JSON size bound is refused; the same metadata under the default bound is
        stored.
        """
        from dataclasses import replace

        from statebook.lifecycle.inputs import Limits

        small = replace(book, limits=Limits(json_bytes=100))
        await self.refused(small, create(small, "task", values=task_values(), status="open", reason=CREATED,
                                         actor=SYSTEM, metadata={"blob": "x" * 200}), "metadata", "size")
        await create(book, "task", values=task_values(), status="open", reason=CREATED, actor=SYSTEM,
                     metadata={"blob": "x" * 200})  # the default bound takes it


class PortCases:
    """L17: the backend implements every member of the storage port's protocols, and the shared query
    functions (``lifecycle/queries.py``) compile and run on it."""

    async def test_the_backend_implements_the_write_port_the_reads_and_the_upkeep(self, book: Book) -> None:
        """The book's backend has every member of ``Store``, ``Reads`` and ``Upkeep``."""
        assert missing(type(book.store)) == [], "lifecycle/store.py lists what a backend implements"

    @pytest.mark.parametrize("lock", [None, "wait", "skip_locked"])
    async def test_ids_in_and_lock_rows_select_the_listed_rows_whatever_the_length(self, book: Book,
                                                                                  lock: Any) -> None:
        """``ids_in`` selects exactly the listed rows for lists of 0 to 700 ids (one statement shape), through the
        store's ``select`` and through SQLAlchemy, under each row lock."""
        for entity_id in ("a", "b", "c"):
            await new_task(book, entity_id)
        query = sa.select(tasks.c.id).where(ids_in(tasks.c.id, "b_ids"))
        store = book.store
        listed = {0: [], 1: ["b"], 3: ["a", "c", "x"], 700: [f"x{i}" for i in range(697)] + ["a", "b", "c"]}
        for ids in listed.values():
            async with store.unit(None) as unit:
                found = await store.select(unit, query, {"b_ids": ids}, lock=lock)
            assert sorted(r["id"] for r in found) == sorted(set(ids) & {"a", "b", "c"})
        async with book.begin() as tx:
            assert tx.conn is not None
            got = await tx.conn.execute(lock_rows(query, lock), {"b_ids": ["c", "a"]})
            assert sorted(r.id for r in got) == ["a", "c"]


class StorageConformance(StorageFixtures, AtomicityCases, ConflictCases, IdempotencyCases, ClaimCases, ChainCases,
                         InputBoundCases, PortCases):
    """Every storage case: subclass it, define :meth:`~StorageFixtures.make_book`, and pytest runs them all
    (the cases carry pytest-asyncio's mark, so a project in its default strict mode runs them too)."""

    pytestmark = pytest.mark.asyncio
