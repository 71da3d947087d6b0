"""The lifecycle columns every managed table carries, declared once, and the status rules of the DDL.

A part that owns an entity table builds it with :func:`managed_table`; the lifecycle columns are
added there, so every managed table has the same shape and only the engine writes them.

The statuses are declared once, by the :class:`~statebook.lifecycle.Lifecycle`. The status CHECK
and the partial indexes that name statuses (:func:`status_index`) are written when the schema is
built for a registry (:func:`schema_for`), from the lifecycles that registry holds, and an existing
database is checked against the registry (:func:`check_statuses`) before anything moves.
"""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from sqlalchemy.sql.schema import ScalarElementColumnDefault

from .errors import PolicyError, SchemaMismatch

if TYPE_CHECKING:
    from .policy import Lifecycle, Registry

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


def lifecycle_columns() -> list[sa.Column[Any]]:
    """The columns :func:`managed_table` adds to a lifecycle's data columns: status, version, reason, chain head,
    times.
    """
    return [
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("status_reason_code", sa.Text, nullable=False),
        sa.Column("status_reason_summary", sa.Text, nullable=False),
        sa.Column("last_fact_id", sa.String(32), nullable=False),
        sa.Column("chain_hash", sa.String(64), nullable=False),
    ]


StatusSet = Literal["active", "terminal"]
"""Which statuses of its lifecycle a :func:`status_index` predicate names: ``active`` (the
non-terminal ones) or ``terminal``."""


def status_check_name(table_name: str) -> str:
    """The name of a managed table's status CHECK: ``ck_<table>_status``."""
    return f"ck_{table_name}_status"


def status_in(column: str, statuses: Iterable[str]) -> str:
    """SQL text ``column IN ('a', 'b')`` with the statuses as literals.

    Literal on purpose: PostgreSQL uses a partial index only when the query's predicate names the
    same values as literals (bound parameters are unknown when the plan is made).

    >>> status_in("status", ("open", "working"))
    "status IN ('open', 'working')"
    """
    values = tuple(statuses)
    if not values:
        raise ValueError(f"status_in({column!r}, ...) needs at least one status")
    quoted = ", ".join("'" + s.replace("'", "''") + "'" for s in values)
    return f"{column} IN ({quoted})"


def status_index(name: str, *columns: str | sa.ColumnElement[Any], where: StatusSet, **kwargs: Any) -> sa.Index:
    """An index of a managed table, partial on a set of its lifecycle's statuses.

    The predicate is written by :func:`schema_for` from the lifecycle the registry holds for the
    table, so an extended lifecycle gets an index that covers its own statuses. Pass it to
    :func:`managed_table` like any other index::

        status_index("idx_tickets_open", "updated_at", where="active")
    """
    if where not in ("active", "terminal"):
        raise ValueError(f"status_index {name!r}: where must be 'active' or 'terminal', not {where!r}")
    return sa.Index(name, *columns, info={"statuses": where}, **kwargs)


def managed_table(
    name: str,
    *columns: sa.Column[Any] | sa.Constraint | sa.Index,
    statuses: Iterable[str] | None = None,
    meta: sa.MetaData = metadata,
) -> sa.Table:
    """A table whose status is driven by the engine: ``columns`` plus the lifecycle columns.

    The table must have a text primary key named ``id``. Its statuses come from the lifecycle that
    manages it: :func:`schema_for` writes the status CHECK and the :func:`status_index` predicates.

    ``statuses`` is deprecated: it attaches a fixed CHECK (for code that calls ``create_all`` on its
    own MetaData) and the registry refuses a lifecycle whose statuses differ from it.
    """
    extra: list[sa.Constraint] = []
    info: dict[str, object] = {"managed": True}
    if statuses is not None:
        warnings.warn(
            f"managed_table({name!r}, statuses=...) is deprecated: the lifecycle declares the statuses and "
            "the status CHECK is built from the registry (create_schema(engine, registry=...)); drop statuses=",
            DeprecationWarning,
            stacklevel=2,
        )
        allowed = tuple(statuses)
        extra.append(sa.CheckConstraint(status_in("status", allowed), name=status_check_name(name)))
        info["statuses"] = allowed
    plain = [c for c in columns if isinstance(c, sa.Column)]
    others = [c for c in columns if not isinstance(c, sa.Column)]
    # Index.info is not copied by Table.to_metadata, so the table remembers which indexes name statuses.
    info["status_indexes"] = {
        c.name: c.info["statuses"] for c in others if isinstance(c, sa.Index) and "statuses" in c.info
    }
    table = sa.Table(name, meta, *plain, *lifecycle_columns(), *others, *extra, info=info)
    if "id" not in table.c or not table.c.id.primary_key:
        raise ValueError(f"managed table {name!r} needs a primary key column named 'id'")
    return table


