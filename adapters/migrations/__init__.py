"""statebook's schema migrations (Alembic), kept beside an application's own history.

statebook records its revision in its own version table, ``statebook_alembic_version``, so an application
that runs Alembic for its own tables keeps its ``alembic_version`` untouched. :func:`upgrade` brings a
database to :data:`HEAD` and then brings the registry's DDL (missing lifecycle tables, status CHECKs,
:func:`~statebook.lifecycle.schema.status_index` predicates) to what the registry declares, in one
transaction where the dialect allows. ``statebook db upgrade`` runs it; an application calls it from its
own ``env.py`` (docs/how-to/migrate.md).

Reading where a database stands (:func:`read_stamp`) needs no Alembic: ``open_book`` runs it on every
open and compares the result with :data:`HEAD`. Alembic is imported only to upgrade or to compare.
"""

from .stamp import (ADVISORY_LOCK_KEY, BASELINE, HEAD, HERE, LEGACY_TABLE, LEGACY_VERSION, VERSION_TABLE, Stamp,
                    current, pending, read_stamp, revisions, write_head)
from .upgrade import UpgradeRefused, check, upgrade

__all__ = [
    "BASELINE", "HEAD", "LEGACY_TABLE", "LEGACY_VERSION", "VERSION_TABLE", "Stamp", "UpgradeRefused", "check", "current", "pending",
    "read_stamp", "revisions", "upgrade", "write_head",
]
