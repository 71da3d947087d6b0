"""The lifecycle columns every managed table carries, declared once.

A part that owns an entity table builds it with :func:`managed_table`; the lifecycle columns are
added there, so every managed table has the same shape and only the engine writes them.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

metadata = sa.MetaData()
"""One MetaData for every statebook table, so ``create_all`` builds the whole schema."""

LIFECYCLE_COLUMNS: tuple[str, ...] = (
    "status",
    "version",
    "updated_at",
    "status_reason_code",
    "status_reason_summary",
    "last_fact_id",
    "chain_hash",
)
"""Columns owned by the transition engine. Nothing else writes them."""


def lifecycle_columns() -> list[sa.Column]:
    return [
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("status_reason_code", sa.Text, nullable=False),
        sa.Column("status_reason_summary", sa.Text, nullable=False),
        sa.Column("last_fact_id", sa.String(32), nullable=False),
        sa.Column("chain_hash", sa.String(64), nullable=False),
    ]


def managed_table(
    name: str,
    *columns: sa.Column | sa.Constraint | sa.Index,
    statuses: Iterable[str] | None = None,
    meta: sa.MetaData = metadata,
) -> sa.Table:
    """A table whose status is driven by the engine: ``columns`` plus the lifecycle columns.

    The table must have a text primary key named ``id``. With ``statuses`` the status column gets a
    CHECK constraint admitting exactly those values (recorded in ``table.info["statuses"]``).
    """
    extra: list[sa.Constraint] = []
    info: dict[str, object] = {"managed": True}
    if statuses is not None:
        allowed = tuple(statuses)
        quoted = ", ".join(f"'{s}'" for s in allowed)
        extra.append(sa.CheckConstraint(f"status IN ({quoted})", name=f"ck_{name}_status"))
        info["statuses"] = allowed
    plain = [c for c in columns if isinstance(c, sa.Column)]
    others = [c for c in columns if not isinstance(c, sa.Column)]
    table = sa.Table(name, meta, *plain, *lifecycle_columns(), *others, *extra, info=info)
    if "id" not in table.c or not table.c.id.primary_key:
        raise ValueError(f"managed table {name!r} needs a primary key column named 'id'")
    return table


def data_columns(table: sa.Table) -> list[str]:
    """The table's columns that are not lifecycle columns (what a creation fact records)."""
    return [c.name for c in table.columns if c.name not in LIFECYCLE_COLUMNS]


_data_names: dict[sa.Table, frozenset[str]] = {}


def data_column_names(table: sa.Table) -> frozenset[str]:
    """:func:`data_columns` as a set, computed once per table (checked on every create)."""
    names = _data_names.get(table)
    if names is None:
        names = _data_names[table] = frozenset(data_columns(table))
    return names

