"""History and audit: fold an entity's facts into its state; verify rows against their facts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import sqlalchemy as sa

from .book import Book
from .codec import dumps
from .facts import GENESIS, Fact, decoded, facts_table, fact_hash, legacy_fact_hash
from .policy import Lifecycle
from .screen import Screen, Suspect
from .sweep import sweep


def fold(facts: Iterable[Fact]) -> dict[str, Any] | None:
    """The row an entity's facts describe (None when there are no facts or it was purged)."""
    state: dict[str, Any] | None = None
    for f in facts:
        if f.is_tombstone:
            state = None
            continue
        if state is None:
            state = {}
        state.update(f.patch)
        state.update(
            status=f.status,
            version=f.version,
            updated_at=f.at,
            status_reason_code=f.reason_code,
            status_reason_summary=f.reason_summary,
            last_fact_id=f.id,
            chain_hash=f.hash,
        )
    return state


async def history(book: Book, entity_type: str, entity_id: str) -> list[Fact]:
    """Every fact of one entity, oldest first."""
    book.policy(entity_type)
    t = facts_table
    async with book.read() as conn:
        rows = (
            await conn.execute(
                sa.select(t).where(t.c.entity_type == entity_type, t.c.entity_id == entity_id).order_by(t.c.seq)
            )
        ).fetchall()
    return [Fact.from_row(r) for r in rows]


async def replay(book: Book, entity_type: str, entity_id: str) -> dict[str, Any] | None:
    return fold(await history(book, entity_type, entity_id))


async def as_of(book: Book, entity_type: str, entity_id: str, when: float) -> dict[str, Any] | None:
    """The entity's state as its facts described it at time ``when``."""
    return fold(f for f in await history(book, entity_type, entity_id) if f.at <= when)


async def read_row(book: Book, entity_type: str, entity_id: str) -> dict[str, Any] | None:
    table = book.policy(entity_type).table
    async with book.read() as conn:
        row = (await conn.execute(sa.select(table).where(table.c.id == entity_id))).first()
    return None if row is None else dict(row._mapping)


async def export_jsonl(book: Book, out: IO[str], *, entity_type: str | None = None) -> int:
    """Write facts as JSON lines (oldest first); returns how many."""
    count = 0
    async for fact in _stream_facts(book, entity_type):
        out.write(json.dumps(fact.to_json(), sort_keys=True) + "\n")
        count += 1
    return count


# -- verify -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One discrepancy found by :func:`verify`."""

    kind: str
    entity_type: str
    entity_id: str
    detail: str
    fact_id: str | None = None


@dataclass
class Report:
    """What ``verify`` checked and what it found. ``ok`` when nothing was found."""

    entities: int = 0
    facts: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "entities": self.entities, "facts": self.facts,
                "findings": [asdict(f) for f in self.findings]}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a == b
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return dumps(a) == dumps(b)
    return a == b


