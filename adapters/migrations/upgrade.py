"""Run statebook's migrations and the registry step on a connection: :func:`upgrade`, :func:`check`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa

from statebook.lifecycle import StatebookError
from statebook.lifecycle.schema import schema_for

from .ddl import apply_registry_ddl, registry_drift
from .stamp import ADVISORY_LOCK_KEY, BASELINE, HEAD, HERE, LEGACY_VERSION, read_stamp, revisions

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

    from statebook.lifecycle import Registry


class UpgradeRefused(StatebookError):
    """The database cannot be upgraded by this statebook (newer revision, unknown stamp, a foreign-key
    violation a table rebuild would leave); nothing was changed."""


@dataclass
class Report:
    """What :func:`upgrade` did (``applied``: revisions run; ``ddl``: registry steps) or what :func:`check`
    found (``drift``: one line per difference)."""

    before: str
    after: str
    applied: list[str] = field(default_factory=list)
    ddl: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)


def _registry(registry: Registry | None) -> Registry:
    if registry is not None:
        return registry
    from statebook.adapters.registry import builtin_registry

    return builtin_registry()


def _config(conn: sa.Connection):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.attributes["connection"] = conn
    return cfg


@contextlib.contextmanager
def _foreign_keys_off(conn: sa.Connection) -> Iterator[None]:
    """SQLite: foreign keys off for a table rebuild (a DROP TABLE would otherwise delete, or cascade to,
    the rows that reference it). The pragma is a no-op inside a transaction, so it is set before one starts."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = conn.connection.dbapi_connection
    if conn.in_transaction():
        on = conn.execute(sa.text("PRAGMA foreign_keys")).scalar()
        if on:
            raise UpgradeRefused("on SQLite, upgrade needs a connection outside a transaction (it switches foreign "
                                 "keys off for table rebuilds); pass one before its first statement")
        yield
        return
    cursor = raw.cursor()  # type: ignore[union-attr]
    cursor.execute("PRAGMA foreign_keys=OFF")
    cursor.close()
    try:
        yield
    finally:
        cursor = raw.cursor()  # type: ignore[union-attr]
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()


def upgrade(conn: sa.Connection, registry: Registry | None = None) -> Report:
    """Bring the database to :data:`HEAD`, then its lifecycle tables to ``registry``'s DDL (default: built-in).

    ``conn`` is a synchronous SQLAlchemy connection (``await aconn.run_sync(upgrade, registry)``, or the one
    an application's Alembic ``env.py`` holds). Everything happens in one transaction: the caller's when it
    has begun one, else one begun here and committed at the end. PostgreSQL: an advisory lock serializes
    hosts upgrading at once (the second sees the first's result and does nothing). A pre-migration database
    (``statebook_schema`` version 2) is stamped 0001 first. SQLite: foreign keys are off while tables are
    rebuilt, and ``PRAGMA foreign_key_check`` must come back empty before the commit.
    """
    from alembic import command

    registry = _registry(registry)
    schema_for(registry)  # refuses an unsealed registry before anything moves
    with _foreign_keys_off(conn):
        own = not conn.in_transaction()
        tx = conn.begin() if own else contextlib.nullcontext()
        with tx:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
            stamp = read_stamp(conn)
            report = Report(before=stamp.describe(), after=HEAD)
            known = revisions()
            if stamp.kind == "foreign":
                raise UpgradeRefused("the database has statebook tables but no version stamp; it was not written by "
                                     "a statebook this one can upgrade")
            if stamp.kind == "legacy":
                if stamp.legacy_version != LEGACY_VERSION:
                    raise UpgradeRefused(f"the database has pre-migration schema version {stamp.legacy_version}; "
                                         f"only version {LEGACY_VERSION} can be adopted: create a new database")
                command.stamp(_config(conn), BASELINE)
                report.applied.append(f"{BASELINE} (stamped: pre-migration v{LEGACY_VERSION} is its schema)")
                start = known.index(BASELINE) + 1
            elif stamp.kind == "revision":
                if stamp.revision not in known:
                    raise UpgradeRefused(f"the database is at revision {stamp.revision}, newer than this statebook "
                                         f"(head {HEAD}); upgrade statebook")
                start = known.index(stamp.revision) + 1
            else:
                start = 0
            if known[start:]:
                command.upgrade(_config(conn), "head")
                report.applied += known[start:]
            report.ddl = apply_registry_ddl(conn, registry)
            if conn.dialect.name == "sqlite":
                broken = conn.execute(sa.text("PRAGMA foreign_key_check")).all()
                if broken:
                    raise UpgradeRefused(f"the upgrade would leave {len(broken)} rows whose foreign key points "
                                         f"nowhere (first: {tuple(broken[0])}); nothing was changed")
    return report


