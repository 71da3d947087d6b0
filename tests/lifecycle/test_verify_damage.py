"""L12b: damage of any shape is a finding — verify never raises, and the undamaged entities are still checked.

Hypothesis writes values of every shape the column allows (any JSON value into the JSON columns; text,
numbers, blobs into any column on SQLite, whose columns take any type; right-typed but wrong values on
PostgreSQL) into facts and rows with plain SQL, then runs ``verify``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import sqlalchemy as sa
from conformance.support import BLOCKED, STARTED, SYSTEM, new_task, prepare, start, task_registry, tasks
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from statebook.adapters.db import connect
from statebook.lifecycle import Book, FakeClock, history, transition, verify
from statebook.lifecycle.facts import facts_table

ENTITIES = ("ok-a", "victim", "ok-z")
FACT_COLUMNS = ("patch", "metadata", "evidence_refs", "version", "at", "status", "previous_status", "prev_fact_id",
                "id", "actor_type", "reason_code", "policy_fingerprint", "prev_hash", "hash")
ROW_COLUMNS = ("title", "owner", "attempt", "labels", "score", "version", "updated_at", "last_fact_id", "chain_hash")

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8) | st.sampled_from(
    ["", "open", "working", "blocked", "done", "{}", "[]", '{"attempt": 1}', "null", "1", "not json", "system"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=5,
)
sqlite_values = st.integers(-(2**63), 2**63 - 1) | st.floats() | texts | st.binary(max_size=4)


def pg_value(column: sa.Column) -> st.SearchStrategy[Any]:
    """What a PostgreSQL column of this type accepts (NOT NULL columns never get None)."""
    kind = column.type
    if isinstance(kind, sa.JSON):
        values = json_values
    elif isinstance(kind, sa.Integer):
        values = st.integers(-(2**31), 2**31 - 1)
    elif isinstance(kind, sa.Float):
        values = st.floats()
    else:
        values = texts
    return values if not column.nullable else values | st.none()


@st.composite
def damages(draw: st.DrawFn, backend: str) -> list[tuple[str, int, str, Any]]:
    """One to three writes: ("fact", index of the victim's fact, column, value) or ("row", 0, column, value)."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["fact", "fact", "row"]))
        table = facts_table if where == "fact" else tasks
        column = draw(st.sampled_from(FACT_COLUMNS if where == "fact" else ROW_COLUMNS))
        if backend == "sqlite":
            value = draw(sqlite_values | (json_values.map(json.dumps) if isinstance(table.c[column].type, sa.JSON)
                                          else st.nothing()))
        else:
            value = draw(pg_value(table.c[column]))
        out.append((where, draw(st.integers(0, 3)), column, value))
    return out


async def _stored(conn: Any, table: sa.Table, column: str, key: Any) -> tuple[type, Any]:
    value = (await conn.execute(sa.select(sa.cast(table.c[column], sa.Text) if isinstance(table.c[column].type, sa.JSON)
                                          else table.c[column]).where(key))).scalar()
    return type(value), json.loads(value) if isinstance(table.c[column].type, sa.JSON) and value is not None else value


async def _damage(book: Book, backend: str, damage: list[tuple[str, int, str, Any]]) -> bool:
    """Apply the writes; False when none changed a stored value (or the database refused one)."""
    facts = await history(book, "task", "victim")
    changed = False
    for where, index, column, value in damage:
        table = facts_table if where == "fact" else tasks
        key = table.c.id == (facts[index].id if where == "fact" else "victim")
        try:
            async with book.engine.begin() as conn:
                before = await _stored(conn, table, column, key)
                if backend == "sqlite":  # raw, so the driver stores the value as it is (SQLite takes any type)
                    await conn.exec_driver_sql(f"UPDATE {table.name} SET {column} = ? WHERE id = ?",
                                               (value, facts[index].id if where == "fact" else "victim"))
                else:
                    await conn.execute(sa.update(table).where(key).values({column: value}))
                changed = changed or before != await _stored(conn, table, column, key)
        except (sa.exc.IntegrityError, sa.exc.DataError, sa.exc.ProgrammingError, sa.exc.DBAPIError):
            pass  # a constraint or type the database enforces: not damage it lets through
        if where == "fact" and column == "id":
            facts = await history(book, "task", "victim")
    return changed


async def _run(url: str, backend: str, damage: list[tuple[str, int, str, Any]]) -> None:
    engine = connect(url)
    try:
        clock = FakeClock()
        await prepare(engine, clock)
        book = Book(engine, task_registry(), clock)
        for entity_id in ENTITIES:
            await new_task(book, entity_id)
            await start(book, entity_id)
            await transition(book, "task", entity_id, "blocked", expected="working", reason=BLOCKED, actor=SYSTEM)
            await transition(book, "task", entity_id, "working", expected="blocked", reason=STARTED, actor=SYSTEM)
        assert (await verify(book)).ok
        assume(await _damage(book, backend, damage))
        report = await verify(book, processes=0)
        assert report.findings, "a stored value changed and verify found nothing"
        assert {f.entity_id for f in report.findings} <= {"victim"}, report.findings
        assert "unreadable" not in {f.kind for f in report.findings}, report.findings
        assert report.entities == len(ENTITIES), "every entity was checked"
        assert report.to_json()["ok"] is False and json.dumps(report.to_json(), default=str)
    finally:
        await engine.dispose()


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_url(request, tmp_path_factory) -> tuple[str, str]:
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("pg_url")
    return "sqlite", f"sqlite:///{tmp_path_factory.mktemp('damage') / 'damage.db'}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_damage_of_any_shape_is_a_finding_never_a_crash(backend_url: tuple[str, str], data: st.DataObject):
    """L12b: whatever is written into a fact's columns (patch, metadata, evidence_refs, version, at,
    status, links, hashes) or a row's, verify returns findings on the damaged entity only, and still
    checks every other entity."""
    backend, url = backend_url
    asyncio.run(_run(url, backend, data.draw(damages(backend))))
