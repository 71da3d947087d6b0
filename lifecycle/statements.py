"""Prepared statement shapes for the engine's hot paths.

Building a SQLAlchemy statement per call costs more CPU than the database round trip it sends;
these builders make each shape once (with bind parameters) and reuse it, so SQLAlchemy's compiled
cache is hit without regenerating cache keys.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from .facts import HASHED_FIELDS, facts_table

S = TypeVar("S")
_cache: dict[Hashable, Any] = {}

FACT_COLUMNS: tuple[str, ...] = (*HASHED_FIELDS, "prev_hash", "hash")
READ_COLUMNS = ("status", "version", "last_fact_id", "chain_hash")


def _cached(key: Hashable, build: Callable[[], S]) -> S:
    stmt = _cache.get(key)
    if stmt is None:
        stmt = _cache[key] = build()
    return stmt


def insert_row(dialect: str, table: sa.Table, if_absent: bool, columns: tuple[str, ...] | None = None) -> Any:
    """INSERT into ``table``; values come as parameters named after ``columns`` (all when None)."""

    def build() -> Any:
        if dialect == "postgresql":
            stmt: Any = postgresql.insert(table)
        elif dialect == "sqlite":
            stmt = sqlite.insert(table)
        else:
            stmt = sa.insert(table)
        if columns is not None:
            stmt = stmt.values({c: sa.bindparam(c, type_=table.c[c].type) for c in columns})
        return stmt.on_conflict_do_nothing() if if_absent else stmt

    return _cached(("insert_row", dialect, table, if_absent, columns), build)


class json_text(FunctionElement[Any]):
    """JSON given as its text: ``CAST(text AS JSON)`` on PostgreSQL, the text itself on SQLite."""

    type = sa.JSON()
    inherit_cache = True


@compiles(json_text)
def _json_text(element: json_text, compiler: Any, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(json_text, "postgresql")
def _json_text_pg(element: json_text, compiler: Any, **kw: Any) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS JSON)"


def _fact_value(column: str, name: str) -> Any:
    """A fact column's bind parameter. JSON columns take the canonical text ``facts.stored_values``
    made, so it is not serialised twice."""
    c = facts_table.c[column]
    if isinstance(c.type, sa.JSON):
        return json_text(sa.bindparam(name, type_=sa.Text))
    return sa.bindparam(name, type_=c.type)


def insert_fact() -> Any:
    """INSERT one fact; parameters named after ``FACT_COLUMNS`` (``seq`` and ``tx_id`` are defaults),
    JSON fields as text (``facts.stored_values``)."""
    return _cached(
        ("insert_fact",),
        lambda: sa.insert(facts_table).values({c: _fact_value(c, c) for c in FACT_COLUMNS}),
    )


def insert_row_then_fact(table: sa.Table, columns: tuple[str, ...], if_absent: bool, channel: str | None) -> Any:
    """PostgreSQL, one statement: the row insert's RETURNING feeds the fact insert (and a NOTIFY).

    Parameters: ``r_<column>`` for the row, ``f_<column>`` for the fact.
    """

    def build() -> Any:
        row = postgresql.insert(table).values({c: sa.bindparam(f"r_{c}", type_=table.c[c].type) for c in columns})
        if if_absent:
            row = row.on_conflict_do_nothing()
        inserted = row.returning(table.c.id).cte("new_row")
        values = [_fact_value(c, f"f_{c}").label(c) for c in FACT_COLUMNS]
        source: Any = inserted
        if channel is not None:
            wake = sa.select(sa.func.pg_notify(channel, inserted.c.id).label("woken")).select_from(inserted).cte("wake")
            source = inserted.join(wake, sa.true())
        return (
            sa.insert(facts_table)
            .from_select(list(FACT_COLUMNS), sa.select(*values).select_from(source))
            .add_cte(inserted)
        )

    return _cached(("row_then_fact", table, columns, if_absent, channel), build)


def read_for_transition(table: sa.Table, guards: tuple[str, ...]) -> Any:
    """SELECT the columns a transition compares; parameter ``b_id``."""
    return _cached(
        ("read", table, guards),
        lambda: sa.select(*(table.c[c] for c in (*READ_COLUMNS, *guards))).where(table.c.id == sa.bindparam("b_id")),
    )


def update_if_unchanged(table: sa.Table, guards: tuple[str, ...], columns: tuple[str, ...]) -> Any:
    """The compare-and-set UPDATE. Parameters: ``b_id``, ``b_version``, ``b_expected`` (a list),
    ``b_<guard>`` and ``n_<column>`` for every column set."""

    def build() -> Any:
        return (
            sa.update(table)
            .where(
                table.c.id == sa.bindparam("b_id"),
                table.c.version == sa.bindparam("b_version"),
                table.c.status.in_(sa.bindparam("b_expected", expanding=True)),
                # NULL-safe: a guard may expect "still unset" (IS NOT DISTINCT FROM / SQLite IS).
                *(table.c[g].is_not_distinct_from(sa.bindparam(f"b_{g}", type_=table.c[g].type)) for g in guards),
            )
            .values({c: sa.bindparam(f"n_{c}", type_=table.c[c].type) for c in columns})
        )

    return _cached(("update", table, guards, columns), build)


def first_fact_of() -> Any:
    """Any fact of one entity (does it have a history?). Parameters ``b_type``, ``b_id``."""
    t = facts_table
    return _cached(
        ("first_fact",),
        lambda: sa.select(t.c.id)
        .where(t.c.entity_type == sa.bindparam("b_type"), t.c.entity_id == sa.bindparam("b_id"))
        .limit(1),
    )


def fact_by_key() -> Any:
    """The fact an idempotency key produced. Parameters ``b_type``, ``b_id``, ``b_key``."""
    t = facts_table
    return _cached(
        ("fact_by_key",),
        lambda: sa.select(t.c.id, t.c.status, t.c.version, t.c.command_digest).where(
            t.c.entity_type == sa.bindparam("b_type"),
            t.c.entity_id == sa.bindparam("b_id"),
            t.c.idempotency_key == sa.bindparam("b_key"),
        ),
    )


# -- PostgreSQL set-based shapes: one statement per batch, one array per column (unnest) ---------
#
# (Measured against passing the rows as one JSON document read with json_to_recordset: that spends
# less client CPU but more server time, and batches were 5-15% slower end to end.)

def _pg_type(column: sa.Column[Any]) -> str:
    return column.type.compile(dialect=postgresql.dialect())


class _JSONArray(sa.types.TypeDecorator[list[Any]]):
    """A list of JSON values sent as ``text[]``, each serialised as a JSON column would be
    (None as JSON ``null``). ``ARRAY(JSON)`` would take a list value for one more dimension."""

    impl = postgresql.ARRAY(sa.Text)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        item = sa.JSON().dialect_impl(dialect).bind_processor(dialect)
        return [item(v) for v in value] if item is not None else value


@dataclass(frozen=True)
class SetStatement:
    """A set-based statement; its parameters (see :func:`set_params`) are one list per column —
    ``<row_prefix><key>`` for the rows' keys and ``f_<fact column>`` for the facts — except for the
    columns in ``row_constant`` / ``fact_constant``: one value for the whole batch, sent once."""

    statement: Any
    row_prefix: str
    row_constant: frozenset[str] = frozenset()
    fact_constant: frozenset[str] = frozenset()


def set_params(stmt: SetStatement, rows: list[dict[str, Any]], facts: list[dict[str, Any]]) -> dict[str, Any]:
    first = rows[0]
    params: dict[str, Any] = {
        f"{stmt.row_prefix}{k}": first[k] if k in stmt.row_constant else [r[k] for r in rows] for k in first
    }
    params.update({
        f"f_{c}": facts[0][c] if c in stmt.fact_constant else [f[c] for f in facts] for c in FACT_COLUMNS
    })
    return params


def constant_keys(items: list[dict[str, Any]], keys: tuple[str, ...], varying: frozenset[str]) -> frozenset[str]:
    """Keys whose value is the same in every item (same type too; JSON containers never count: two
    equal dicts can be different JSON, e.g. ``1`` and ``true``). ``varying`` are never constant."""
    first, rest = items[0], items[1:]
    found = []
    for k in keys:
        if k in varying:
            continue
        value = first[k]
        kind = type(value)
        if kind is dict or kind is list:
            continue
        if all(type(item[k]) is kind and item[k] == value for item in rest):
            found.append(k)
    return frozenset(found)


def _source(
    prefix: str, alias: str, columns: list[sa.Column[Any]], *, json_as_text: bool = False,
    constant: frozenset[str] = frozenset(),
) -> tuple[str, list[Any], dict[str, str]]:
    """``unnest(CAST(:<prefix><column> AS T[]), ...) AS alias(columns)``, its parameters, and the SQL
    that reads each column: ``alias.column``, or for a ``constant`` column its one cast parameter.
    (With ``json_as_text`` JSON columns come as their text already.)"""
    parts, binds, refs, names = [], [], {}, []
    for c in columns:
        name = f"{prefix}{c.name}"
        is_json = isinstance(c.type, sa.JSON)
        if c.name in constant:
            if is_json:
                refs[c.name] = f"CAST(CAST(:{name} AS TEXT) AS {_pg_type(c)})"
                binds.append(sa.bindparam(name, type_=sa.Text if json_as_text else c.type))
            else:
                refs[c.name] = f"CAST(:{name} AS {_pg_type(c)})"
                binds.append(sa.bindparam(name, type_=c.type))
            continue
        if is_json:
            parts.append(f"CAST(CAST(:{name} AS TEXT[]) AS {_pg_type(c)}[])")
            binds.append(sa.bindparam(name, type_=postgresql.ARRAY(sa.Text) if json_as_text else _JSONArray()))
        else:
            parts.append(f"CAST(:{name} AS {_pg_type(c)}[])")
            binds.append(sa.bindparam(name, type_=postgresql.ARRAY(c.type)))
        names.append(_q(c.name))
        refs[c.name] = f"{alias}.{_q(c.name)}"
    return f"unnest({', '.join(parts)}) AS {alias}({', '.join(names)})", binds, refs


def _q(name: str) -> str:
    return postgresql.dialect().identifier_preparer.quote(name)


FACT_VARYING = frozenset({"id", "entity_id"})
"""Fact columns always sent per row (the join key and the fact id)."""


def _facts_from(joined: str, constant: frozenset[str]) -> tuple[str, list[Any]]:
    """INSERT the facts whose entity is in the CTE ``joined``; returns their entity ids."""
    facts_sql, binds, refs = _source(
        "f_", "f", [facts_table.c[c] for c in FACT_COLUMNS], json_as_text=True, constant=constant
    )
    fcols = ", ".join(_q(c) for c in FACT_COLUMNS)
    return (
        f"INSERT INTO status_transitions ({fcols}) "
        f"SELECT {', '.join(refs[c] for c in FACT_COLUMNS)} FROM {facts_sql} "
        f"JOIN {joined} ON {joined}.id = f.entity_id RETURNING entity_id",
        binds,
    )


_variants: dict[Hashable, int] = {}
_MAX_VARIANTS = 16


def _variant(base: Hashable, row_constant: frozenset[str], fact_constant: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """The constant sets to compile for: as given while a shape has few variants, else none (so a
    workload whose constant columns keep changing cannot grow the statement caches without bound)."""
    key = (base, row_constant, fact_constant)
    if key in _cache:
        return row_constant, fact_constant
    if _variants.get(base, 0) >= _MAX_VARIANTS:
        return frozenset(), frozenset()
    _variants[base] = _variants.get(base, 0) + 1
    return row_constant, fact_constant


def insert_rows_then_facts(
    table: sa.Table, columns: tuple[str, ...], if_absent: bool,
    row_constant: frozenset[str] = frozenset(), fact_constant: frozenset[str] = frozenset(),
) -> SetStatement:
    """PostgreSQL: insert many rows and, for each row actually inserted, its creation fact.

    Returns the ids of the rows inserted (a row ``if_absent`` skipped gets no fact). Parameters:
    :func:`set_params` with the rows' column values and the facts' values.
    """
    base = ("pg_insert_many", table, columns, if_absent)
    row_constant, fact_constant = _variant(base, row_constant - {"id"}, fact_constant - FACT_VARYING)

    def build() -> SetStatement:
        rows_sql, row_binds, refs = _source("r_", "r", [table.c[c] for c in columns], constant=row_constant)
        facts_sql, fact_binds = _facts_from("new_rows", fact_constant)
        names = ", ".join(_q(c) for c in columns)
        conflict = " ON CONFLICT DO NOTHING" if if_absent else ""
        sql = (
            f"WITH new_rows AS (INSERT INTO {_q(table.name)} ({names}) "
            f"SELECT {', '.join(refs[c] for c in columns)} FROM {rows_sql}{conflict} RETURNING {_q('id')}) "
            f"{facts_sql}"
        )
        return SetStatement(sa.text(sql).bindparams(*row_binds, *fact_binds), "r_", row_constant, fact_constant)

    return _cached((base, row_constant, fact_constant), build)


def update_many_then_facts(
    table: sa.Table, guards: tuple[str, ...], columns: tuple[str, ...],
    row_constant: frozenset[str] = frozenset(), fact_constant: frozenset[str] = frozenset(),
) -> SetStatement:
    """PostgreSQL: per-row compare-and-set updates and, for each row updated, its fact — one statement.

    Row keys: ``b_id``, ``b_version``, ``b_status``, ``b_last_fact_id`` (the chain head the fact
    links to), ``b_<guard>`` and ``n_<column>`` (see :func:`set_params`). Returns the ids of the
    rows updated.
    """
    base = ("pg_update_many", table, guards, columns)
    row_constant, fact_constant = _variant(base, row_constant - {"b_id"}, fact_constant - FACT_VARYING)

    def build() -> SetStatement:
        keys = [sa.Column("b_id", table.c.id.type), sa.Column("b_version", table.c.version.type),
                sa.Column("b_status", table.c.status.type), sa.Column("b_last_fact_id", table.c.last_fact_id.type)]
        keys += [sa.Column(f"b_{g}", table.c[g].type) for g in guards]
        news = [sa.Column(f"n_{c}", table.c[c].type) for c in columns]
        values_sql, value_binds, v = _source("", "v", [*keys, *news], constant=row_constant)
        facts_sql, fact_binds = _facts_from("updated", fact_constant)
        where = " AND ".join(
            [f"t.id = {v['b_id']}", f"t.version = {v['b_version']}", f"t.status = {v['b_status']}",
             f"t.last_fact_id = {v['b_last_fact_id']}"]
            + [f"t.{_q(g)} IS NOT DISTINCT FROM {v['b_' + g]}" for g in guards]
        )
        sets = ", ".join(f"{_q(c)} = {v['n_' + c]}" for c in columns)
        sql = (
            f"WITH updated AS (UPDATE {_q(table.name)} AS t SET {sets} FROM {values_sql} "
            f"WHERE {where} RETURNING t.id) {facts_sql}"
        )
        return SetStatement(sa.text(sql).bindparams(*value_binds, *fact_binds), "", row_constant, fact_constant)

    return _cached((base, row_constant, fact_constant), build)


def update_if_unchanged_one(table: sa.Table, guards: tuple[str, ...], columns: tuple[str, ...]) -> Any:
    """The compare-and-set UPDATE for one row with ONE expected status (``b_status``) and the chain
    head the new fact links to (``b_last_fact_id``), for executemany."""

    def build() -> Any:
        return (
            sa.update(table)
            .where(
                table.c.id == sa.bindparam("b_id"),
                table.c.version == sa.bindparam("b_version"),
                table.c.status == sa.bindparam("b_status"),
                table.c.last_fact_id == sa.bindparam("b_last_fact_id"),
                *(table.c[g].is_not_distinct_from(sa.bindparam(f"b_{g}", type_=table.c[g].type)) for g in guards),
            )
            .values({c: sa.bindparam(f"n_{c}", type_=table.c[c].type) for c in columns})
        )

    return _cached(("update_one", table, guards, columns), build)


def rows_for_update(dialect: str, table: sa.Table, columns: tuple[str, ...], lock: str | None) -> Any:
    """SELECT ``columns`` of the rows whose id is in ``b_ids`` (locked on PostgreSQL).

    ``b_ids`` is a list on PostgreSQL (``= ANY``) and a JSON array text on SQLite (``json_each``),
    so one compiled shape serves every batch size.
    """

    def build() -> Any:
        if dialect == "postgresql":
            ids: Any = table.c.id == sa.any_(sa.bindparam("b_ids", type_=postgresql.ARRAY(table.c.id.type)))
        else:
            ids = table.c.id.in_(sa.select(sa.column("value")).select_from(sa.func.json_each(sa.bindparam("b_ids"))))
        query = sa.select(*(table.c[c] for c in columns)).where(ids)
        if lock is not None and dialect == "postgresql":
            query = query.with_for_update(skip_locked=lock == "skip_locked")
        return query

    return _cached(("rows_for_update", dialect, table, columns, lock), build)


def histories_of(dialect: str) -> Any:
    """Entity ids among ``b_ids`` (a list on PostgreSQL, a JSON array text on SQLite) of type ``b_type``
    that have facts — ids a create must not reuse."""

    def build() -> Any:
        t = facts_table
        if dialect == "postgresql":
            ids: Any = t.c.entity_id == sa.any_(sa.bindparam("b_ids", type_=postgresql.ARRAY(sa.Text)))
        else:
            ids = t.c.entity_id.in_(sa.select(sa.column("value")).select_from(sa.func.json_each(sa.bindparam("b_ids"))))
        return sa.select(t.c.entity_id).distinct().where(t.c.entity_type == sa.bindparam("b_type"), ids)

    return _cached(("histories_of", dialect), build)