def schema_diff(conn: sa.Connection, registry: Registry) -> list[str]:
    """Alembic's comparison of the live schema with ``schema_for(registry)``, one line per difference."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    expected = schema_for(registry)
    managed = set(expected.tables)

    def include(obj, name, kind, reflected, compare_to):  # type: ignore[no-untyped-def]
        # A table statebook does not manage (the application's, its alembic_version) is not statebook's
        # drift, nor anything on it: the database may be shared with the application (M7).
        table = name if kind == "table" else getattr(getattr(obj, "table", None), "name", None)
        if table is not None and table not in managed:
            return False
        # The facts table's tailing index is created by the PostgreSQL adapter's DDL, not the metadata.
        return not (kind == "index" and name == "ix_fact_tail" and reflected and compare_to is None)

    ctx = MigrationContext.configure(conn, opts={"include_object": include, "compare_type": False})
    out = []
    for diff in compare_metadata(ctx, expected):
        out.append(_describe(diff))
    return out


def _describe(diff: object) -> str:
    if isinstance(diff, tuple) and diff and isinstance(diff[0], str):
        what, *rest = diff
        target = rest[0] if rest else None
        name = getattr(target, "name", None) or repr(target)
        table = getattr(getattr(target, "table", None), "name", None)
        return f"{what} {table + '.' if table else ''}{name}"
    if isinstance(diff, list):  # column modifications come as a list of tuples
        return "; ".join(f"{d[0]} {d[2]}.{d[3]}" for d in diff)
    return repr(diff)


def check(conn: sa.Connection, registry: Registry | None = None) -> Report:
    """What stands between the database and this statebook with ``registry``: an empty ``drift`` means it is
    at :data:`HEAD`, the registry's DDL matches, and Alembic finds no difference with ``schema_for``."""
    registry = _registry(registry)
    stamp = read_stamp(conn)
    report = Report(before=stamp.describe(), after=HEAD)
    if stamp.kind != "revision" or stamp.revision != HEAD:
        report.drift.append(f"revision: the database is at {stamp.describe()}, this statebook expects {HEAD}")
        if stamp.kind != "revision":
            return report
    found = registry_drift(conn, registry)
    report.drift += [str(d) for d in found]
    named = {f"add_index {d.table}.{d.name}" for d in found if d.name}  # Alembic's line for the same index
    report.drift += [d for d in schema_diff(conn, registry)
                     if d not in named and not any(d.endswith(f" {t}") for t in _missing(report.drift))]
    return report


def _missing(drift: list[str]) -> list[str]:
    return [line.split()[1] for line in drift if line.startswith("table ") and line.endswith(" is missing")]


def scripts_of() -> list[tuple[str, str | None, str]]:
    """Each revision as (revision, down_revision, first line of its docstring), oldest first."""
    out = []
    for script in reversed(list(_scripts_dir().walk_revisions())):
        down = script.down_revision if isinstance(script.down_revision, str) or script.down_revision is None else ",".join(script.down_revision)
        out.append((script.revision, down, (script.doc or "").strip().splitlines()[0] if script.doc else ""))
    return out


def _scripts_dir() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(HERE))
