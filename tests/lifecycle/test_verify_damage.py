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
from conformance.lifecycle.support import BLOCKED, STARTED, SYSTEM, new_task, prepare, start, task_registry, tasks
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from profiles import examples
from statebook.adapters.db import connect, reset_schema
from statebook.lifecycle import Book, FakeClock, transition, verify
from statebook.lifecycle.facts import facts_table

ENTITIES = ("ok-a", "victim", "ok-z")
FACT_COLUMNS = ("patch", "metadata", "evidence_refs", "version", "at", "status", "previous_status", "prev_fact_id",
                "id", "actor_type", "reason_code", "policy_fingerprint", "prev_hash", "hash", "entity_id", "entity_type")
ROW_COLUMNS = ("title", "owner", "attempt", "labels", "score", "version", "updated_at", "last_fact_id", "chain_hash",
               "id")
IDS = {("fact", "entity_id"), ("row", "id")}
"""Writes that move a fact or a row to another entity: never onto one of the other entities."""

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8) | st.sampled_from(
    ["", "open", "working", "blocked", "done", "{}", "[]", '{"attempt": 1}', "null", "1", "not json", "system"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=5,
)
class NotUtf8(bytes):
    """Bytes written into SQLite as TEXT (``CAST(? AS TEXT)``): text that is not UTF-8."""


sqlite_values = (st.integers(-(2**63), 2**63 - 1) | st.floats() | texts | st.binary(max_size=4)
                 | st.sampled_from([b"\x80", b"ok\xff", b"\xc3"]).map(NotUtf8))


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
        if (where, column) in IDS:
            assume(str(value) not in ENTITIES)
        out.append((where, draw(st.integers(0, 3)), column, value))
    return out


async def _stored(conn: Any, table: sa.Table, column: str, key: Any) -> tuple[Any, ...]:
    """A stored value as compared for "did the write change it": JSON by its decoded value (another
    spelling of the same value is no damage), anything else by type and value (on SQLite as its
    storage class and bytes, which read whatever was written)."""
    is_json = isinstance(table.c[column].type, sa.JSON)
    cell = table.c[column]
    if conn.dialect.name == "sqlite":
        kind, value = (await conn.execute(sa.select(sa.func.typeof(cell), sa.cast(cell, sa.LargeBinary))
                                          .where(key))).one_or_none() or (None, None)
        text = value.decode("utf-8", "surrogateescape") if kind == "text" else None
    else:
        value = (await conn.execute(sa.select(sa.cast(cell, sa.Text) if is_json else cell).where(key))).scalar()
        kind, text = type(value), value if is_json else None
    if is_json and text is not None:
        try:
            return ("json", json.dumps(json.loads(text), sort_keys=True))
        except ValueError:
            pass
    return (kind, value)


async def _victim_facts(book: Book) -> list[int]:
    """The seq of each of the victim's facts, in order (the facts may already be damaged past decoding)."""
    t = facts_table
    async with book.engine.connect() as conn:
        return list((await conn.execute(sa.select(t.c.seq).where(t.c.entity_id == "victim").order_by(t.c.seq))).scalars())


async def _damage(book: Book, backend: str, damage: list[tuple[str, int, str, Any]]) -> bool:
    """Apply the writes; False when together they changed no stored value (or the database refused them)."""
    first: dict[tuple[str, Any, str], tuple[Any, ...]] = {}
    moved = False  # the victim's row now has another id
    for where, index, column, value in damage:
        table, by = (facts_table, "seq") if where == "fact" else (tasks, "id")
        targets = await _victim_facts(book) if where == "fact" else [] if moved else ["victim"]
        if not targets or column == by and where == "fact":
            continue
        target = targets[index % len(targets)]
        key = table.c[by] == target
        try:
            async with book.engine.begin() as conn:
                before = await _stored(conn, table, column, key)
                if backend == "sqlite":  # raw, so the driver stores the value as it is (SQLite takes any type)
                    cell = "CAST(? AS TEXT)" if isinstance(value, NotUtf8) else "?"
                    await conn.exec_driver_sql(f"UPDATE {table.name} SET {column} = {cell} WHERE {by} = ?",
                                               (bytes(value) if isinstance(value, NotUtf8) else value, target))
                else:
                    await conn.execute(sa.update(table).where(key).values({column: value}))
        except (sa.exc.IntegrityError, sa.exc.DataError, sa.exc.ProgrammingError, sa.exc.DBAPIError):
            continue  # a constraint or type the database enforces: not damage it lets through
        first.setdefault((where, target, column), before)
        moved = moved or (where, column) == ("row", "id")
    if moved:
        return True
    async with book.engine.connect() as conn:
        for (where, target, column), before in first.items():
            table, by = (facts_table, "seq") if where == "fact" else (tasks, "id")
            if before != await _stored(conn, table, column, table.c[by] == target):
                return True
    return False


async def _run(url: str, backend: str, damage: list[tuple[str, int, str, Any]], applied: Any = assume) -> None:
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
        applied(await _damage(book, backend, damage))  # a damage the backend cannot store is skipped
        # A sentinel after the victim in id order: it is still checked, and the one before it stays clean.
        async with engine.begin() as conn:
            await conn.execute(sa.update(tasks).where(tasks.c.id == "ok-z").values(title="edited"))
        report = await verify(book, processes=0)
        others = [f for f in report.findings if f.entity_id in ENTITIES and f.entity_id != "victim"]
        assert [(f.kind, f.entity_id) for f in others] == [("row_mismatch", "ok-z")], report.findings
        assert len(report.findings) > 1, "a stored value changed and verify found nothing"
        assert "unreadable" not in {f.kind for f in report.findings}, report.findings
        assert report.entities >= len(ENTITIES), "every entity was checked"
        assert all(type(f.entity_id) is str for f in report.findings)
        assert json.dumps(report.to_json())
    finally:
        # A shared PostgreSQL database outlives the test: leave no task rows or facts behind.
        await reset_schema(engine)
        async with engine.begin() as conn:
            await conn.execute(sa.delete(tasks))
        await engine.dispose()


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_url(request, tmp_path_factory) -> tuple[str, str]:
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("pg_url")
    return "sqlite", f"sqlite:///{tmp_path_factory.mktemp('damage') / 'damage.db'}"


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_damage_of_any_shape_is_a_finding_never_a_crash(backend_url: tuple[str, str], data: st.DataObject):
    """L12b: whatever is written into a fact's columns (patch, metadata, evidence_refs, version, at,
    status, links, hashes) or a row's, verify returns findings on the damaged entity only, and still
    checks every other entity."""
    backend, url = backend_url
    asyncio.run(_run(url, backend, data.draw(damages(backend))))


@pytest.mark.parametrize("damage", [
    [("fact", 0, "entity_id", NotUtf8(b"\x80"))],
    [("fact", 0, "entity_id", "\x80"), ("fact", 0, "entity_id", NotUtf8(b"\x80"))],
    [("fact", 0, "entity_id", NotUtf8(b"ok-\xff"))],
])
def test_an_id_that_is_not_utf8_is_ordered_by_its_bytes(tmp_path, damage):
    """L12b, found by the test above: SQLite orders text by its bytes, so a fact id stored as text that is not
    UTF-8 (0x80) comes before every id starting with a byte above it; read leniently it became U+FFFD, which
    Python orders after them, and verify crashed ("the database orders entity id ... after ...")."""
    def applied(stored: bool) -> None:
        assert stored, "the damage was not written"

    asyncio.run(_run(f"sqlite:///{tmp_path / 'damage.db'}", "sqlite", damage, applied))
