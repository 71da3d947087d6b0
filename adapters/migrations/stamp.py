"""Where a database stands, without Alembic: its stamp, the head revision and the pending ones.

``open_book`` reads the stamp (:func:`read_stamp`) on every open; Alembic is imported only to list the
script directory's revisions. :mod:`.upgrade` builds on this module, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HEAD = "0003"
"""The revision this statebook's code expects (a test checks it is the script directory's head)."""

VERSION_TABLE = "statebook_alembic_version"
"""statebook's own Alembic version table (an application's ``alembic_version`` is left alone)."""

LEGACY_TABLE = "statebook_schema"
"""The version stamp written before migrations existed; version 2 is revision 0001's schema."""

LEGACY_VERSION = 2
BASELINE = "0001"
"""The revision a pre-migration (``statebook_schema`` version 2) database is stamped with before upgrading."""

HERE = Path(__file__).resolve().parent
ADVISORY_LOCK_KEY = 0x5157_0017
"""PostgreSQL advisory lock taken by :func:`upgrade`: two hosts upgrading at once run one after the other."""

_STATEBOOK_TABLES = frozenset({"status_transitions", "dispatch_outbox", "schedules", "statebook_chain"})


@dataclass(frozen=True)
class Stamp:
    """Where a database stands: ``kind`` is ``empty`` (no statebook tables), ``legacy`` (``statebook_schema``
    with ``legacy_version``, no version table), ``revision`` (``revision`` read from the version table) or
    ``foreign`` (statebook tables without any stamp)."""

    kind: str
    revision: str | None = None
    legacy_version: int | None = None

    def describe(self) -> str:
        """How ``statebook db current`` names it: a revision, ``empty`` or ``pre-migration v2``."""
        if self.kind == "revision":
            return str(self.revision)
        if self.kind == "legacy":
            return f"pre-migration v{self.legacy_version}"
        if self.kind == "foreign":
            return "unstamped statebook tables"
        return "empty"


def read_stamp(conn: sa.Connection) -> Stamp:
    """Where the database behind ``conn`` stands: one catalog query, then one query of the stamp table.

    Run it with ``await conn.run_sync(read_stamp)``. No Alembic import: ``open_book`` calls it on every open.
    """
    names = set(sa.inspect(conn).get_table_names())
    if VERSION_TABLE in names:
        rows = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
        if len(rows) == 1:
            return Stamp("revision", revision=rows[0])
        return Stamp("foreign") if rows else Stamp("empty" if not names & _STATEBOOK_TABLES else "foreign")
    if LEGACY_TABLE in names:
        found = conn.execute(sa.text(f"SELECT max(version) FROM {LEGACY_TABLE}")).scalar()
        return Stamp("legacy", legacy_version=int(found) if found is not None else None)
    return Stamp("foreign") if names & _STATEBOOK_TABLES else Stamp("empty")


def write_head(conn: sa.Connection) -> None:
    """Create the version table and record :data:`HEAD` (a schema just built by ``create_all``)."""
    conn.execute(sa.text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
                         f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"))
    conn.execute(sa.text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES (:v)"), {"v": HEAD})


def revisions() -> list[str]:
    """Every revision of the script directory, oldest first."""
    return [s.revision for s in reversed(list(_scripts().walk_revisions()))]


def _scripts() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(HERE))


def current(conn: sa.Connection) -> Stamp:
    """Where the database stands (:func:`read_stamp`)."""
    return read_stamp(conn)


def pending(conn: sa.Connection) -> list[str]:
    """The revisions :func:`upgrade` would apply, oldest first (a pre-migration database counts 0001 as
    applied: it is stamped, not rebuilt)."""
    stamp = read_stamp(conn)
    order = revisions()
    if stamp.kind == "empty":
        return order
    if stamp.kind == "legacy":
        return order[order.index(BASELINE) + 1:]
    if stamp.kind == "revision" and stamp.revision in order:
        return order[order.index(stamp.revision) + 1:]
    return []
