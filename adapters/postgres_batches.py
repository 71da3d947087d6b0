"""The PostgreSQL backend's set-based statements: one statement per batch, one array per column.

Rows travel as one JSON text of row arrays (``json_array_elements``, each value cast to its column's type)
when every column sent per row has a plain type (text, integer, float, boolean, or JSON already serialised);
else as one array per column (``unnest``). The row write's ``RETURNING`` feeds the fact insert in the same
statement, so a row the compare-and-set refused gets no fact (specs/lifecycle.md L4, L17).

Why JSON: asyncpg encodes an array parameter element by element, checking each against several abstract
base classes, and a claim or a finalization sends about twenty arrays per batch; one JSON text made by the C
encoder costs the client under half as much per value (specs/performance.md, issue 29). The values survive
the trip exactly: text is escaped and unescaped, an integer is its digits, and a float is written as Python's
shortest round-trip repr, which PostgreSQL's float8 input reads back to the same double.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.store import RowWrite

from .persistence import FACT_COLUMNS

FACT_VARYING = frozenset({"id", "entity_id"})
"""Fact columns always sent per row (the join key and the fact id)."""


def update_columns(writes: Sequence[RowWrite]) -> dict[str, list[Any]]:
    """An update batch as one list per parameter: the compare-and-set keys ``b_*`` and the new values ``n_*``."""
    first = writes[0]
    columns = {"b_id": [w.entity_id for w in writes]}
    for key in ("version", "status", "last_fact_id", "chain_hash", *first.guards):
        columns[f"b_{key}"] = [w.expect[key] for w in writes]
    for key in first.values:
        columns[f"n_{key}"] = [w.values[key] for w in writes]
    return columns


def row_columns(writes: Sequence[RowWrite], names: Sequence[str]) -> dict[str, list[Any]]:
    """The rows' ``names`` values as one list per column."""
    return {name: [w.values[name] for w in writes] for name in names}


def fact_columns(writes: Sequence[RowWrite]) -> dict[str, list[Any]]:
    """The facts' values as one list per fact column."""
    return {name: [w.fact[name] for w in writes] for name in FACT_COLUMNS}


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
class _SetStatement:
    """A set-based statement; its parameters (:func:`set_params`) are one list per column — the
    rows' keys and ``f_<fact column>`` — except the ``*_constant`` columns: one value, sent once."""

    statement: Any
    row_prefix: str
    row_constant: frozenset[str] = frozenset()
    fact_constant: frozenset[str] = frozenset()
    row_packed: tuple[str, ...] | None = None
    """The rows' varying columns, in the order of each packed row array (None: one array per column)."""
    fact_packed: tuple[str, ...] | None = None
    """The same for the facts."""


_PACKED = "packed__rows"
"""The name (after the source's prefix) of the one parameter a packed source reads its rows from."""

_pack = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False, allow_nan=False).encode
"""Row arrays as JSON text (no cycles: lists of scalars; NaN and the infinities were refused on input)."""


