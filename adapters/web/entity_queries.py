"""One entity as the console shows it: its row, its facts as a timeline, the row as of a time, the check
of its own chain and row, and what hangs off a notification or a schedule.

The row and the facts are read in one snapshot (the backend's read transaction), so the check of this
entity is the one ``verify`` makes of it (``check_entity`` under the database's chain rule) and never
reports a move that committed between two reads. Nothing here verifies more than the one entity.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, EntityNotFound, Lifecycle
from statebook.lifecycle.chain import chain_rule
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.facts import Fact, decoded, facts_table, stored_columns
from statebook.lifecycle.inputs import KEY_CHARS, text, timestamp
from statebook.lifecycle.replay import Finding, check_entity, fold
from statebook.lifecycle.schema import row_defaults
from statebook.outbox import notifications as notes
from statebook.outbox.notifications.recovery import replay_block
from statebook.outbox.notifications.schema import notifications as notifications_table
from statebook.scheduler import list_runs
from statebook.scheduler.schema import schedule_runs

from .queries import masked

__all__ = ["Check", "EntityView", "NotificationPart", "RunPart", "SchedulePart", "Step", "check", "entity"]

RUNS_SHOWN = 50


@dataclass(frozen=True)
class Step:
    """One fact on an entity's timeline (patch and metadata masked)."""

    seq: int | None
    id: str
    at: float
    actor_type: str
    actor_id: str
    reason_code: str
    reason_summary: str
    previous_status: str | None
    status: str | None
    version: int
    patch: Any
    metadata: Any
    evidence_refs: Any
    prev_fact_id: str
    prev_hash: str
    hash: str

    @classmethod
    def of(cls, f: Fact) -> Step:
        """The step of fact ``f``."""
        return cls(f.seq, f.id, f.at, f.actor_type, masked(f.actor_id), f.reason_code, masked(f.reason_summary),
                   f.previous_status, f.status, f.version, masked(f.patch), masked(f.metadata),
                   masked(f.evidence_refs), f.prev_fact_id, f.prev_hash, f.hash)


@dataclass(frozen=True)
class Check:
    """The verify of one entity: ``ok`` when nothing was found; ``notes`` say what could not be checked."""

    entity_type: str
    entity_id: str
    facts: int
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    at: float

    @property
    def ok(self) -> bool:
        """True when the entity's chain is intact and its row is the fold of its facts."""
        return not self.findings


@dataclass(frozen=True)
class NotificationPart:
    """A notification's delivery and recovery: cycles of channel attempts, lineage, replay block, response."""

    cycles: tuple[tuple[int, tuple[dict[str, Any], ...]], ...]
    owner: str
    followers: tuple[str, ...]
    successor: str | None
    replayed_in: str | None
    replay_blocked_by: str | None
    replay_block_reason: str | None
    response: dict[str, Any] | None


@dataclass(frozen=True)
class SchedulePart:
    """A schedule's latest runs, newest first, each with the follow-up runs it chained to."""

    runs: tuple[dict[str, Any], ...]
    follow_ups: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class RunPart:
    """A schedule run's place in its follow-up chain: the chain above it (root first) and its follow-ups."""

    schedule_id: str | None
    parents: tuple[str, ...]
    children: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class EntityView:
    """Everything the entity page shows; ``row`` is None once the entity was purged (its history stays)."""

    entity_type: str
    entity_id: str
    row: dict[str, Any] | None
    timeline: tuple[Step, ...]
    check: Check
    as_of: float | None = None
    row_as_of: dict[str, Any] | None = None
    notification: NotificationPart | None = None
    schedule: SchedulePart | None = None
    run: RunPart | None = None


async def _read(book: Book, lc: Lifecycle, entity_id: str) -> tuple[dict[str, Any] | None, list[Fact]]:
    """The entity's row (as stored, JSON decoded) and its facts, oldest first, from one snapshot."""
    f, t = facts_table, lc.table
    facts_q = (sa.select(*stored_columns(f), f.c.seq).where(f.c.entity_type == lc.entity_type, f.c.entity_id == entity_id)
               .order_by(f.c.version))
    async with book.read() as conn:
        if conn.in_transaction():
            return await _both(conn, t, facts_q, entity_id)
        async with book.reads.snapshot(conn):
            return await _both(conn, t, facts_q, entity_id)


async def _both(conn: Any, t: sa.Table, facts_q: sa.Select[Any], entity_id: str
                ) -> tuple[dict[str, Any] | None, list[Fact]]:
    found = (await conn.execute(sa.select(*stored_columns(t)).where(t.c.id == entity_id))).first()
    facts = [Fact.from_row(r) for r in await conn.execute(facts_q)]
    json_columns = {c.name for c in t.columns if isinstance(c.type, sa.JSON)}
    row = None if found is None else {k: decoded(v) if k in json_columns else v for k, v in found._mapping.items()}
    return row, facts


def _id(entity_type: str, entity_id: str) -> str:
    try:
        return text("entity_id", entity_id, max_chars=KEY_CHARS, empty=False)
    except InvalidArgument:
        raise EntityNotFound(f"{entity_type} {entity_id[:60]!r} not found") from None


