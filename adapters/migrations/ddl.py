"""The registry's DDL against the live database: what differs (:func:`registry_drift`) and how it is brought
to the registry's (:func:`apply_registry_ddl`). Dialect-specific on purpose: this module is in adapters.

A managed table's status CHECK and its :func:`~statebook.lifecycle.schema.status_index` predicates list
statuses as literals; they are compared as sets of literals, so the spelling each dialect gives back
(PostgreSQL: ``status = ANY (ARRAY['a'::text, ...])``) does not matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from statebook.lifecycle.schema import create_tables, schema_for, status_check_name

if TYPE_CHECKING:
    from statebook.lifecycle import Registry

_QUOTED = re.compile(r"'((?:[^']|'')*)'")


@dataclass(frozen=True)
class Drift:
    """One difference between the database and the registry: ``kind`` is ``missing_table``, ``check``,
    ``index`` (a status index's predicate) or ``missing_index`` (any other index of a table statebook
    manages); ``table``; ``name`` (the constraint or index); ``found`` and ``wanted`` as text."""

    kind: str
    table: str
    name: str = ""
    found: str = ""
    wanted: str = ""

    def __str__(self) -> str:
        if self.kind == "missing_table":
            return f"table {self.table} is missing"
        if self.kind == "missing_index":
            return f"{self.table}: index {self.name} is missing"
        return f"{self.table}: {self.kind} {self.name} admits {self.found or 'nothing'}, the registry declares {self.wanted}"


def _literals(text: str | None) -> frozenset[str]:
    return frozenset(v.replace("''", "'") for v in _QUOTED.findall(text or ""))


def _shown(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


def index_predicates(conn: sa.Connection, table: str) -> dict[str, str]:
    """Each index of ``table``: name -> its WHERE text ('' for a full index), as the database stores it."""
    if conn.dialect.name == "postgresql":
        rows = conn.execute(sa.text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                                    "AND tablename = :t"), {"t": table}).all()
    else:
        rows = conn.execute(sa.text("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :t "
                                    "AND sql IS NOT NULL"), {"t": table}).all()
    out = {}
    for name, ddl in rows:
        _, where, predicate = (ddl or "").upper().partition(" WHERE ")
        out[name] = (ddl or "")[len(ddl) - len(predicate):] if where else ""
    return out


def _expected(registry: Registry) -> list[tuple[sa.Table, frozenset[str], dict[str, frozenset[str]]]]:
    """Each table a lifecycle of ``registry`` manages: its copy in schema_for, the CHECK's statuses and
    each status index's statuses."""
    schema = schema_for(registry)
    out: list[tuple[sa.Table, frozenset[str], dict[str, frozenset[str]]]] = []
    for lc in registry:
        table = schema.tables[lc.table.name]
        roles = table.info.get("status_indexes", {})
        indexes: dict[str, frozenset[str]] = {}
        for index in table.indexes:
            if index.name is not None and index.name in roles:
                where = index.dialect_options["sqlite"]["where"]
                indexes[index.name] = _literals(str(where.compile(compile_kwargs={"literal_binds": True})))
        out.append((table, frozenset(lc.statuses), indexes))
    return out


def registry_drift(conn: sa.Connection, registry: Registry) -> list[Drift]:
    """What differs between the database's lifecycle tables and ``registry``: missing tables, status CHECKs
    admitting another set of statuses, status indexes with another predicate (or missing)."""
    inspector = sa.inspect(conn)
    names = set(inspector.get_table_names())
    drift: list[Drift] = []
    for table, statuses, indexes in _expected(registry):
        if table.name not in names:
            drift.append(Drift("missing_table", table.name))
            continue
        ck = status_check_name(table.name)
        checks = {c.get("name"): c.get("sqltext") for c in inspector.get_check_constraints(table.name)}
        found = _literals(checks.get(ck)) if ck in checks else frozenset()
        if found != statuses:
            drift.append(Drift("check", table.name, ck, _shown(found), _shown(statuses)))
        live = index_predicates(conn, table.name)
        for name, wanted in indexes.items():
            have = _literals(live[name]) if name in live else None
            if have != wanted:
                drift.append(Drift("index", table.name, name, "(missing)" if have is None else _shown(have),
                                   _shown(wanted)))
    # Every other index of a table statebook manages (the facts and chain tables included): one dropped by
    # hand is drift that the upgrade creates again, so the command `db check` names does repair it.
    schema = schema_for(registry)
    for table in schema.tables.values():
        if table.name not in names:
            continue
        known = {d.name for d in drift if d.table == table.name}
        live = index_predicates(conn, table.name)
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if index.name not in live and index.name not in known:
                drift.append(Drift("missing_index", table.name, str(index.name)))
    return drift


def apply_registry_ddl(conn: sa.Connection, registry: Registry) -> list[str]:
    """Bring the database's lifecycle tables to ``registry``'s DDL; what was done, one line each.

    Missing tables are created; a CHECK that differs is replaced (PostgreSQL: ALTER TABLE; SQLite: the table
    is recreated in Alembic's batch mode, rows copied, with foreign keys switched off by the caller); an index
    whose predicate differs is dropped and created again. Runs inside the caller's transaction.
    """
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    done: list[str] = []
    drift = registry_drift(conn, registry)
    if any(d.kind == "missing_table" for d in drift):
        missing = sorted({d.table for d in drift if d.kind == "missing_table"})
        create_tables(conn, registry)
        done += [f"created table {name}" for name in missing]
    schema = schema_for(registry)
    ops = Operations(MigrationContext.configure(conn))
    rebuilt: set[str] = set()
    for d in (d for d in drift if d.kind == "check"):
        table = schema.tables[d.table]
        wanted = next(c for c in table.constraints if isinstance(c, sa.CheckConstraint) and c.name == d.name)
        if conn.dialect.name == "postgresql":
            if d.found:
                ops.drop_constraint(d.name, d.table, type_="check")
            ops.create_check_constraint(d.name, d.table, wanted.sqltext)
        else:
            with ops.batch_alter_table(d.table, copy_from=table, recreate="always"):
                pass
            rebuilt.add(d.table)
        done.append(f"{d.table}: status CHECK {d.name} now admits {d.wanted}")
    for d in (d for d in drift if d.kind == "index"):
        if d.table in rebuilt and d.name not in _drifted_after(conn, registry, d.table):
            done.append(f"{d.table}: index {d.name} rebuilt with the table")
            continue
        index = next(i for i in schema.tables[d.table].indexes if i.name == d.name)
        if d.found != "(missing)":
            ops.drop_index(d.name, table_name=d.table)
        index.create(conn)
        done.append(f"{d.table}: index {d.name} now covers {d.wanted}")
    for d in (d for d in drift if d.kind == "missing_index"):
        if d.table in rebuilt and d.name in index_predicates(conn, d.table):
            continue  # the batch rebuild created it with the table
        next(i for i in schema.tables[d.table].indexes if i.name == d.name).create(conn)
        done.append(f"{d.table}: created index {d.name}")
    return done


def _drifted_after(conn: sa.Connection, registry: Registry, table: str) -> set[str]:
    return {d.name for d in registry_drift(conn, registry) if d.table == table and d.kind == "index"}