def _statuses_of(lc: Lifecycle, which: StatusSet) -> tuple[str, ...]:
    return lc.active if which == "active" else tuple(s for s in lc.statuses if s in lc.terminal)


def _follow(table: sa.Table, lc: Lifecycle | None) -> None:
    """Give a copied table the status CHECK and index predicates of the lifecycle managing it."""
    if lc is None:
        return  # not in this registry: keep what the table declared (partial indexes stay full)
    check = status_check_name(table.name)
    for constraint in [c for c in table.constraints if c.name == check]:
        table.constraints.discard(constraint)
    table.append_constraint(sa.CheckConstraint(status_in("status", lc.statuses), name=check))
    roles: Mapping[str, StatusSet] = table.info.get("status_indexes", {})
    for index in table.indexes:
        which = roles.get(index.name or "")
        if which is None:
            continue
        chosen = _statuses_of(lc, which)
        predicate = sa.text(status_in("status", chosen)) if chosen else sa.false()
        for dialect in ("postgresql", "sqlite"):
            index.dialect_options[dialect]["where"] = predicate


def schema_for(registry: Registry, meta: sa.MetaData = metadata) -> sa.MetaData:
    """The DDL of ``meta`` plus the registry's own tables, with status rules taken from ``registry``.

    Each managed table gets ``CHECK (status IN (...))`` listing its lifecycle's statuses and each
    :func:`status_index` gets its predicate; the module-level tables are left as they are (queries
    use them; only the DDL varies with the registry). The registry must be sealed: the schema is
    built once, for the lifecycles the application will run. The copies carry no DDL event
    listeners; :func:`create_tables` is what creates the schema.
    """
    if not registry.sealed:
        raise PolicyError(
            "build the schema from a sealed registry: register and extend its lifecycles, call "
            "registry.seal(), then create the schema"
        )
    by_table = {lc.table.name: lc for lc in registry}
    tables = list(meta.sorted_tables)
    tables += [lc.table for lc in registry if lc.table.name not in meta.tables]
    out = sa.MetaData()
    for table in tables:
        copy = table.to_metadata(out)
        if copy.info.get("managed"):
            _follow(copy, by_table.get(table.name))
    return out


_SCHEMAS: OrderedDict[tuple[int, ...], tuple[tuple[object, ...], sa.MetaData]] = OrderedDict()
_SCHEMAS_KEPT = 16


def _schema_of(registry: Registry, meta: sa.MetaData) -> sa.MetaData:
    """:func:`schema_for`, built once per set of lifecycles and tables: every ``open_book`` asks for it, and
    copying some twenty tables costs more than the rest of opening a book. The key is the identity of each
    lifecycle and table (all immutable once the registry is sealed); the entry keeps them alive, so an id
    is never reused while it is a key. The copies are only read (DDL), never handed out."""
    keep: tuple[object, ...] = (meta, *meta.tables.values(), *registry)
    key = tuple(id(item) for item in keep)
    hit = _SCHEMAS.get(key)
    if hit is not None:
        _SCHEMAS.move_to_end(key)
        return hit[1]
    schema = schema_for(registry, meta)
    _SCHEMAS[key] = (keep, schema)
    while len(_SCHEMAS) > _SCHEMAS_KEPT:
        _SCHEMAS.popitem(last=False)
    return schema