async def check(book: Book, entity_type: str, entity_id: str) -> Check:
    """Verify one entity: its chain (hashed as the database's chain rule says) and row == fold(facts)."""
    lc = book.policy(entity_type)
    row, facts = await _read(book, lc, _id(entity_type, entity_id))
    if row is None and not facts:
        raise EntityNotFound(f"{entity_type} {entity_id!r} not found")
    return await _check(book, lc, entity_id, row, facts)


async def _check(book: Book, lc: Lifecycle, entity_id: str, row: dict[str, Any] | None, facts: list[Fact]) -> Check:
    rule, problems, notes_, _ = await chain_rule(book)
    found = [Finding(*p) for p in problems]
    if rule is not None:
        found += check_entity(lc, entity_id, facts, row, rule)
    return Check(lc.entity_type, entity_id, len(facts), tuple(found), tuple(notes_), float(book.clock.now()))


async def entity(book: Book, entity_type: str, entity_id: str, *, as_of: float | None = None) -> EntityView:
    """The entity page's data; ``as_of`` (POSIX seconds) adds the row as its facts described it then.
    Raises ``UnknownEntityType``, ``EntityNotFound`` (no row and no facts) or ``InvalidArgument``."""
    lc = book.policy(entity_type)
    row, facts = await _read(book, lc, _id(entity_type, entity_id))
    if row is None and not facts:
        raise EntityNotFound(f"{entity_type} {entity_id!r} not found")
    then = None
    if as_of is not None:
        as_of = timestamp("as_of", as_of)
        then = fold((f for f in facts if f.at <= as_of), row_defaults(lc.table))
    view = EntityView(entity_type, entity_id, None if row is None else masked(row), tuple(Step.of(f) for f in facts),
                      await _check(book, lc, entity_id, row, facts), as_of, None if then is None else masked(then))
    if row is None:
        return view
    if entity_type == "notification":
        return _with(view, notification=await _notification(book, row))
    if entity_type == "schedule":
        return _with(view, schedule=await _schedule(book, entity_id))
    if entity_type == "schedule_run":
        return _with(view, run=await _run(book, row))
    return view


def _with(view: EntityView, **part: Any) -> EntityView:
    return replace(view, **part)


async def _notification(book: Book, row: dict[str, Any]) -> NotificationPart:
    nid = row["id"]
    attempts = await notes.notification_attempts(book, nid)
    cycles: dict[int, list[dict[str, Any]]] = {}
    for a in attempts:
        cycles.setdefault(a.cycle, []).append(masked(a.model_dump()))
    t = notifications_table
    async with book.read() as conn:
        followers = [r.id for r in await conn.execute(
            sa.select(t.c.id).where(t.c.obligation_owner_id == nid).order_by(t.c.created_at, t.c.id).limit(RUNS_SHOWN))]
    block = await replay_block(book, row, now=book.clock.now()) if row["status"] == "failed" else None
    response = await notes.get_response(book, nid)
    return NotificationPart(
        cycles=tuple((c, tuple(items)) for c, items in sorted(cycles.items())),
        owner=row["obligation_owner_id"] or nid, followers=tuple(followers), successor=row["dedup_successor_id"],
        replayed_in=row["replayed_in"], replay_blocked_by=None if block is None else block.blocked_by,
        replay_block_reason=None if block is None else block.reason,
        response=None if response is None else masked(response.model_dump()),
    )


async def _children(book: Book, parent_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The follow-up runs of each of ``parent_ids`` (oldest first)."""
    if not parent_ids:
        return {}
    t = schedule_runs
    query = (sa.select(t.c.id, t.c.chain_parent_id, t.c.status, t.c.chain_depth, t.c.created_at, t.c.exit_code)
             .where(t.c.chain_parent_id.in_(parent_ids)).order_by(t.c.created_at, t.c.id))
    out: dict[str, list[dict[str, Any]]] = {}
    async with book.read() as conn:
        for r in await conn.execute(query):
            out.setdefault(r.chain_parent_id, []).append(dict(r._mapping))
    return out


async def _schedule(book: Book, schedule_id: str) -> SchedulePart:
    runs = [masked(r.model_dump()) for r in await list_runs(book, schedule_id, limit=RUNS_SHOWN)]
    children = await _children(book, [r["id"] for r in runs])
    return SchedulePart(tuple(runs), {k: tuple(c["id"] for c in v) for k, v in children.items()})


async def _run(book: Book, row: dict[str, Any]) -> RunPart:
    parents: list[str] = []
    parent, seen = row["chain_parent_id"], {row["id"]}
    t = schedule_runs
    async with book.read() as conn:
        while parent is not None and parent not in seen and len(parents) < RUNS_SHOWN:
            seen.add(parent)
            parents.append(parent)
            parent = (await conn.execute(sa.select(t.c.chain_parent_id).where(t.c.id == parent))).scalar()
    children = (await _children(book, [row["id"]])).get(row["id"], [])
    return RunPart(row["schedule_id"], tuple(reversed(parents)), tuple(masked(c) for c in children))
