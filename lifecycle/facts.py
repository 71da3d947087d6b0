"""The ``status_transitions`` table: immutable facts, their hash chain, and a tailing reader.

Every fact names the previous fact of its entity; ``UNIQUE(entity_type, entity_id, prev_fact_id)``
makes two forks of one history impossible to commit. A fact's hash covers its content and the
previous hash, so editing or deleting a fact breaks the chain visibly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

from .clock import utc
from .codec import digest, dumps, dumps_tree, keyed_digest, loads
from .inputs import integer
from .schema import metadata
from .store import reads_for

GENESIS = ""
"""``prev_fact_id`` and ``prev_hash`` of an entity's first fact."""

facts_table = sa.Table(
    "status_transitions",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(32), nullable=False),
    sa.Column("entity_type", sa.Text, nullable=False),
    sa.Column("entity_id", sa.Text, nullable=False),
    sa.Column("prev_fact_id", sa.String(32), nullable=False),
    sa.Column("previous_status", sa.Text, nullable=True),
    sa.Column("status", sa.Text, nullable=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("reason_code", sa.Text, nullable=False),
    sa.Column("reason_summary", sa.Text, nullable=False),
    sa.Column("evidence_refs", sa.JSON, nullable=False),
    sa.Column("actor_type", sa.Text, nullable=False),
    sa.Column("actor_id", sa.Text, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("patch", sa.JSON, nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("idempotency_key", sa.Text, nullable=True),
    sa.Column("command_digest", sa.String(64), nullable=True),
    sa.Column("policy_fingerprint", sa.String(16), nullable=False),
    sa.Column("prev_hash", sa.String(64), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
    # PostgreSQL's tail key (L13, L13a): the writing transaction's id, or the entity's previous fact's key when that
    # is higher; NULL on SQLite, whose tail reads seq order.
    sa.Column("tx_id", sa.BigInteger, nullable=True),
    # The indexes a fact pays for, each with the queries it serves (specs/performance.md, "Fact indexes"):
    # one entity's history in order, verify's sweep, the purged-id probe, and no fork: two facts can never
    # claim the same version of one entity.
    sa.UniqueConstraint("entity_type", "entity_id", "version", name="uq_fact_version"),
    sa.Index(
        "uq_fact_idempotency",
        "entity_type",
        "entity_id",
        "idempotency_key",
        unique=True,
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    ),
)

HASHED_FIELDS = (
    "id", "entity_type", "entity_id", "prev_fact_id", "previous_status", "status", "version", "reason_code",
    "reason_summary", "evidence_refs", "actor_type", "actor_id", "at", "patch", "metadata", "idempotency_key",
    "command_digest", "policy_fingerprint",
)
JSON_FIELDS = ("evidence_refs", "patch", "metadata")
"""Hashed fields holding JSON values; they are stored as their canonical text (``codec.dumps``)."""
SCALAR_FIELDS = tuple(k for k in HASHED_FIELDS if k not in JSON_FIELDS)
STORED_FIELDS = (*SCALAR_FIELDS, *JSON_FIELDS, "prev_hash", "hash")
"""A fact's columns in the order :func:`fact_hash` reads them (see :meth:`Fact.from_stored`)."""


@dataclass(frozen=True)
class Fact:
    """One committed transition (or creation, or tombstone) of one entity."""

    id: str
    entity_type: str
    entity_id: str
    prev_fact_id: str
    previous_status: str | None
    status: str | None
    version: int
    reason_code: str
    reason_summary: str
    evidence_refs: list[str]
    actor_type: str
    actor_id: str
    at: float
    """when it was written, in POSIX seconds as stored and hashed (:attr:`time` gives the ``datetime``)"""
    patch: dict[str, Any]
    metadata: dict[str, Any]
    idempotency_key: str | None
    command_digest: str | None
    policy_fingerprint: str
    prev_hash: str
    hash: str
    seq: int | None = None
    tx_id: int | None = None

    @property
    def time(self) -> datetime:
        """``at`` as an aware UTC ``datetime``: when the fact was written. ``at`` stays the stored POSIX seconds
        the hash covers (specs/lifecycle.md L20a)."""
        return utc(self.at)

    @property
    def is_creation(self) -> bool:
        """True for an entity's first fact (no previous status)."""
        return self.previous_status is None

    @property
    def is_tombstone(self) -> bool:
        """True for the fact a purge leaves (no status)."""
        return self.status is None

    def content(self) -> dict[str, Any]:
        """The fields the chain hash covers, by name."""
        return {k: getattr(self, k) for k in HASHED_FIELDS}

    def to_json(self) -> dict[str, Any]:
        """Every field of the fact as a dict (for ``history --json`` and exports)."""
        return asdict(self)

    @classmethod
    def from_row(cls, row: Any) -> Fact:
        """A fact from a row of :func:`stored_columns` (JSON fields as their stored text, decoded here:
        text that is not JSON stays text, so a damaged fact is read, and then fails verify)."""
        m = row._mapping
        return cls(**{k: decoded(m[k]) if k in JSON_FIELDS else m[k] for k in cls.__dataclass_fields__})

    @classmethod
    def from_stored(cls, values: Sequence[Any]) -> Fact:
        """A fact from its ``STORED_FIELDS`` values as the driver returns them (JSON fields as text),
        and its ``seq`` when one more value follows them (verify reads it: the keyed chain needs it)."""
        fact = cls(**{k: decoded(v) if k in JSON_FIELDS else v for k, v in zip(STORED_FIELDS, values)})
        return replace(fact, seq=values[len(STORED_FIELDS)]) if len(values) > len(STORED_FIELDS) else fact


def stored_column(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """A column as stored: JSON as its text (PostgreSQL's ``json`` keeps its input text), so reading
    never fails on a value that is not JSON."""
    return sa.cast(column, sa.Text).label(column.name) if isinstance(column.type, sa.JSON) else column


def stored_columns(table: sa.Table) -> list[sa.ColumnElement[Any]]:
    """Every column of ``table`` as it is read back (JSON columns as their stored text)."""
    return [stored_column(c) for c in table.columns]


def decoded(value: Any) -> Any:
    """A JSON column's stored text decoded; text that is not JSON stays text (it then fails a check)."""
    if not isinstance(value, str):
        return value
    try:
        return loads(value)
    except ValueError:
        return value


def fact_hash(content: Mapping[str, Any], prev_hash: str, key: bytes | None = None) -> str:
    """The chain hash of a fact: covers its content and the previous fact's hash.

    The digest of: the previous hash, the canonical JSON array of the ``SCALAR_FIELDS``, and the
    canonical text of each of the ``JSON_FIELDS`` — the text those columns store, so an audit can
    hash the stored bytes without decoding them. The parts are joined with ``\\x1f``, which
    canonical JSON never contains unescaped, so no two contents give the same bytes.
    With a chain ``key`` (:mod:`.chain`) it is the HMAC-SHA256 of the same bytes under that key.
    """
    return _hash_of(content, prev_hash, [dumps(content[k]) for k in JSON_FIELDS], key)


def legacy_fact_hash(content: Mapping[str, Any], prev_hash: str) -> str:
    """The chain hash of facts written before the stored-text hash (the digest of the previous hash
    and the canonical JSON of the whole content). verify accepts it, so histories written by earlier
    versions stay verifiable — through the full check, since the fast screen only knows the current
    hash."""
    return digest(prev_hash, dumps(dict(content)))


_scalars = itemgetter(*SCALAR_FIELDS)


def _hash_of(content: Mapping[str, Any], prev_hash: str, json_texts: Sequence[str], key: bytes | None = None) -> str:
    scalars = dumps_tree(list(_scalars(content)))  # no container, so no cycle to look for
    if key is not None:
        return keyed_digest(key, prev_hash, scalars, *json_texts)
    return digest(prev_hash, scalars, *json_texts)


def insert_values(content: dict[str, Any], prev_hash: str) -> dict[str, Any]:
    """Column values for a new fact row, hash included."""
    return {**content, "prev_hash": prev_hash, "hash": fact_hash(content, prev_hash)}


_EMPTY: dict[type, str] = {list: "[]", dict: "{}"}
"""The canonical text of an empty list and dict (most facts' evidence and metadata), without encoding."""


def _stored_text(value: Any) -> str:
    """``dumps(value)``; an empty list or dict without running the encoder."""
    return _EMPTY[type(value)] if not value and type(value) in _EMPTY else dumps(value)


def stored_values(content: dict[str, Any], prev_hash: str, key: bytes | None = None) -> dict[str, Any]:
    """:func:`insert_values` with the ``JSON_FIELDS`` already as the canonical text they store — the
    text the hash was taken over, serialised once (the engine's statements bind them as text).
    ``key``: the book's chain key (the hash is then an HMAC, :mod:`.chain`)."""
    texts = [_stored_text(content[k]) for k in JSON_FIELDS]
    stored = dict(content)
    stored.update(zip(JSON_FIELDS, texts))
    stored["prev_hash"] = prev_hash
    stored["hash"] = _hash_of(content, prev_hash, texts, key)
    return stored


@dataclass(frozen=True)
class Cursor:
    """Position of a tailing reader: the last (tail key ``tx_id``, sequence) it returned."""

    tx_id: int = 0
    seq: int = 0


async def tail(conn: Any, cursor: Cursor = Cursor(), *, limit: int = 1000) -> tuple[list[Fact], Cursor]:
    """Facts committed after ``cursor``, in an order no late commit can jump ahead of, each entity's in
    version order (specs/lifecycle.md L13, L13a).

    On PostgreSQL only facts whose key (``tx_id``: at least their writing transaction's id) is older
    than every transaction still in flight (``pg_snapshot_xmin``) are returned, ordered by (key,
    seq): a fact that commits later always sorts after the cursor, and an entity's key never falls
    with its version. On SQLite writes are serialised, so seq order suffices.
    """
    integer("limit", limit, low=1, high=100_000)
    integer("cursor.tx_id", cursor.tx_id, low=0)
    integer("cursor.seq", cursor.seq, low=0)
    query = reads_for(conn.engine).tail_query(cursor, limit)
    rows = (await conn.execute(query)).fetchall()
    found = [Fact.from_row(r) for r in rows]
    if found:
        last = found[-1]
        cursor = Cursor(last.tx_id or 0, last.seq or 0)
    return found, cursor
