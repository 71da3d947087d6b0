"""``create``, ``transition`` and ``purge``: the only code that writes status or facts.

Each runs in ONE transaction: a compare-and-set on the row (status, version and guard columns in
the UPDATE's WHERE clause — the authority, not the prior read), the row's projection, and the
appended fact. A conflict writes nothing; a command the policy forbids raises before any write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from .book import Book, mark_touched
from .codec import digest, dumps, new_id
from .driver import Driver
from .errors import DuplicateEntity, EntityNotFound, IdempotencyMismatch, TransitionRejected
from .facts import GENESIS, stored_values
from .policy import Lifecycle
from .reasons import Actor, Reason
from .schema import data_column_names
from . import statements

_CAS_RETRIES = 8


@dataclass(frozen=True)
class Outcome:
    """The result of a command: ``applied`` (with the fact written) or ``conflict`` (nothing written)."""

    kind: Literal["applied", "conflict"]
    entity_type: str
    entity_id: str
    status: str | None
    version: int | None
    fact_id: str | None = None
    replayed: bool = False
    row: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    chain_hash: str | None = field(default=None, compare=False, repr=False)
    """The hash of the fact written (the row's new chain head), when applied by a batch."""

    @property
    def applied(self) -> bool:
        return self.kind == "applied"

    @property
    def conflict(self) -> bool:
        return self.kind == "conflict"


@dataclass(frozen=True)
class Command:
    """One requested transition."""

    entity_type: str
    entity_id: str
    target: str
    reason: Reason
    actor: Actor
    expected: tuple[str, ...]
    guards: Mapping[str, Any] = field(default_factory=dict)
    patch: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def digest(self) -> str:
        return digest(
            dumps(
                {
                    "entity": [self.entity_type, self.entity_id],
                    "target": self.target,
                    "reason": [self.reason.code, self.reason.summary, list(self.reason.evidence)],
                    "actor": [self.actor.type, self.actor.id],
                    "expected": sorted(self.expected),
                    "guards": dict(self.guards),
                    "patch": dict(self.patch),
                }
            )
        )


def _fact_content(
    lc: Lifecycle,
    *,
    entity_id: str,
    prev_fact_id: str,
    previous: str | None,
    status: str | None,
    version: int,
    reason: Reason,
    actor: Actor,
    at: float,
    patch: Mapping[str, Any],
    metadata: Mapping[str, Any],
    idempotency_key: str | None,
    command_digest: str | None,
) -> dict[str, Any]:
    return {
        "id": new_id(),
        "entity_type": lc.entity_type,
        "entity_id": entity_id,
        "prev_fact_id": prev_fact_id,
        "previous_status": previous,
        "status": status,
        "version": version,
        "reason_code": reason.code,
        "reason_summary": reason.summary,
        "evidence_refs": list(reason.evidence),
        "actor_type": actor.type,
        "actor_id": actor.id,
        "at": at,
        "patch": dict(patch),
        "metadata": dict(metadata),
        "idempotency_key": idempotency_key,
        "command_digest": command_digest,
        "policy_fingerprint": lc.fingerprint,
    }


def _projection(content: dict[str, Any], hashed: dict[str, Any]) -> dict[str, Any]:
    """Lifecycle column values the fact projects onto its row."""
    return {
        "status": content["status"],
        "version": content["version"],
        "updated_at": content["at"],
        "status_reason_code": content["reason_code"],
        "status_reason_summary": content["reason_summary"],
        "last_fact_id": content["id"],
        "chain_hash": hashed["hash"],
    }


def _insert(dialect: str, table: sa.Table) -> Any:
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    return sa.insert(table)


async def create(
    book: Book,
    entity_type: str,
    *,
    values: Mapping[str, Any],
    status: str,
    reason: Reason,
    actor: Actor,
    metadata: Mapping[str, Any] | None = None,
    entity_id: str | None = None,
    if_absent: bool = False,
    fresh_id: bool = False,
) -> Outcome:
    """Insert an entity and its first fact (previous status NULL) in one transaction.

    ``fresh_id=True`` says the caller drew the id with :func:`codec.new_id` just now, so it cannot
    belong to a purged history and the probe for one is skipped.

    ``values`` are the data columns (``id`` may be among them or given as ``entity_id``). With
    ``if_absent=True`` a row that would violate a unique constraint (its id or e.g. a dedup key) is
    not inserted and a ``conflict`` outcome is returned instead of an error — nothing is written.
    """
    lc = book.policy(entity_type)
    lc.check_reason(reason.code)
    if status not in lc.initial:
        raise TransitionRejected(
            f"{entity_type}: {status!r} is not an initial status (initial: {', '.join(sorted(lc.initial))})",
            rule="initial",
        )
    data = dict(values)
    # A freshly generated id cannot collide with a purged history; a caller's id might.
    chosen = None if fresh_id else entity_id or data.get("id")
    entity_id = entity_id or data.get("id") or new_id()
    data["id"] = entity_id
    unknown = [] if data.keys() <= data_column_names(lc.table) else sorted(data.keys() - data_column_names(lc.table))
    if unknown:
        raise TransitionRejected(
            f"{entity_type}: {', '.join(unknown)} are not data columns of table {lc.table.name!r}", rule="patch"
        )
    content = _fact_content(
        lc, entity_id=entity_id, prev_fact_id=GENESIS, previous=None, status=status, version=1, reason=reason,
        actor=actor, at=book.clock.now(), patch=data, metadata=metadata or {}, idempotency_key=None,
        command_digest=None,
    )
    fact = stored_values(content, GENESIS)
    row = {**data, **_projection(content, fact)}
    if book.conn is None and book.dialect == "postgresql" and chosen is None:
        # A generated id needs no history probe, so the whole create is one statement: run it in
        # autocommit (one round trip, no BEGIN/COMMIT); a single statement is atomic by itself.
        async with book.autocommit() as db:
            inserted = await _insert_row_and_fact(db, lc, row, fact, if_absent)
        if not inserted:
            return Outcome("conflict", entity_type, entity_id, None, None)
        book.committed(entity_type)
        return Outcome("applied", entity_type, entity_id, status, 1, fact["id"], row=row)
    async with book.unit() as unit:
        inserted = await _create_in(unit.db, lc, chosen, row, fact, if_absent)
        if inserted:
            unit.wrote.add(entity_type)
    if not inserted:
        return Outcome("conflict", entity_type, entity_id, None, None)
    return Outcome("applied", entity_type, entity_id, status, 1, fact["id"], row=row)


async def _create_in(
    db: Driver, lc: Lifecycle, chosen: str | None, row: dict[str, Any], fact: dict[str, Any], if_absent: bool
) -> bool:
    """The create's writes in an open transaction; False when ``if_absent`` skipped it."""
    if chosen is not None and await db.fetch(statements.first_fact_of(), {"b_type": lc.entity_type, "b_id": chosen}):
        if if_absent:
            return False
        raise DuplicateEntity(f"{lc.entity_type} {chosen!r} has a history (it was purged); ids are not reused")
    return await _insert_row_and_fact(db, lc, row, fact, if_absent)


async def _insert_row_and_fact(
    db: Driver, lc: Lifecycle, row: dict[str, Any], fact: dict[str, Any], if_absent: bool
) -> bool:
    """Insert a new row and its creation fact; False when ``if_absent`` skipped the row."""
    try:
        if db.postgresql:
            # One round trip: the fact is inserted from the row insert's RETURNING, so a skipped
            # row (if_absent) inserts no fact.
            stmt = statements.insert_row_then_fact(lc.table, tuple(row), if_absent, lc.notify_channel)
            params = {f"r_{k}": v for k, v in row.items()}
            params.update({f"f_{k}": fact[k] for k in statements.FACT_COLUMNS})
            return await db.execute(stmt, params) == 1
        if await db.execute(statements.insert_row(db.dialect.name, lc.table, if_absent, tuple(row)), row) == 0:
            return False
        await db.execute(statements.insert_fact(), fact)
        return True
    except sa.exc.IntegrityError as exc:
        if if_absent or not unique_violation(exc):
            raise
        raise DuplicateEntity(f"{lc.entity_type} {row['id']!r} could not be inserted: {exc.orig}") from exc


def unique_violation(exc: sa.exc.IntegrityError) -> bool:
    """A unique constraint refused the insert (not NOT NULL, CHECK or a foreign key)."""
    orig = exc.orig
    return type(orig).__name__ == "UniqueViolationError" or "UNIQUE constraint failed" in str(orig) or (
        getattr(orig, "sqlstate", None) == "23505"
    )


async def _replayed(conn: Any, cmd: Command) -> Outcome | None:
    found = (
        await conn.execute(
            statements.fact_by_key(), {"b_type": cmd.entity_type, "b_id": cmd.entity_id, "b_key": cmd.idempotency_key}
        )
    ).first()
    if found is None:
        return None
    if found.command_digest != cmd.digest():
        raise IdempotencyMismatch(
            f"idempotency key {cmd.idempotency_key!r} was already used on {cmd.entity_type} {cmd.entity_id} "
            "for a different command; use a new key for a new command"
        )
    return Outcome("applied", cmd.entity_type, cmd.entity_id, found.status, found.version, found.id, replayed=True)


async def transition(
    book: Book,
    entity_type: str,
    entity_id: str,
    target: str,
    *,
    reason: Reason,
    actor: Actor,
    expected: Iterable[str] | str,
    guards: Mapping[str, Any] | None = None,
    patch: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Outcome:
    """Move one entity along a declared edge. See the module docstring for the guarantees.

    >>> await transition(book, "dispatch", did, "delivering", expected="pending",
    ...     guards={"attempt": 0}, patch={"attempt": 1, "next_attempt_at": now + 15},
    ...     reason=Reason("dispatch.delivering.attempt"), actor=Actor("system", "delivery"))  # doctest: +SKIP
    """
    cmd = Command(
        entity_type, entity_id, target, reason, actor,
        (expected,) if isinstance(expected, str) else tuple(expected),
        dict(guards or {}), dict(patch or {}), idempotency_key, dict(metadata or {}),
    )
    return await apply(book, cmd)


async def apply(book: Book, cmd: Command) -> Outcome:
    lc = book.policy(cmd.entity_type)
    lc.check_command(
        cmd.expected, cmd.target, actor_type=cmd.actor.type, patch=cmd.patch, guard=cmd.guards,
        reason_code=cmd.reason.code,
    )
    table = lc.table
    guard_names = tuple(cmd.guards)
    read = statements.read_for_transition(table, guard_names)
    async with book.begin() as tx:
        conn = tx.conn
        assert conn is not None
        if cmd.idempotency_key is not None:
            earlier = await _replayed(conn, cmd)
            if earlier is not None:
                return earlier
        for _ in range(_CAS_RETRIES):
            current = (await conn.execute(read, {"b_id": cmd.entity_id})).first()
            if current is None:
                raise EntityNotFound(f"{cmd.entity_type} {cmd.entity_id!r} does not exist")
            if current.status not in cmd.expected or any(
                getattr(current, g) != v for g, v in cmd.guards.items()
            ):
                if cmd.idempotency_key is not None:
                    earlier = await _replayed(conn, cmd)
                    if earlier is not None:
                        return earlier
                return Outcome("conflict", cmd.entity_type, cmd.entity_id, current.status, current.version)
            version = current.version + 1
            content = _fact_content(
                lc, entity_id=cmd.entity_id, prev_fact_id=current.last_fact_id, previous=current.status,
                status=cmd.target, version=version, reason=cmd.reason, actor=cmd.actor, at=book.clock.now(),
                patch=cmd.patch, metadata=cmd.metadata, idempotency_key=cmd.idempotency_key,
                command_digest=cmd.digest() if cmd.idempotency_key is not None else None,
            )
            fact = stored_values(content, current.chain_hash)
            values = {**cmd.patch, **_projection(content, fact)}
            params = {f"n_{c}": v for c, v in values.items()}
            params.update({f"b_{g}": v for g, v in cmd.guards.items()})
            params.update(b_id=cmd.entity_id, b_version=current.version, b_expected=list(cmd.expected))
            result = await conn.execute(statements.update_if_unchanged(table, guard_names, tuple(values)), params)
            if result.rowcount == 1:
                await conn.execute(statements.insert_fact(), fact)
                mark_touched(conn, cmd.entity_type)
                return Outcome("applied", cmd.entity_type, cmd.entity_id, cmd.target, version, fact["id"])
            # Lost the compare-and-set to a concurrent writer: re-read and decide again.
        return Outcome("conflict", cmd.entity_type, cmd.entity_id, None, None)


async def purge(
    book: Book,
    entity_type: str,
    entity_id: str,
    *,
    reason: Reason,
    actor: Actor,
    expected: Iterable[str] | str | None = None,
    force: bool = False,
) -> Outcome:
    """Delete a row and append its tombstone fact (status NULL) in one transaction.

    Only purgeable statuses (the terminal ones unless declared otherwise) are accepted without
    ``force``. The history stays: ``verify`` accepts facts of a missing row that ends in a tombstone.
    """
    lc = book.policy(entity_type)
    lc.check_reason(reason.code)
    table = lc.table
    async with book.begin() as tx:
        conn = tx.conn
        assert conn is not None
        current = (
            await conn.execute(
                sa.select(table.c.status, table.c.version, table.c.last_fact_id, table.c.chain_hash).where(
                    table.c.id == entity_id
                )
            )
        ).first()
        if current is None:
            raise EntityNotFound(f"{entity_type} {entity_id!r} does not exist")
        allowed = (expected,) if isinstance(expected, str) else tuple(expected or lc.statuses)
        if current.status not in allowed:
            return Outcome("conflict", entity_type, entity_id, current.status, current.version)
        if not force and current.status not in (lc.purgeable or ()):
            raise TransitionRejected(
                f"{entity_type} {entity_id} is {current.status!r}, which is not purgeable "
                f"({', '.join(sorted(lc.purgeable or ())) or 'none'}); pass force=True to purge it anyway",
                rule="purge",
            )
        content = _fact_content(
            lc, entity_id=entity_id, prev_fact_id=current.last_fact_id, previous=current.status, status=None,
            version=current.version + 1, reason=reason, actor=actor, at=book.clock.now(), patch={},
            metadata={"forced": force} if force else {}, idempotency_key=None, command_digest=None,
        )
        fact = stored_values(content, current.chain_hash)
        result = await conn.execute(
            sa.delete(table).where(table.c.id == entity_id, table.c.version == current.version)
        )
        if result.rowcount != 1:
            return Outcome("conflict", entity_type, entity_id, None, None)
        await conn.execute(statements.insert_fact(), fact)
        mark_touched(conn, entity_type)
    return Outcome("applied", entity_type, entity_id, None, content["version"], fact["id"])
