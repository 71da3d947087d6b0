"""K4: every check the kit's machine runs fails on a database broken behind the engine, with a message naming
the entity (issue 25 part 10). Each invariant of ``Checks`` (lifecycle/testing/checks.py) and the machine's
``audit`` rule is called on a database the machine built — then damaged with plain SQL, the way a buggy
application or a careless operator would; an untouched database passes every one of them.

The machine is built outside Hypothesis and driven through its own helpers (``create_one``, ``issue``), so
the history is known: ticket ``t-1`` open -> review -> done (three facts, keys ``k-2`` and ``k-3``), ticket
``t-2`` open -> review (two facts).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect, create_schema, reset_schema
from statebook.lifecycle import Actor, Book, FakeClock, Lifecycle, Registry, edges, managed_table
from statebook.lifecycle.facts import Fact, fact_hash, facts_table
from statebook.lifecycle.testing import LifecycleMachine, TransitionCmd

META = sa.MetaData()
"""Apart from statebook's MetaData: the schema helpers never see the test table."""

tickets = managed_table(
    "kit_invariant_tickets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("assignee", sa.Text, nullable=True),
    meta=META,
)

TICKET = Lifecycle(
    entity_type="ticket",
    table=tickets,
    statuses=("open", "review", "done"),
    initial={"open"},
    terminal={"done"},
    edges=(*edges("open", "review", patch="assignee"), *edges("review", "open"), *edges("review", "done"),
           *edges("done", "open", actors="operator")),
    patch_fields={"assignee"},
    reason_prefixes={"ticket"},
    reasons={"ticket.open.filed", "ticket.review.asked", "ticket.open.returned", "ticket.done.closed",
             "ticket.open.reopened", "ticket.purged.retention"},
)
REGISTRY = Registry([TICKET]).seal()
SYSTEM = Actor("system", "kit")


class Kit(LifecycleMachine):
    """The kit's machine on ``ticket``, on the database ``url`` names."""

    registry = REGISTRY
    url = ""

    async def make_book(self) -> Book:
        engine = connect(self.url)
        await create_schema(engine, FakeClock(), registry=REGISTRY)
        if not self.url.startswith("sqlite"):
            await reset_schema(engine)
            async with engine.begin() as conn:
                await conn.execute(sa.delete(tickets))
        return Book(engine, REGISTRY, FakeClock())


def move(m: Kit, entity_id: str, source: str, target: str, reason: str, key: str, **patch: Any) -> None:
    m._step()
    out = m.issue("transition", TransitionCmd("ticket", entity_id, target, reason, "", SYSTEM, (source,),
                                              patch=patch, idempotency_key=key))
    assert out is not None and out.applied


@pytest.fixture
def machine(backend: str, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kit]:
    """The machine after the two tickets' histories, at a step that wrote nothing; every check passes."""
    from statebook.lifecycle.testing import machine as kit_machine

    monkeypatch.setattr(kit_machine, "event", lambda *a, **k: None)  # Hypothesis's events need a running test
    m = type("OnDb", (Kit,), {"url": db_url})()
    try:
        for entity_id in ("t-1", "t-2"):
            m._step()
            m.create_one(TICKET, entity_id, "open", "ticket.open.filed", {"title": "fix it", "assignee": None})
            m.clock.advance(1)
            move(m, entity_id, "open", "review", "ticket.review.asked", f"k-2-{entity_id}", assignee="ana")
        m.clock.advance(1)
        move(m, "t-1", "review", "done", "ticket.done.closed", "k-3")
        m._step()
        for check in CHECKS:
            getattr(m, check)()
        m.snap = None
        yield m
    finally:
        m.teardown()
        if backend == "postgres":
            asyncio.run(_restore_postgres(db_url))


async def _restore_postgres(url: str) -> None:
    engine = connect(url)
    try:
        await reset_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(META.drop_all)
            await conn.run_sync(lambda c: IDEMPOTENCY_INDEX.create(c, checkfirst=True))
    finally:
        await engine.dispose()