def check_entity(lc: Lifecycle, entity_id: str, facts: list[Fact], row: dict[str, Any] | None) -> list[Finding]:
    """Every check of one entity: chain, edges, fold == row."""
    found: list[Finding] = []

    def flag(kind: str, detail: str, fact: Fact | None = None) -> None:
        found.append(Finding(kind, lc.entity_type, entity_id, detail, fact.id if fact else None))

    if not facts:
        flag("row_without_facts", "the row exists but has no facts")
        return found
    prev_id, prev_hash, prev_status, version = GENESIS, GENESIS, None, 0
    for f in facts:
        if f.prev_fact_id != prev_id or f.prev_hash != prev_hash:
            flag("broken_chain", f"fact {f.id} links to {f.prev_fact_id or 'genesis'!r}, expected {prev_id or 'genesis'!r} (a fact is missing or reordered)", f)
        try:
            # Facts written before the stored-text hash carry the earlier definition.
            intact = f.hash in (fact_hash(f.content(), f.prev_hash), legacy_fact_hash(f.content(), f.prev_hash))
        except (TypeError, ValueError):  # a value no fact could have been hashed with
            intact = False
        if not intact:
            flag("hash_mismatch", f"fact {f.id} does not match its hash (edited after it was written)", f)
        if f.previous_status != prev_status and f.prev_fact_id == prev_id:
            flag("status_discontinuity", f"fact {f.id} starts from {f.previous_status!r} but the entity was {prev_status!r}", f)
        if f.version != version + 1:
            flag("version_gap", f"fact {f.id} has version {f.version}, expected {version + 1}", f)
        if f.is_creation:
            if f.status not in lc.initial:
                if f.policy_fingerprint != lc.fingerprint:
                    flag("edge_not_in_current_policy",
                         f"created in {f.status!r} under policy {f.policy_fingerprint}; the current policy "
                         f"{lc.fingerprint} does not allow it as an initial status", f)
                else:
                    flag("forbidden_edge", f"created in {f.status!r}, which is not an initial status", f)
        elif not f.is_tombstone:
            edge = lc.edge(f.previous_status or "", f.status or "")
            allowed = edge is not None and (not edge.actors or f.actor_type in edge.actors)
            if not allowed:
                if f.policy_fingerprint != lc.fingerprint:
                    flag("edge_not_in_current_policy",
                         f"{f.previous_status} -> {f.status} by {f.actor_type} was written under policy "
                         f"{f.policy_fingerprint}; the current policy {lc.fingerprint} does not allow it", f)
                else:
                    flag("forbidden_edge", f"{f.previous_status} -> {f.status} by {f.actor_type} is not allowed", f)
        prev_id, prev_hash, prev_status, version = f.id, f.hash, f.status, f.version
    state = fold(facts)
    if row is None:
        if state is not None:
            flag("missing_row", "facts exist but the row is gone and the history has no tombstone")
        return found
    if state is None:
        flag("purged_row_present", "the history ends in a tombstone but the row exists")
        return found
    for column, value in state.items():
        if column in row and not _same(row[column], value):
            flag("row_mismatch", f"column {column!r} is {row[column]!r}; the facts say {value!r}")
    return found


async def _stream_facts(book: Book, entity_type: str | None) -> AsyncIterator[Fact]:
    t = facts_table
    query = sa.select(t).order_by(t.c.entity_type, t.c.entity_id, t.c.seq)
    if entity_type is not None:
        query = query.where(t.c.entity_type == entity_type)
    async with book.read() as conn:
        result = await conn.stream(query.execution_options(yield_per=2000))
        async for row in result:
            yield Fact.from_row(row)


async def verify(
    book: Book,
    entity_type: str | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    processes: int | None = None,
) -> Report:
    """Check every entity (or one type): row == fold(facts), edges allowed, chains intact.

    Facts and rows are read side by side in entity order, a batch at a time, each entity's facts
    and row in one transaction (:mod:`.sweep`). Every entity first meets a fast screen on the
    stored values (:mod:`.screen`); one that does not pass gets :func:`check_entity`, which says
    what is wrong. On a SQLite file with many facts, ``processes`` more processes (default: one
    per other core) screen ranges of entities alongside this one; ``processes=0``: none.
    ``progress(done_facts, total_facts)`` is called about every 5,000 facts and at the end.
    """
    lifecycles = [book.policy(entity_type)] if entity_type else list(book.registry)
    report = Report()
    report.entities, report.facts, report.findings = await sweep(
        book, lifecycles, _judge, progress=progress, processes=processes)
    return report


def _judge(lc: Lifecycle, screen: Screen, suspects: Iterable[Suspect]) -> list[Finding]:
    """The findings for entities that failed the screen: the full check on their decoded values."""
    found: list[Finding] = []
    for entity_id, facts, row in suspects:
        values = None if row is None else {
            name: decoded(v) if name in screen.json_columns else v for name, v in zip(screen.columns, row)}
        found += check_entity(lc, entity_id, [Fact.from_stored(f) for f in facts], values)
    return found