def create_tables(conn: sa.Connection, registry: Registry, meta: sa.MetaData = metadata) -> None:
    """Create the missing tables of :func:`schema_for`, in dependency order.

    Run it with ``await conn.run_sync(create_tables, registry)``. A managed table of the registry is
    created from its copy (status rules from the registry); every other table from the original
    ``Table``, so its DDL event listeners (e.g. a PostgreSQL column default) still run. A DDL
    listener on a managed table reaches its copy when registered with ``propagate=True``.
    """
    copies = _schema_of(registry, meta)
    by_table = {lc.table.name: lc.table for lc in registry}
    existing = set(sa.inspect(conn).get_table_names())  # one query for the default schema, not one per table
    for copy in copies.sorted_tables:
        if copy.schema is None and copy.name in existing:
            continue
        follows = copy.info.get("managed") and copy.name in by_table
        original = meta.tables.get(copy.name, by_table.get(copy.name))
        (copy if follows or original is None else original).create(conn, checkfirst=True)


_QUOTED = re.compile(r"'((?:[^']|'')*)'")


def check_statuses(conn: sa.Connection, registry: Registry, hint: str = "") -> None:
    """Raise :class:`SchemaMismatch` when an existing table's status CHECK refuses a declared status.

    Run it with ``await conn.run_sync(check_statuses, registry)``. A table that does not exist yet,
    or has no status CHECK, passes. ``hint`` ends the message (how to run the upgrade: the caller knows).
    """
    inspector = sa.inspect(conn)
    existing = set(inspector.get_table_names())  # one query for the default schema
    present = [
        lc for lc in registry
        if (lc.table.name in existing if lc.table.schema is None else inspector.has_table(lc.table.name, lc.table.schema))
    ]
    # The default schema's tables in one reflection (one catalog query on PostgreSQL, not one per table).
    defaults = [lc.table.name for lc in present if lc.table.schema is None]
    checks = {name: found for (_, name), found in
              (inspector.get_multi_check_constraints(filter_names=defaults) if defaults else {}).items()}
    for lc in present:
        name = lc.table.name
        found = checks.get(name, []) if lc.table.schema is None else inspector.get_check_constraints(name, lc.table.schema)
        for check in found:
            if check.get("name") != status_check_name(name):
                continue
            admitted = {v.replace("''", "'") for v in _QUOTED.findall(check.get("sqltext") or "")}
            missing = [s for s in lc.statuses if s not in admitted]
            if missing:
                wanted = status_in("status", lc.statuses)
                ck = status_check_name(name)
                raise SchemaMismatch(
                    f"table {name!r} in this database has a status CHECK ({ck}) that does not admit "
                    f"{', '.join(repr(s) for s in missing)}, which lifecycle {lc.entity_type!r} declares; a move "
                    f"to {'it' if len(missing) == 1 else 'them'} would be refused by the database. Run the schema "
                    f"upgrade for this registry (it makes the constraint CHECK ({wanted})){hint} — or remove the "
                    "status from the lifecycle"
                )


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


UNKNOWN: Any = object()
"""A default computed when the row is inserted (a callable, a sequence, a SQL expression): no fold can know it."""


def column_default(column: sa.Column[Any]) -> Any:
    """The value a row holds in ``column`` when its insert gives none: the declared default (Python-side
    scalar or server default), None without one, :data:`UNKNOWN` when it is computed at insert time."""
    if column.computed is not None or column.identity is not None:
        return UNKNOWN
    if column.default is not None:
        default = column.default
        return default.arg if isinstance(default, ScalarElementColumnDefault) else UNKNOWN
    server = column.server_default
    if server is None:
        return None
    arg = getattr(server, "arg", None)
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return UNKNOWN
    if isinstance(arg, sa.TextClause):  # SQL text: only a plain literal is known
        text = arg.text.strip()
        if kind is str:
            inner = text[1:-1]
            return inner if len(text) >= 2 and text[0] == text[-1] == "'" and "'" not in inner else UNKNOWN
        arg = text
    if not isinstance(arg, str) or kind not in (int, float, str):
        return UNKNOWN
    try:
        return kind(arg)
    except ValueError:
        return UNKNOWN


_defaults: dict[sa.Table, dict[str, Any]] = {}


def row_defaults(table: sa.Table) -> dict[str, Any]:
    """The data columns of ``table`` whose value, when no fact sets it, is known: name -> that value.

    A create records these in its fact for the columns it is not given, and the fold of an entity's
    facts starts from them (L7: the row equals the fold, every column)."""
    found = _defaults.get(table)
    if found is None:
        found = _defaults[table] = {
            c.name: d for c in table.columns if c.name not in LIFECYCLE_COLUMNS
            and (d := column_default(c)) is not UNKNOWN}
    return found