IDEMPOTENCY_INDEX = next(i for i in facts_table.indexes if i.name == "uq_fact_idempotency")

CHECKS = ("row_is_fold_of_facts", "facts_follow_declared_edges", "step_wrote_what_the_model_predicted",
          "versions_step_by_one", "facts_form_a_hash_chain", "terminal_statuses_left_only_by_gated_edges",
          "idempotency_keys_used_once", "model_matches_database", "audit")
"""Every check the kit ships: the invariants of ``Checks`` and the ``audit`` rule (verify)."""


# -- damage, done behind the engine -----------------------------------------------------------------

def facts(m: Kit, entity_id: str) -> list[Fact]:
    return m.snapshot().facts[("ticket", entity_id)]


def sql(m: Kit, *statements: Any) -> None:
    async def go() -> None:
        async with m.book.engine.begin() as conn:
            for statement in statements:
                await conn.execute(statement)

    m.run(go())
    m.snap = None


def update_fact(m: Kit, fact: Fact, rehash: bool = False, **values: Any) -> None:
    """Change a fact's columns; ``rehash``: recompute its own hash too (and move its row's head with it)."""
    changed = dataclasses.replace(fact, **values)
    statements = []
    if rehash:
        values["hash"] = fact_hash(changed.content(), changed.prev_hash)
        statements.append(sa.update(tickets).where(tickets.c.id == fact.entity_id, tickets.c.chain_hash == fact.hash)
                          .values(chain_hash=values["hash"]))
    sql(m, sa.update(facts_table).where(facts_table.c.id == fact.id).values(**values), *statements)


def update_row(m: Kit, entity_id: str, **values: Any) -> None:
    sql(m, sa.update(tickets).where(tickets.c.id == entity_id).values(**values))


def second_fact_wrong_prev_hash(m: Kit) -> None:
    """Issue 25's case: t-2's second (last) fact names a wrong previous hash; its own hash is recomputed and the
    row's head follows it, so only the link to the first fact is broken."""
    update_fact(m, facts(m, "t-2")[1], rehash=True, prev_hash="0" * 64)


def edited_reason(m: Kit) -> None:
    update_fact(m, facts(m, "t-1")[1], reason_summary="nothing happened")


def older_than_predecessor(m: Kit) -> None:
    first, second = facts(m, "t-2")
    update_fact(m, second, rehash=True, at=first.at - 60)


def row_off_the_head(m: Kit) -> None:
    update_row(m, "t-2", chain_hash="f" * 64)


def data_column_changed(m: Kit) -> None:
    update_row(m, "t-1", title="changed behind the engine")


def status_changed(m: Kit) -> None:
    update_row(m, "t-1", status="review")


def undeclared_move(m: Kit) -> None:
    update_fact(m, facts(m, "t-2")[1], status="done", previous_status="open")


def created_in_review(m: Kit) -> None:
    update_fact(m, facts(m, "t-2")[0], status="review")


def fact_appended(m: Kit) -> None:
    """A fact written by plain SQL at a step where the machine wrote nothing (a copy of t-2's last, version 3)."""
    last = facts(m, "t-2")[-1]
    row = {c: getattr(last, c) for c in facts_table.c.keys() if c not in ("seq", "tx_id") and hasattr(last, c)}
    row.update(id="f" * 32, prev_fact_id=last.id, prev_hash=last.hash, version=3, idempotency_key=None,
               previous_status="review", status="open")
    sql(m, sa.insert(facts_table).values(row))


def row_version_bumped(m: Kit) -> None:
    update_row(m, "t-1", version=7)


def fact_version_skipped(m: Kit) -> None:
    update_fact(m, facts(m, "t-1")[2], version=5)


def terminal_left_ungated(m: Kit) -> None:
    """t-1's last fact rewritten as a move out of ``done`` by a system actor (done -> open needs an operator)."""
    update_fact(m, facts(m, "t-1")[2], previous_status="done", status="open", actor_type="system")


