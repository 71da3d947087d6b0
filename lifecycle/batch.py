"""Set-based forms of ``create`` and ``transition`` for hot paths (batch enqueue, batch claims).

Same rules as :mod:`.engine` — policy checks before any write, a compare-and-set per row, one fact per
applied row, everything in one transaction — with a constant number of statements per batch:
one read of the rows (locked on PostgreSQL, so the per-row WHERE clauses cannot miss), one
``executemany`` update and one multi-row fact insert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from .book import Book, mark_touched
from .codec import new_id
from . import statements
from .engine import Command, Outcome, _fact_content, _projection, apply
from .errors import DuplicateEntity, TransitionRejected
from .facts import GENESIS, facts_table, insert_values
from .reasons import Actor, Reason
from .schema import LIFECYCLE_COLUMNS

_CHUNK = 500


@dataclass(frozen=True)
class NewEntity:
    """One row for :func:`create_many`."""

    values: Mapping[str, Any]
    status: str
    reason: Reason
    actor: Actor
    metadata: Mapping[str, Any] | None = None


async def create_many(
    book: Book, entity_type: str, items: Sequence[NewEntity], *, if_absent: bool = False
) -> list[Outcome]:
    """Insert many entities and their first facts in one transaction (outcomes in input order).

    With ``if_absent=True`` rows hitting a unique constraint are skipped (``conflict`` outcomes).
    """
    lc = book.policy(entity_type)
    now = book.clock.now()
    prepared: list[tuple[dict[str, Any], dict[str, Any]]] = []
    chosen_ids: set[str] = set()  # caller-chosen ids may collide with a purged history; generated ones cannot
    for item in items:
        lc.check_reason(item.reason.code)
        if item.status not in lc.initial:
            raise TransitionRejected(f"{entity_type}: {item.status!r} is not an initial status", rule="initial")
        data = dict(item.values)
        if "id" in data:
            chosen_ids.add(data["id"])
        else:
            data["id"] = new_id()
        unknown = sorted(k for k in data if k not in lc.table.c or k in LIFECYCLE_COLUMNS)
        if unknown:
            raise TransitionRejected(f"{entity_type}: {', '.join(unknown)} are not data columns", rule="patch")
        content = _fact_content(
            lc, entity_id=data["id"], prev_fact_id=GENESIS, previous=None, status=item.status, version=1,
            reason=item.reason, actor=item.actor, at=now, patch=data, metadata=item.metadata or {},
            idempotency_key=None, command_digest=None,
        )
        fact = insert_values(content, GENESIS)
        prepared.append(({**data, **_projection(content, fact)}, fact))
    inserted: set[str] = set()
    firsts: set[int] = set()
    async with book.begin() as tx:
        conn = tx.conn
        assert conn is not None
        all_ids = sorted(chosen_ids)
        purged: set[str] = set()
        for start in range(0, len(all_ids), _CHUNK):
            chunk_ids = all_ids[start : start + _CHUNK]
            purged.update(r[0] for r in await conn.execute(
                sa.select(facts_table.c.entity_id).distinct().where(
                    facts_table.c.entity_type == entity_type, facts_table.c.entity_id.in_(chunk_ids))))
        if purged and not if_absent:
            raise DuplicateEntity(f"{entity_type} {sorted(purged)[0]!r} has a history (it was purged); ids are not reused")
        seen_ids: set[str] = set()
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for n, (row, _) in enumerate(prepared):
            if row["id"] in purged or (if_absent and row["id"] in seen_ids):
                continue
            seen_ids.add(row["id"])
            firsts.add(n)
            groups.setdefault(tuple(sorted(row)), []).append(row)
        for rows in groups.values():
            for start in range(0, len(rows), _CHUNK):
                chunk = rows[start : start + _CHUNK]
                stmt = statements.insert_row(book.dialect, lc.table, if_absent).returning(lc.table.c.id)
                result = await conn.execute(stmt, chunk)  # executemany: compiled once, batched VALUES
                inserted.update(r[0] for r in result)
        facts = [fact for n, (row, fact) in enumerate(prepared) if n in firsts and row["id"] in inserted]
        for start in range(0, len(facts), _CHUNK):
            await conn.execute(statements.insert_fact(), facts[start : start + _CHUNK])
        if facts:
            mark_touched(conn, entity_type)
    return [
        Outcome("applied", entity_type, row["id"], row["status"], 1, fact["id"], row=row)
        if n in firsts and row["id"] in inserted
        else Outcome("conflict", entity_type, row["id"], None, None)
        for n, (row, fact) in enumerate(prepared)
    ]


async def apply_many(
    book: Book, commands: Sequence[Command], *, lock: Literal["wait", "skip_locked"] = "wait"
) -> list[Outcome]:
    """Apply transitions of one entity type to distinct entities in one transaction.

    Each command is checked against the policy first (a forbidden one raises, nothing written). Rows
    whose status or guards no longer match — or, with ``lock="skip_locked"`` on PostgreSQL, rows
    another transaction holds — get a ``conflict`` outcome; the rest are applied. Commands with an
    idempotency key go through :func:`engine.apply` one by one inside the same transaction.
    """
    if not commands:
        return []
    entity_type = commands[0].entity_type
    lc = book.policy(entity_type)
    ids = [c.entity_id for c in commands]
    if len(set(ids)) != len(ids) or any(c.entity_type != entity_type for c in commands):
        raise ValueError("apply_many takes commands for distinct entities of one entity type")
    for c in commands:
        lc.check_command(c.expected, c.target, actor_type=c.actor.type, patch=c.patch, guard=c.guards,
                         reason_code=c.reason.code)
    table = lc.table
    guard_cols = sorted({g for c in commands for g in c.guards})
    cols = [table.c[n] for n in ("id", "status", "version", "last_fact_id", "chain_hash", *guard_cols)]
    outcomes: dict[str, Outcome] = {}
    async with book.begin() as tx:
        conn = tx.conn
        assert conn is not None
        keyed = [c for c in commands if c.idempotency_key is not None]
        plain = [c for c in commands if c.idempotency_key is None]
        for c in keyed:
            outcomes[c.entity_id] = await apply(tx, c)
        current: dict[str, Any] = {}
        for start in range(0, len(plain), _CHUNK):
            query = sa.select(*cols).where(table.c.id.in_([c.entity_id for c in plain[start : start + _CHUNK]]))
            if book.dialect == "postgresql":
                query = query.with_for_update(skip_locked=lock == "skip_locked")
            for row in await conn.execute(query):
                current[row.id] = row
        now = book.clock.now()
        updates: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        facts: list[dict[str, Any]] = []
        for c in plain:
            row = current.get(c.entity_id)
            if row is None or row.status not in c.expected or any(getattr(row, g) != v for g, v in c.guards.items()):
                outcomes[c.entity_id] = Outcome(
                    "conflict", entity_type, c.entity_id, getattr(row, "status", None), getattr(row, "version", None)
                )
                continue
            content = _fact_content(
                lc, entity_id=c.entity_id, prev_fact_id=row.last_fact_id, previous=row.status, status=c.target,
                version=row.version + 1, reason=c.reason, actor=c.actor, at=now, patch=c.patch,
                metadata=c.metadata, idempotency_key=None, command_digest=None,
            )
            fact = insert_values(content, row.chain_hash)
            values = {**c.patch, **_projection(content, fact)}
            params = {f"new_{k}": v for k, v in values.items()}
            params.update(b_id=c.entity_id, b_version=row.version, b_status=row.status)
            params.update({f"b_guard_{g}": v for g, v in c.guards.items()})
            updates.setdefault(tuple(sorted(params)), []).append(params)
            facts.append(fact)
            outcomes[c.entity_id] = Outcome("applied", entity_type, c.entity_id, c.target, row.version + 1, fact["id"])
        for keys, params in updates.items():
            new_cols = [k[4:] for k in keys if k.startswith("new_")]
            guards = [k[8:] for k in keys if k.startswith("b_guard_")]
            stmt = (
                sa.update(table)
                .where(
                    table.c.id == sa.bindparam("b_id"),
                    table.c.version == sa.bindparam("b_version"),
                    table.c.status == sa.bindparam("b_status"),
                    *(table.c[g].is_not_distinct_from(sa.bindparam(f"b_guard_{g}", type_=table.c[g].type))
                      for g in guards),
                )
                .values({n: sa.bindparam(f"new_{n}") for n in new_cols})
            )
            result = await conn.execute(stmt, params)
            if result.rowcount not in (-1, len(params)):
                # Cannot happen while the rows are locked (PostgreSQL) or the writer lock is held (SQLite);
                # refuse to commit a batch whose facts would not match its rows.
                raise RuntimeError(f"batch update matched {result.rowcount} of {len(params)} locked rows")
        for start in range(0, len(facts), _CHUNK):
            await conn.execute(sa.insert(facts_table), facts[start : start + _CHUNK])
        if facts:
            mark_touched(conn, entity_type)
    return [outcomes[c.entity_id] for c in commands]
