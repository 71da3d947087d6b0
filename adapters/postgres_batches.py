"""The PostgreSQL backend's set-based statements: one statement per batch, one array per column.

Rows travel as arrays (``unnest``); the row write's ``RETURNING`` feeds the fact insert in the same
statement, so a row the compare-and-set refused gets no fact (specs/lifecycle.md L4, L17).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    return column.type.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect __init__ is unannotated


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


def set_params(stmt: _SetStatement, rows: Mapping[str, list[Any]], facts: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The statement's parameters from one list per column: a constant column's one value, else its list."""
    prefix, row_constant, fact_constant = stmt.row_prefix, stmt.row_constant, stmt.fact_constant
    params: dict[str, Any] = {f"{prefix}{k}": v[0] if k in row_constant else v for k, v in rows.items()}
    params.update({f"f_{k}": v[0] if k in fact_constant else v for k, v in facts.items()})
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


def _source(prefix: str, alias: str, columns: list[sa.Column[Any]], *, json_as_text: bool = False,
            constant: frozenset[str] = frozenset()) -> tuple[str, list[Any], dict[str, str]]:
    """``unnest(CAST(:<prefix><column> AS T[]), ...) AS alias(columns)``, its parameters, and the SQL
    that reads each column: ``alias.column``, or for a ``constant`` column its one cast parameter."""
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
    quoted: str = postgresql.dialect().identifier_preparer.quote(name)  # type: ignore[no-untyped-call]  # as above
    return quoted


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


def _facts_from(joined: str, constant: frozenset[str], *, following: bool) -> tuple[str, list[Any]]:
    """INSERT the facts whose entity is in the CTE ``joined``; returns their entity ids. ``following``: the facts
    follow a previous one (transitions, tombstones), so their ``tx_id`` is :func:`_tail_key`; a creation fact's is
    the column's default, its writer's id."""
    facts_sql, binds, refs = _source("f_", "f", [facts_table.c[c] for c in FACT_COLUMNS], json_as_text=True,
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
    )


def insert_many(table: sa.Table, columns: tuple[str, ...], if_absent: bool, row_constant: frozenset[str],
                 fact_constant: frozenset[str]) -> _SetStatement:
    """Insert many rows and, for each row actually inserted, its creation fact; their ids."""
    rows_sql, row_binds, refs = _source("r_", "r", [table.c[c] for c in columns], constant=row_constant)
    facts_sql, fact_binds = _facts_from("new_rows", fact_constant, following=False)
    names = ", ".join(_q(c) for c in columns)
    conflict = " ON CONFLICT DO NOTHING" if if_absent else ""
    sql = (
        f"WITH new_rows AS (INSERT INTO {_q(table.name)} ({names}) "
        f"SELECT {', '.join(refs[c] for c in columns)} FROM {rows_sql}{conflict} RETURNING {_q('id')}) "
        f"{facts_sql}"
    )
    return _SetStatement(sa.text(sql).bindparams(*row_binds, *fact_binds), "r_", row_constant, fact_constant)


def update_many(table: sa.Table, guards: tuple[str, ...], columns: tuple[str, ...], row_constant: frozenset[str],
                 fact_constant: frozenset[str]) -> _SetStatement:
    """Per-row compare-and-set updates and, for each row updated, its fact; the ids updated."""
    keys = [sa.Column("b_id", table.c.id.type), sa.Column("b_version", table.c.version.type),
            sa.Column("b_status", table.c.status.type), sa.Column("b_last_fact_id", table.c.last_fact_id.type),
            sa.Column("b_chain_hash", table.c.chain_hash.type)]
    keys += [sa.Column(f"b_{g}", table.c[g].type) for g in guards]
    news = [sa.Column(f"n_{c}", table.c[c].type) for c in columns]
    values_sql, value_binds, v = _source("", "v", [*keys, *news], constant=row_constant)
    facts_sql, fact_binds = _facts_from("updated", fact_constant, following=True)
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
    return _SetStatement(sa.text(sql).bindparams(*value_binds, *fact_binds), "", row_constant, fact_constant)


def delete_many(table: sa.Table) -> _SetStatement:
    """Per-row compare-and-set deletes (version and chain head) and their tombstone facts."""
    keys = [sa.Column("b_id", table.c.id.type), sa.Column("b_version", table.c.version.type),
            sa.Column("b_last_fact_id", table.c.last_fact_id.type)]
    values_sql, value_binds, v = _source("", "v", keys)
    facts_sql, fact_binds = _facts_from("deleted", frozenset(), following=True)
    sql = (
        f"WITH deleted AS (DELETE FROM {_q(table.name)} AS t USING {values_sql} "
        f"WHERE t.id = {v['b_id']} AND t.version = {v['b_version']} AND t.last_fact_id = {v['b_last_fact_id']} "
        f"RETURNING t.id) {facts_sql}"
    )
    return _SetStatement(sa.text(sql).bindparams(*value_binds, *fact_binds), "")