def key_used_twice(m: Kit) -> None:
    """The unique index that stops it dropped first (a database set up by hand without it)."""
    sql(m, sa.text("DROP INDEX uq_fact_idempotency"))
    update_fact(m, facts(m, "t-1")[2], idempotency_key="k-2-t-1")


def row_deleted(m: Kit) -> None:
    sql(m, sa.delete(tickets).where(tickets.c.id == "t-2"))


def row_inserted(m: Kit) -> None:
    row = {c: v for c, v in m.snapshot().rows[("ticket", "t-2")].items()}
    sql(m, sa.insert(tickets).values({**row, "id": "ghost"}))


DAMAGE: list[Any] = [
    pytest.param("facts_form_a_hash_chain", second_fact_wrong_prev_hash, "t-2", "breaks the chain", id="chain-link"),
    pytest.param("facts_form_a_hash_chain", edited_reason, "t-1", "does not match its hash", id="chain-hash"),
    pytest.param("facts_form_a_hash_chain", older_than_predecessor, "t-2", "older than its predecessor",
                 id="chain-time"),
    pytest.param("facts_form_a_hash_chain", row_off_the_head, "t-2", "row is not at the chain's head", id="chain-head"),
    pytest.param("row_is_fold_of_facts", data_column_changed, "t-1", "row != fold(facts)", id="fold-data"),
    pytest.param("row_is_fold_of_facts", status_changed, "t-1", "row != fold(facts)", id="fold-status"),
    pytest.param("facts_follow_declared_edges", undeclared_move, "t-2", "follows no declared edge", id="edge"),
    pytest.param("facts_follow_declared_edges", created_in_review, "t-2", "created in non-initial status",
                 id="edge-initial"),
    pytest.param("step_wrote_what_the_model_predicted", data_column_changed, "t-1",
                 "the row changed although nothing applied", id="step-row"),
    pytest.param("step_wrote_what_the_model_predicted", fact_appended, "t-2", "1 new fact(s), the model expects 0",
                 id="step-fact"),
    pytest.param("versions_step_by_one", row_version_bumped, "t-1", "version 7 with 3 facts", id="version-row"),
    pytest.param("versions_step_by_one", fact_version_skipped, "t-1", "versions [1, 2, 5]", id="version-facts"),
    pytest.param("terminal_statuses_left_only_by_gated_edges", terminal_left_ungated, "t-1",
                 "left terminal 'done' for 'open' as 'system'", id="terminal"),
    pytest.param("idempotency_keys_used_once", key_used_twice, "t-1", "['k-2-t-1'] wrote more than one fact",
                 id="idempotency"),
    pytest.param("model_matches_database", status_changed, "t-1", "the database says 'review', the model 'done'",
                 id="model-status"),
    pytest.param("model_matches_database", data_column_changed, "t-1", "(database, model) differ", id="model-data"),
    pytest.param("model_matches_database", row_deleted, "t-2", "the row is missing", id="model-row-missing"),
    pytest.param("model_matches_database", row_inserted, "ghost", "rows nobody created", id="model-row-unknown"),
    pytest.param("audit", data_column_changed, "t-1", "row_mismatch", id="audit"),
]


def test_every_check_the_kit_ships_is_damaged_here():
    """K4: the list below covers every invariant the machine runs, and its verify rule."""
    from statebook.lifecycle.testing.checks import Checks

    invariants = {n for n, f in vars(Checks).items() if hasattr(f, "hypothesis_stateful_invariant")}
    assert invariants | {"audit"} == set(CHECKS)
    assert {p.values[0] for p in DAMAGE} == set(CHECKS)


@pytest.mark.parametrize("check, damage, entity_id, says", DAMAGE)
def test_a_check_fails_on_a_damaged_database_naming_the_entity(machine: Kit, check: str,
                                                               damage: Callable[[Kit], None], entity_id: str,
                                                               says: str):
    """K4: the damaged database fails the check; its message names the entity and what is wrong."""
    damage(machine)
    with pytest.raises(AssertionError) as failure:
        getattr(machine, check)()
    message = str(failure.value)
    assert says in message, message
    assert repr(entity_id) in message or f'"{entity_id}"' in message, message


