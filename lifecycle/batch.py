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
from .codec import dumps, new_id
from .driver import Driver, driver
from . import statements
from .engine import Command, Outcome, _fact_content, _projection, apply, unique_violation
from .errors import DuplicateEntity, TransitionRejected
from .facts import GENESIS, stored_values
from .reasons import Actor, Reason
from .schema import data_column_names

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
        unknown = [] if data.keys() <= data_column_names(lc.table) else sorted(data.keys() - data_column_names(lc.table))
        if unknown:
            raise TransitionRejected(f"{entity_type}: {', '.join(unknown)} are not data columns", rule="patch")
        content = _fact_content(
            lc, entity_id=data["id"], prev_fact_id=GENESIS, previous=None, status=item.status, version=1,
            reason=item.reason, actor=item.actor, at=now, patch=data, metadata=item.metadata or {},
            idempotency_key=None, command_digest=None,
        )
        fact = stored_values(content, GENESIS)
        prepared.append(({**data, **_projection(content, fact)}, fact))
    firsts: set[int] = set()
    async with book.unit() as unit:
        inserted = await _create_many_in(unit.db, lc, prepared, chosen_ids, if_absent, firsts)
        if inserted:
            unit.wrote.add(entity_type)
    return [
        Outcome("applied", entity_type, row["id"], row["status"], 1, fact["id"], row=row)
        if n in firsts and row["id"] in inserted
        else Outcome("conflict", entity_type, row["id"], None, None)
        for n, (row, fact) in enumerate(prepared)
    ]


