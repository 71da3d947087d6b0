"""Prepared statement shapes for the engine's hot paths.

Building a SQLAlchemy statement per call costs more CPU than the database round trip it sends;
these builders make each shape once (with bind parameters) and reuse it, so SQLAlchemy's compiled
cache is hit without regenerating cache keys.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

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


def insert_row(dialect: str, table: sa.Table, if_absent: bool) -> Any:
    """INSERT into ``table``; values come as execute() parameters."""

    def build() -> Any:
        if dialect == "postgresql":
            stmt: Any = postgresql.insert(table)
        elif dialect == "sqlite":
            stmt = sqlite.insert(table)
        else:
            stmt = sa.insert(table)
        return stmt.on_conflict_do_nothing() if if_absent else stmt

    return _cached(("insert_row", dialect, table, if_absent), build)


def insert_fact() -> Any:
    return _cached(("insert_fact",), lambda: sa.insert(facts_table))


def insert_row_then_fact(table: sa.Table, columns: tuple[str, ...], if_absent: bool, channel: str | None) -> Any:
    """PostgreSQL, one statement: the row insert's RETURNING feeds the fact insert (and a NOTIFY).

    Parameters: ``r_<column>`` for the row, ``f_<column>`` for the fact.
    """

    def build() -> Any:
        row = postgresql.insert(table).values({c: sa.bindparam(f"r_{c}", type_=table.c[c].type) for c in columns})
        if if_absent:
            row = row.on_conflict_do_nothing()
        inserted = row.returning(table.c.id).cte("new_row")
        values = [sa.bindparam(f"f_{c}", type_=facts_table.c[c].type).label(c) for c in FACT_COLUMNS]
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