# -- the storage cases (lifecycle/testing/cases.py) on a database that breaks what they check ----------------

LINK_BROKEN = {
    "sqlite": ["CREATE TRIGGER kit_break AFTER INSERT ON status_transitions WHEN NEW.version = 2 "
               "BEGIN UPDATE status_transitions SET prev_hash = '0' WHERE id = NEW.id; END"],
    "postgres": ["CREATE FUNCTION kit_break() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "UPDATE status_transitions SET prev_hash = '0' WHERE id = NEW.id; RETURN NULL; END $$",
                 "CREATE TRIGGER kit_break AFTER INSERT ON status_transitions FOR EACH ROW "
                 "WHEN (NEW.version = 2) EXECUTE FUNCTION kit_break()"],
}
"""A database that rewrites the link of every second fact as it is written."""

ROW_BROKEN = {
    "sqlite": ["CREATE TRIGGER kit_break AFTER UPDATE OF status ON conformance_tasks "
               "BEGIN UPDATE conformance_tasks SET owner = 'mallory' WHERE id = NEW.id; END"],
    "postgres": ["CREATE FUNCTION kit_break() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "UPDATE conformance_tasks SET owner = 'mallory' WHERE id = NEW.id; RETURN NULL; END $$",
                 "CREATE TRIGGER kit_break AFTER UPDATE OF status ON conformance_tasks FOR EACH ROW "
                 "WHEN (NEW.owner IS DISTINCT FROM 'mallory') EXECUTE FUNCTION kit_break()"],
}
"""A database that rewrites a data column whenever the engine moves a row."""

CASE_BREAKS = [
    pytest.param("ChainCases", "test_facts_form_a_hash_chain", LINK_BROKEN, id="chain-link"),
    pytest.param("ChainCases", "test_clean_database_verifies", LINK_BROKEN, id="verify-link"),
    pytest.param("AtomicityCases", "test_applied_transition_appends_a_fact_and_projects_the_row", LINK_BROKEN,
                 id="transition-link"),
    pytest.param("AtomicityCases", "test_applied_transition_appends_a_fact_and_projects_the_row", ROW_BROKEN,
                 id="transition-row"),
    pytest.param("ChainCases", "test_clean_database_verifies", ROW_BROKEN, id="verify-row"),
]


@pytest.mark.parametrize("cases, case, breaking", CASE_BREAKS)
async def test_a_storage_case_fails_on_a_database_that_breaks_it(backend: str, db_url: str, cases: str, case: str,
                                                                 breaking: dict[str, list[str]]):
    """K4: the storage cases users run on their own database fail when that database changes what the engine
    wrote (a trigger rewrites a fact's link, or a row's column); on an untouched database they pass."""
    from statebook.adapters.db import open_book
    from statebook.lifecycle.testing import cases as kit_cases

    suite = getattr(kit_cases, cases)()
    book = await open_book(db_url, registry=kit_cases.conformance_registry(), clock=FakeClock())
    fixtures = kit_cases.StorageFixtures()
    try:
        await fixtures.empty_book(book)
        await getattr(suite, case)(book)  # passes as the database stands
        await fixtures.empty_book(book)
        async with book.engine.begin() as conn:
            for statement in breaking[backend]:
                await conn.exec_driver_sql(statement)
        with pytest.raises(AssertionError):
            await getattr(suite, case)(book)
    finally:
        async with book.engine.begin() as conn:  # CASCADE: the function's trigger goes with it
            await conn.exec_driver_sql("DROP FUNCTION IF EXISTS kit_break() CASCADE" if backend == "postgres"
                                       else "DROP TRIGGER IF EXISTS kit_break")
        await fixtures.empty_book(book)
        await book.engine.dispose()