async def _create_many_in(
    db: Driver, lc: Any, prepared: list[tuple[dict[str, Any], dict[str, Any]]], chosen_ids: set[str],
    if_absent: bool, firsts: set[int],
) -> set[str]:
    """create_many's writes in an open transaction: the ids inserted (``firsts``: the items tried)."""
    entity_type = lc.entity_type
    all_ids = sorted(chosen_ids)
    purged: set[str] = set()
    for start in range(0, len(all_ids), _CHUNK):
        chunk = all_ids[start : start + _CHUNK]
        found = await db.fetch(statements.histories_of(db.dialect.name),
                               {"b_type": entity_type, "b_ids": chunk if db.postgresql else dumps(chunk)})
        purged.update(r[0] for r in found)
    if purged and not if_absent:
        raise DuplicateEntity(f"{entity_type} {sorted(purged)[0]!r} has a history (it was purged); ids are not reused")
    seen_ids: set[str] = set()
    groups: dict[tuple[str, ...], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for n, (row, fact) in enumerate(prepared):
        if row["id"] in purged or (if_absent and row["id"] in seen_ids):
            continue
        seen_ids.add(row["id"])
        firsts.add(n)
        groups.setdefault(tuple(row), []).append((row, fact))
    inserted: set[str] = set()
    try:
        for columns, pairs in groups.items():
            for start in range(0, len(pairs), _CHUNK):
                inserted.update(await _insert_chunk(db, lc.table, columns, pairs[start : start + _CHUNK], if_absent))
    except sa.exc.IntegrityError as exc:
        if if_absent or not unique_violation(exc):
            raise
        raise DuplicateEntity(f"{entity_type}: a row could not be inserted: {exc.orig}") from exc
    return inserted


async def _insert_chunk(
    db: Driver, table: sa.Table, columns: tuple[str, ...], pairs: list[tuple[dict[str, Any], dict[str, Any]]],
    if_absent: bool,
) -> set[str]:
    """Insert rows (all with ``columns``) and the facts of those inserted; their ids."""
    if db.postgresql:
        rows, facts = [row for row, _ in pairs], [fact for _, fact in pairs]
        stmt = statements.insert_rows_then_facts(
            table, columns, if_absent, statements.constant_keys(rows, columns, frozenset({"id"})),
            statements.constant_keys(facts, statements.FACT_COLUMNS, statements.FACT_VARYING),
        )
        params = statements.set_params(stmt, rows, facts)
        return {r[0] for r in await db.fetch(stmt.statement, params)}
    before = db.raw.total_changes
    await db.executemany(statements.insert_row(db.dialect.name, table, if_absent, columns), [row for row, _ in pairs])
    if if_absent and db.raw.total_changes - before != len(pairs):  # some were skipped
        ids = await _heads_are(db, table, [(row["id"], fact["id"]) for row, fact in pairs])
    else:
        ids = {row["id"] for row, _ in pairs}
    await db.executemany(statements.insert_fact(), [fact for row, fact in pairs if row["id"] in ids])
    return ids


async def _heads_are(db: Driver, table: sa.Table, planned: list[tuple[str, str]]) -> set[str]:
    """SQLite, after an executemany that fell short: the ids whose row now projects the fact planned
    for it (entity id, fact id) — exactly the rows the batch wrote."""
    heads = await db.fetch(statements.rows_for_update(db.dialect.name, table, ("id", "last_fact_id"), None),
                           {"b_ids": dumps([entity_id for entity_id, _ in planned])})
    head_of = {head[0]: head[1] for head in heads}
    return {entity_id for entity_id, fact_id in planned if head_of.get(entity_id) == fact_id}


async def apply_many(
    book: Book,
    commands: Sequence[Command],
    *,
    lock: Literal["wait", "skip_locked"] = "wait",
    seen: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Outcome]:
    """Apply transitions of one entity type to distinct entities in one transaction.

    Each command is checked against the policy first (a forbidden one raises, nothing written). Rows
    whose status or guards no longer match — or, with ``lock="skip_locked"`` on PostgreSQL, rows
    another transaction holds — get a ``conflict`` outcome; the rest are applied. Commands with an
    idempotency key go through :func:`engine.apply` one by one inside the same transaction.

    ``seen`` maps entity ids to their rows as the caller last read them (``status``, ``version``,
    ``last_fact_id``, ``chain_hash`` and the guarded columns) — e.g. the row a claim just wrote,
    kept from its :attr:`Outcome.chain_hash`. Those rows are not read again: the compare-and-set on
    version, status and guards decides, so a row changed since then gets ``conflict``. With every
    row seen and one statement's worth of work, PostgreSQL runs it as ONE autocommit statement
    (row updates and facts together, atomic by themselves).
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
    guard_cols = tuple(sorted({g for c in commands for g in c.guards}))
    names = ("id", "status", "version", "last_fact_id", "chain_hash", *guard_cols)
    outcomes: dict[str, Outcome] = {}
    seen = seen or {}
    keyed = [c for c in commands if c.idempotency_key is not None]
    plain = [c for c in commands if c.idempotency_key is None]
    if (
        book.conn is None and book.dialect == "postgresql" and not keyed and len(plain) <= _CHUNK
        and all(c.entity_id in seen for c in plain)
        and len({(tuple(c.guards), tuple(c.patch)) for c in plain}) == 1
    ):
        # Nothing to read and one statement to write: no BEGIN/COMMIT round trips.
        async with book.autocommit() as db:
            written = await _write(book, lc, db, plain, seen, outcomes, trusted=set())
        if written:
            book.committed(entity_type)
        return [outcomes[c.entity_id] for c in commands]
    read = statements.rows_for_update(book.dialect, table, names, lock if book.dialect == "postgresql" else None)

    async def read_and_write(db: Driver) -> int:
        current: dict[str, Mapping[str, Any]] = {c.entity_id: seen[c.entity_id] for c in plain if c.entity_id in seen}
        unseen = [c.entity_id for c in plain if c.entity_id not in seen]
        for start in range(0, len(unseen), _CHUNK):
            chunk = unseen[start : start + _CHUNK]
            for r in await db.fetch(read, {"b_ids": chunk if db.postgresql else dumps(chunk)}):
                current[r[0]] = dict(zip(names, r))
        return await _write(book, lc, db, plain, current, outcomes, trusted=set(unseen))

    if not keyed:
        async with book.unit() as unit:
            if await read_and_write(unit.db):
                unit.wrote.add(entity_type)
        return [outcomes[c.entity_id] for c in commands]
    async with book.begin() as tx:  # keyed commands go through apply(), which needs the bound book
        assert tx.conn is not None
        for c in keyed:
            outcomes[c.entity_id] = await apply(tx, c)
        if await read_and_write(await driver(tx.conn)):
            mark_touched(tx.conn, entity_type)
    return [outcomes[c.entity_id] for c in commands]


async def _write(
    book: Book, lc: Any, db: Driver, plain: Sequence[Command], current: Mapping[str, Mapping[str, Any]],
    outcomes: dict[str, Outcome], trusted: set[str],
) -> int:
    """Plan each command against its current row and write the applicable ones; rows written.

    Rows in ``trusted`` were read under lock (or under SQLite's write lock) in this transaction, so
    their compare-and-set cannot miss; a miss there refuses the whole batch. Other rows (the
    caller's ``seen``) may have changed since: a miss is that command's ``conflict``.
    """
    entity_type = lc.entity_type
    now = book.clock.now()
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for c in plain:
        row = current.get(c.entity_id)
        if row is None or row["status"] not in c.expected or any(row[g] != v for g, v in c.guards.items()):
            outcomes[c.entity_id] = Outcome(
                "conflict", entity_type, c.entity_id, None if row is None else row["status"],
                None if row is None else row["version"],
            )
            continue
        version = row["version"] + 1
        content = _fact_content(
            lc, entity_id=c.entity_id, prev_fact_id=row["last_fact_id"], previous=row["status"], status=c.target,
            version=version, reason=c.reason, actor=c.actor, at=now, patch=c.patch,
            metadata=c.metadata, idempotency_key=None, command_digest=None,
        )
        fact = stored_values(content, row["chain_hash"])
        values = {**c.patch, **_projection(content, fact)}
        params = {f"n_{k}": v for k, v in values.items()}
        params.update(b_id=c.entity_id, b_version=row["version"], b_status=row["status"],
                      b_last_fact_id=row["last_fact_id"])
        params.update({f"b_{g}": v for g, v in c.guards.items()})
        groups.setdefault((tuple(c.guards), tuple(values)), []).append((params, fact))
        outcomes[c.entity_id] = Outcome(
            "applied", entity_type, c.entity_id, c.target, version, fact["id"], chain_hash=fact["hash"]
        )
    written = 0
    for (guards, columns), pairs in groups.items():
        for start in range(0, len(pairs), _CHUNK):
            chunk = pairs[start : start + _CHUNK]
            updated = await _update_chunk(db, lc.table, guards, columns, chunk)
            written += len(updated)
            for params, _ in chunk:
                entity_id = params["b_id"]
                if entity_id in updated:
                    continue
                if entity_id in trusted:
                    # Refuse to commit a batch whose facts would not match its rows.
                    raise RuntimeError(f"batch update missed locked row {entity_type} {entity_id}")
                outcomes[entity_id] = Outcome("conflict", entity_type, entity_id, None, None)
    return written


async def _update_chunk(
    db: Driver, table: sa.Table, guards: tuple[str, ...], columns: tuple[str, ...],
    pairs: list[tuple[dict[str, Any], dict[str, Any]]],
) -> set[str]:
    """Compare-and-set updates of rows sharing guard and column names, plus the facts of the rows
    updated; their ids."""
    if db.postgresql:
        rows, facts = [p for p, _ in pairs], [fact for _, fact in pairs]
        stmt = statements.update_many_then_facts(
            table, guards, columns, statements.constant_keys(rows, tuple(rows[0]), frozenset({"b_id"})),
            statements.constant_keys(facts, statements.FACT_COLUMNS, statements.FACT_VARYING),
        )
        params = statements.set_params(stmt, rows, facts)
        return {r[0] for r in await db.fetch(stmt.statement, params)}
    # SQLite (the write lock is held): executemany reports only a total. When it falls short, a
    # row whose head is now this batch's fact is one that was updated.
    before = db.raw.total_changes
    await db.executemany(statements.update_if_unchanged_one(table, guards, columns), [p for p, _ in pairs])
    if db.raw.total_changes - before == len(pairs):
        applied = pairs
    else:
        written = await _heads_are(db, table, [(p["b_id"], fact["id"]) for p, fact in pairs])
        applied = [(p, fact) for p, fact in pairs if p["b_id"] in written]
    await db.executemany(statements.insert_fact(), [fact for _, fact in applied])
    return {p["b_id"] for p, _ in applied}