def set_params(stmt: _SetStatement, rows: Mapping[str, list[Any]], facts: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The statement's parameters from one list per column: a constant column's one value; the varying
    columns as one packed JSON parameter, or else one list each."""
    params = _params(stmt.row_prefix, rows, stmt.row_constant, stmt.row_packed)
    params.update(_params("f_", facts, stmt.fact_constant, stmt.fact_packed))
    return params


def _params(prefix: str, columns: Mapping[str, list[Any]], constant: frozenset[str],
            packed: tuple[str, ...] | None) -> dict[str, Any]:
    if packed is None:
        return {f"{prefix}{k}": v[0] if k in constant else v for k, v in columns.items()}
    params: dict[str, Any] = {f"{prefix}{k}": columns[k][0] for k in constant}
    params[prefix + _PACKED] = _pack(list(zip(*[columns[k] for k in packed])))
    return params


def constant_columns(columns: Mapping[str, list[Any]], varying: frozenset[str]) -> frozenset[str]:
    """Columns whose value is the same in every row (same type too: ``1`` and ``True`` are equal in
    Python, not in SQL; JSON containers never count: two equal dicts can be different JSON, e.g.
    ``1`` and ``true``). ``varying`` are never constant."""
    found = []
    for name, values in columns.items():
        if name in varying:
            continue
        first = values[0]
        kind = type(first)
        if kind is dict or kind is list or values.count(first) != len(values):
            continue
        if kind is not str and first is not None and any(type(v) is not kind for v in values):
            continue
        found.append(name)
    return frozenset(found)


def constant_keys(items: Sequence[Mapping[str, Any]], keys: tuple[str, ...], varying: frozenset[str]) -> frozenset[str]:
    """:func:`constant_columns` of rows given as mappings."""
    return constant_columns({k: [item[k] for item in items] for k in keys}, varying)


_PLAIN = (sa.String, sa.Integer, sa.Float, sa.Boolean)
"""Column types whose Python values JSON carries exactly and PostgreSQL casts back from text."""


def _packable(prefix: str, columns: list[sa.Column[Any]], json_as_text: bool, constant: frozenset[str]) -> bool:
    """Whether the varying columns can travel packed: each of a plain type (no enum, no decorated type, no
    Numeric: their Python values are not JSON), or JSON already serialised; and no column's parameter name
    is the packed parameter's."""
    for c in columns:
        if f"{prefix}{c.name}" == prefix + _PACKED:
            return False
        if c.name in constant:
            continue
        kind = c.type
        if isinstance(kind, sa.JSON):
            if not json_as_text:
                return False
        elif (not isinstance(kind, _PLAIN) or isinstance(kind, (sa.Enum, sa.TypeDecorator))
              or (isinstance(kind, sa.Numeric) and not isinstance(kind, sa.Float))):
            return False
    return True


def _source(prefix: str, alias: str, columns: list[sa.Column[Any]], *, json_as_text: bool = False,
            constant: frozenset[str] = frozenset()) -> tuple[str, list[Any], dict[str, str], tuple[str, ...] | None]:
    """The rows' source, its parameters, the SQL that reads each column (``alias.column``, or for a
    ``constant`` column its one cast parameter), and the packed columns' order (None: not packed).

    Packed: ``(SELECT CAST(e.r ->> 0 AS T) AS column, ... FROM json_array_elements(CAST(:<prefix>packed__rows
    AS JSON)) AS e(r)) AS alias``; else ``unnest(CAST(:<prefix><column> AS T[]), ...) AS alias(columns)``."""
    if _packable(prefix, columns, json_as_text, constant):
        return _packed_source(prefix, alias, columns, constant)
    sql, binds, refs = _array_source(prefix, alias, columns, json_as_text=json_as_text, constant=constant)
    return sql, binds, refs, None


def _packed_source(prefix: str, alias: str, columns: list[sa.Column[Any]], constant: frozenset[str]
                   ) -> tuple[str, list[Any], dict[str, str], tuple[str, ...]]:
    binds: list[Any] = [sa.bindparam(prefix + _PACKED, type_=sa.Text)]
    refs: dict[str, str] = {}
    reads, order = [], []
    for c in columns:
        if c.name in constant:
            refs[c.name], bind = _constant(prefix, c, json_as_text=True)
            binds.append(bind)
            continue
        text = f"(e.r ->> {len(order)})"
        value = f"CAST(CAST({text} AS TEXT) AS {_pg_type(c)})" if isinstance(c.type, sa.JSON) else \
            f"CAST({text} AS {_pg_type(c)})"
        reads.append(f"{value} AS {_q(c.name)}")
        refs[c.name] = f"{alias}.{_q(c.name)}"
        order.append(c.name)
    rows = f"json_array_elements(CAST(:{prefix}{_PACKED} AS JSON)) AS e(r)"
    return f"(SELECT {', '.join(reads)} FROM {rows}) AS {alias}", binds, refs, tuple(order)


def _constant(prefix: str, c: sa.Column[Any], *, json_as_text: bool) -> tuple[str, Any]:
    """The SQL reading a constant column's one parameter, and that parameter."""
    name = f"{prefix}{c.name}"
    if isinstance(c.type, sa.JSON):
        return f"CAST(CAST(:{name} AS TEXT) AS {_pg_type(c)})", sa.bindparam(name, type_=sa.Text if json_as_text else c.type)
    return f"CAST(:{name} AS {_pg_type(c)})", sa.bindparam(name, type_=c.type)


def _array_source(prefix: str, alias: str, columns: list[sa.Column[Any]], *, json_as_text: bool = False,
                  constant: frozenset[str] = frozenset()) -> tuple[str, list[Any], dict[str, str]]:
    """``unnest(CAST(:<prefix><column> AS T[]), ...) AS alias(columns)``, its parameters, and the SQL
    that reads each column: ``alias.column``, or for a ``constant`` column its one cast parameter."""
    parts, binds, refs, names = [], [], {}, []
    for c in columns:
        name = f"{prefix}{c.name}"
        is_json = isinstance(c.type, sa.JSON)
        if c.name in constant:
            refs[c.name], bind = _constant(prefix, c, json_as_text=json_as_text)
            binds.append(bind)
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


def _tail_key(refs: Mapping[str, str]) -> str:
    """A following fact's ``tx_id``: the writing transaction's id, or its entity's previous fact's when that is
    higher (L13a).

    The tail orders by (``tx_id``, seq), and a transaction's id is assigned at its first write, not at commit: a
    transaction that wrote another entity first, then waited for this entity's row lock, has an id below the one
    that wrote the previous fact. Never below the previous fact's key, an entity's keys never fall with its
    version (seq breaks a tie: it rises with the version, L12d). Never below the writer's id, the key keeps L13: a
    transaction running when the tail reads has an id at or above the horizon, and so has its key. And it is
    always the id of a writer that has finished once the fact is visible, so an idle database's horizon passes it
    (one above the previous key would not). The previous fact is one lookup by ``uq_fact_version``; it was
    committed before the row this statement updates was read, so the statement's snapshot sees it."""
    previous = (f"SELECT h.tx_id FROM status_transitions AS h WHERE h.entity_type = {refs['entity_type']} "
                f"AND h.entity_id = {refs['entity_id']} AND h.version = {refs['version']} - 1")
    return f"GREATEST(pg_current_xact_id()::text::bigint, ({previous}))"  # GREATEST skips a NULL


def _facts_from(joined: str, constant: frozenset[str], *, following: bool
                ) -> tuple[str, list[Any], tuple[str, ...] | None]:
    """INSERT the facts whose entity is in the CTE ``joined``; returns their entity ids. ``following``: the facts
    follow a previous one (transitions, tombstones), so their ``tx_id`` is :func:`_tail_key`; a creation fact's is
    the column's default, its writer's id."""
    facts_sql, binds, refs, packed = _source("f_", "f", [facts_table.c[c] for c in FACT_COLUMNS], json_as_text=True,
                                             constant=constant)
    names, values = list(FACT_COLUMNS), [refs[c] for c in FACT_COLUMNS]
    if following:
        names.append("tx_id")
        values.append(_tail_key(refs))
    return (
        f"INSERT INTO status_transitions ({', '.join(_q(c) for c in names)}) "
        f"SELECT {', '.join(values)} FROM {facts_sql} "
        f"JOIN {joined} ON {joined}.id = f.entity_id RETURNING entity_id",
        binds,
        packed,
    )


def insert_many(table: sa.Table, columns: tuple[str, ...], if_absent: bool, row_constant: frozenset[str],
                 fact_constant: frozenset[str]) -> _SetStatement:
    """Insert many rows and, for each row actually inserted, its creation fact; their ids."""
    rows_sql, row_binds, refs, row_packed = _source("r_", "r", [table.c[c] for c in columns], constant=row_constant)
    facts_sql, fact_binds, fact_packed = _facts_from("new_rows", fact_constant, following=False)
    names = ", ".join(_q(c) for c in columns)
    conflict = " ON CONFLICT DO NOTHING" if if_absent else ""
    sql = (
        f"WITH new_rows AS (INSERT INTO {_q(table.name)} ({names}) "
        f"SELECT {', '.join(refs[c] for c in columns)} FROM {rows_sql}{conflict} RETURNING {_q('id')}) "
        f"{facts_sql}"
    )
    return _SetStatement(sa.text(sql).bindparams(*row_binds, *fact_binds), "r_", row_constant, fact_constant,
                         row_packed, fact_packed)


def update_many(table: sa.Table, guards: tuple[str, ...], columns: tuple[str, ...], row_constant: frozenset[str],
                 fact_constant: frozenset[str]) -> _SetStatement:
    """Per-row compare-and-set updates and, for each row updated, its fact; the ids updated."""
    keys = [sa.Column("b_id", table.c.id.type), sa.Column("b_version", table.c.version.type),
            sa.Column("b_status", table.c.status.type), sa.Column("b_last_fact_id", table.c.last_fact_id.type),
            sa.Column("b_chain_hash", table.c.chain_hash.type)]
    keys += [sa.Column(f"b_{g}", table.c[g].type) for g in guards]
    news = [sa.Column(f"n_{c}", table.c[c].type) for c in columns]
    values_sql, value_binds, v, row_packed = _source("", "v", [*keys, *news], constant=row_constant)
    facts_sql, fact_binds, fact_packed = _facts_from("updated", fact_constant, following=True)
    where = " AND ".join(
        [f"t.id = {v['b_id']}", f"t.version = {v['b_version']}", f"t.status = {v['b_status']}",
         f"t.last_fact_id = {v['b_last_fact_id']}", f"t.chain_hash = {v['b_chain_hash']}"]
        + [f"t.{_q(g)} IS NOT DISTINCT FROM {v['b_' + g]}" for g in guards]  # NULL-safe guards
    )
    sets = ", ".join(f"{_q(c)} = {v['n_' + c]}" for c in columns)
    sql = (
        f"WITH updated AS (UPDATE {_q(table.name)} AS t SET {sets} FROM {values_sql} "
        f"WHERE {where} RETURNING t.id) {facts_sql}"
    )
    return _SetStatement(sa.text(sql).bindparams(*value_binds, *fact_binds), "", row_constant, fact_constant,
                         row_packed, fact_packed)


def delete_many(table: sa.Table) -> _SetStatement:
    """Per-row compare-and-set deletes (version and chain head) and their tombstone facts."""
    keys = [sa.Column("b_id", table.c.id.type), sa.Column("b_version", table.c.version.type),
            sa.Column("b_last_fact_id", table.c.last_fact_id.type)]
    values_sql, value_binds, v, row_packed = _source("", "v", keys)
    facts_sql, fact_binds, fact_packed = _facts_from("deleted", frozenset(), following=True)
    sql = (
        f"WITH deleted AS (DELETE FROM {_q(table.name)} AS t USING {values_sql} "
        f"WHERE t.id = {v['b_id']} AND t.version = {v['b_version']} AND t.last_fact_id = {v['b_last_fact_id']} "
        f"RETURNING t.id) {facts_sql}"
    )
    return _SetStatement(sa.text(sql).bindparams(*value_binds, *fact_binds), "", row_packed=row_packed,
                         fact_packed=fact_packed)
