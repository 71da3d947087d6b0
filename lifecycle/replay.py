"""History and audit: fold an entity's facts into its state; verify rows against their facts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import IO, Any

import sqlalchemy as sa

from .book import Book
from .codec import dumps
from .chain import Rule, against_checkpoint, chain_rule, out_of_seq, seq_top, switch_problems
from .factlog import against_tree_head
from .facts import GENESIS, Fact, decoded, facts_table, stored_columns
from .inputs import KEY_CHARS, integer, text, timestamp
from .policy import Lifecycle
from .screen import Screen, Suspect
from .schema import LIFECYCLE_COLUMNS
from .schema import row_defaults
from .sweep import sweep
from .tlog import TreeHead


def fold(facts: Iterable[Fact], defaults: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The row an entity's facts describe (None when there are no facts or it was purged).

    ``defaults`` (``sweep.row_defaults(table)``): the value of each column no fact sets, so the fold
    is the whole row (L7). A patch that is not a JSON object raises ``TypeError``.
    """
    state: dict[str, Any] | None = None
    for f in facts:
        if f.is_tombstone:
            state = None
            continue
        if state is None:
            state = dict(defaults or {})
        if not isinstance(f.patch, dict):
            raise TypeError(f"fact {f.id}: its patch is {type(f.patch).__name__}, not a JSON object")
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
    text("entity_id", entity_id, max_chars=KEY_CHARS)
    t = facts_table
    async with book.read() as conn:
        rows = (
            await conn.execute(
                sa.select(*stored_columns(t)).where(t.c.entity_type == entity_type, t.c.entity_id == entity_id)
                .order_by(t.c.version)
            )
        ).fetchall()
    return [Fact.from_row(r) for r in rows]


async def replay(book: Book, entity_type: str, entity_id: str) -> dict[str, Any] | None:
    """The row the entity's facts describe, every column (see :func:`fold`)."""
    return fold(await history(book, entity_type, entity_id), row_defaults(book.policy(entity_type).table))


async def as_of(book: Book, entity_type: str, entity_id: str, when: datetime | float) -> dict[str, Any] | None:
    """The entity's state as its facts described it at time ``when`` (an aware ``datetime`` or POSIX seconds);
    the row's values as stored (times in seconds)."""
    at = timestamp("when", when)
    facts = await history(book, entity_type, entity_id)
    return fold((f for f in facts if f.at <= at), row_defaults(book.policy(entity_type).table))


async def read_row(book: Book, entity_type: str, entity_id: str) -> dict[str, Any] | None:
    """The entity's current row as a dict, or None when it does not exist; raises ``UnknownEntityType`` or
    ``InvalidArgument`` for bad input.
    """
    table = book.policy(entity_type).table
    text("entity_id", entity_id, max_chars=KEY_CHARS)
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
    notes: list[str] = field(default_factory=list)
    """What could not be checked and is no finding (keyed hashes verified without the key)."""

    @property
    def ok(self) -> bool:
        """True when verify found nothing wrong."""
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data: ``ok``, counts, findings and notes."""
        return {"ok": self.ok, "entities": self.entities, "facts": self.facts,
                "findings": [asdict(f) for f in self.findings], "notes": list(self.notes)}


def _same(a: Any, b: Any) -> bool:
    try:
        if isinstance(a, float) or isinstance(b, float):
            return bool(a == b)
        if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
            return dumps(a) == dumps(b)
        return bool(a == b)
    except (TypeError, ValueError):  # a value no JSON column could hold
        return False


_SHAPES: tuple[tuple[str, tuple[type, ...], bool, str], ...] = (
    # field, the types it may hold, whether None is allowed, what was expected
    ("id", (str,), False, "text"), ("prev_fact_id", (str,), False, "text"),
    ("previous_status", (str,), True, "a status"), ("status", (str,), True, "a status"),
    ("version", (int,), False, "an integer"), ("at", (int, float), False, "a number"),
    ("reason_code", (str,), False, "text"), ("reason_summary", (str,), False, "text"),
    ("actor_type", (str,), False, "text"), ("actor_id", (str,), False, "text"),
    ("policy_fingerprint", (str,), False, "text"), ("prev_hash", (str,), False, "text"), ("hash", (str,), False, "text"),
    ("patch", (dict,), False, "a JSON object"), ("metadata", (dict,), False, "a JSON object"),
    ("evidence_refs", (list,), False, "a JSON array"),
)


def _malformed(f: Fact) -> list[str]:
    """The fields of ``f`` holding a value of a type no fact is written with (L12b)."""
    bad = []
    for name, types, nullable, expected in _SHAPES:
        value = getattr(f, name)
        if value is None and nullable:
            continue
        if type(value) is bool or not isinstance(value, types):
            bad.append(f"{name} is {value!r} ({type(value).__name__}), expected {expected}")
    return bad


def _move_allowed(policy: Lifecycle, f: Fact) -> bool:
    """Whether ``policy`` allows the move ``f`` records (a creation: an initial status)."""
    if f.is_creation:
        return f.status in policy.initial
    if f.is_tombstone:
        return True  # a tombstone may follow any status
    edge = policy.edge(f.previous_status or "", f.status or "")
    return edge is not None and (not edge.actors or f.actor_type in edge.actors)


def _move(f: Fact) -> str:
    return f"created in {f.status!r}" if f.is_creation else f"{f.previous_status} -> {f.status} by {f.actor_type}"


def _judge_move(lc: Lifecycle, f: Fact) -> tuple[str, str] | None:
    """The finding (kind, detail) for the move ``f`` records, judged by the policy it was written under
    (L12, L12c); None when that policy allowed it."""
    policy = lc.policy_for(f.policy_fingerprint)
    if policy is None and lc.accepts is not None:
        accepted = ", ".join(p.fingerprint for p in lc.accepted) or "none"
        return ("unknown_policy", f"fact {f.id} ({_move(f)}) was written under policy {f.policy_fingerprint!r}, "
                f"which is neither the current policy {lc.fingerprint} nor one it accepts ({accepted})")
    if _move_allowed(policy or lc, f):
        return None
    if policy is None:  # no declared history: an older fact is judged by today's policy
        what = "it as an initial status" if f.is_creation else "it"
        return ("edge_not_in_current_policy", f"{_move(f)} was written under policy {f.policy_fingerprint}; "
                f"the current policy {lc.fingerprint} does not allow {what}")
    if policy is lc:
        return ("forbidden_edge", f"{_move(f)}: not an initial status" if f.is_creation else f"{_move(f)} is not allowed")
    return ("forbidden_edge", f"{_move(f)} was written under the accepted policy {policy.fingerprint}, which "
            "never allowed it")


def check_entity(lc: Lifecycle, entity_id: str, facts: list[Fact], row: dict[str, Any] | None,
                 rule: Rule = Rule()) -> list[Finding]:
    """Every check of one entity: shape, chain (hashed as ``rule`` says: plain, or keyed), seq order, edges,
    fold == row."""
    found: list[Finding] = []

    def flag(kind: str, detail: str, fact: Fact | None = None) -> None:
        fact_id = None if fact is None else shown_id(fact.id)  # damage: L12b
        found.append(Finding(kind, lc.entity_type, entity_id, detail, fact_id))

    if not facts:
        flag("row_without_facts", "the row exists but has no facts")
        return found
    prev_id, prev_hash, prev_status, version = GENESIS, GENESIS, None, 0
    top: tuple[int, Any] | None = None  # the highest (seq, version) so far (L12d)
    foldable: list[Fact] = []
    for f in facts:
        bad = _malformed(f)
        if bad:
            flag("malformed_fact", f"fact {f.id!r}: {'; '.join(bad)}", f)
        if f.prev_fact_id != prev_id or f.prev_hash != prev_hash:
            flag("broken_chain", f"fact {f.id} links to {f.prev_fact_id or 'genesis'!r}, expected {prev_id or 'genesis'!r} (a fact is missing or reordered)", f)
        intact = rule.intact(f)
        if intact is False and rule.keyed(f):
            flag("hash_mismatch", f"fact {f.id} does not match its keyed hash: forged without the chain key, edited "
                 "after it was written, or written with another key", f)
        elif intact is False:
            flag("hash_mismatch", f"fact {f.id} does not match its hash (edited after it was written)", f)
        if f.previous_status != prev_status and f.prev_fact_id == prev_id:
            flag("status_discontinuity", f"fact {f.id} starts from {f.previous_status!r} but the entity was {prev_status!r}", f)
        if f.version != version + 1:
            flag("version_gap", f"fact {f.id} has version {f.version!r}, expected {version + 1}", f)
        reordered = out_of_seq(f, top)
        if reordered is not None:
            flag("seq_out_of_order", reordered, f)
        top = seq_top(f, top)
        verdict = _judge_move(lc, f)
        if verdict is not None:
            flag(*verdict, f)
        foldable.append(f if isinstance(f.patch, dict) else replace(f, patch={}))
        prev_id, prev_hash, prev_status = f.id, f.hash, f.status
        version = f.version if type(f.version) is int else version + 1
    state = fold(foldable, row_defaults(lc.table))
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
    """Every fact (or every fact of one type) in entity order, read in batches from one connection."""
    t = facts_table
    query = sa.select(*stored_columns(t)).order_by(t.c.entity_type, t.c.entity_id, t.c.version)
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
    checkpoint: Mapping[str, Any] | None = None,
    tree_head: TreeHead | None = None,
) -> Report:
    """Check every entity (or one type): row == fold(facts), edges allowed, chains intact.

    Facts and rows are read side by side in entity order, a batch at a time, each entity's facts
    and row in one transaction (:mod:`.sweep`). Every entity first meets a fast screen on the
    stored values (:mod:`.screen`); one that does not pass gets :func:`check_entity`, which says
    what is wrong. On a SQLite file with many facts, ``processes`` more processes (default: one
    per other core) screen ranges of entities alongside this one; ``processes=0``: none.
    ``progress(done_facts, total_facts)`` is called about every 5,000 facts and at the end.

    A keyed chain (:mod:`.chain`): with ``book.chain_key`` every fact after the recorded switch-over
    must carry its HMAC and the facts before it must give the recorded root; a wrong key, a missing or
    forged record is one finding and nothing else is checked. ``checkpoint`` (a checkpoint's JSON,
    its signature already checked by the caller): the heads it covers must be intact (``chain.against_checkpoint``).
    ``tree_head`` (a parsed C2SP checkpoint, its signature checked likewise): the first ``tree_head.size`` facts in
    seq order must give its root, whatever ``entity_type`` narrows (``factlog.against_tree_head``).
    """
    lifecycles = [book.policy(entity_type)] if entity_type else list(book.registry)
    if processes is not None:
        integer("processes", processes, low=0, high=256)
    report = Report()
    rule, problems, report.notes, switch = await chain_rule(book)
    report.findings = [Finding(*p) for p in problems]
    if rule is None:
        return report
    report.entities, report.facts, found = await sweep(
        book, lifecycles, _judge_by(rule), progress=progress, processes=processes, key=rule.key,
        keyed_after=rule.keyed_after)
    report.findings += found
    if switch is not None and rule.key is not None:
        report.findings += [Finding(*p) for p in await switch_problems(book, switch)]
    if checkpoint is not None:
        report.findings += [Finding(*p) for p in await against_checkpoint(book, checkpoint)]
    if tree_head is not None:
        report.findings += [Finding(*p) for p in await against_tree_head(book, tree_head)]
    if entity_type is None:
        report.findings += await _unregistered(book)
    return report


def _judge_by(rule: Rule) -> Callable[[Lifecycle, Screen, Iterable[Suspect]], list[Finding]]:
    def judge(lc: Lifecycle, screen: Screen, suspects: Iterable[Suspect]) -> list[Finding]:
        return _judge(lc, screen, suspects, rule)
    return judge


def shown_id(value: Any) -> str:
    """An id as a finding names it: text as plain ``str`` (text read leniently is a subclass), anything else damage
    stored (L12b) by its repr."""
    return str(value) if isinstance(value, str) else repr(value)


def _judge(lc: Lifecycle, screen: Screen, suspects: Iterable[Suspect], rule: Rule = Rule()) -> list[Finding]:
    """The findings for entities that failed the screen: the full check on their decoded values."""
    found: list[Finding] = []
    for entity_id, facts, row in suspects:
        try:
            values = None if row is None else {
                name: decoded(v) if name in screen.json_columns else v for name, v in zip(screen.columns, row)}
            entity_id = shown_id(entity_id)  # damage stored a blob as the id (L12b)
            found += check_entity(lc, entity_id, [Fact.from_stored(f) for f in facts], values, rule)
        except Exception as exc:  # noqa: BLE001 - damage of any shape is a finding, never a crash (L12b)
            found.append(Finding("unreadable", lc.entity_type, shown_id(entity_id),
                                 f"the entity could not be checked ({type(exc).__name__}: {exc})"))
    return found


async def _unregistered(book: Book) -> list[Finding]:
    """Facts of entity types, and managed tables with rows, that no registered lifecycle covers (L12a):
    verify checks only what it knows, so what it does not know must not pass as clean."""
    found: list[Finding] = []
    known = {lc.entity_type for lc in book.registry}
    managed = {lc.table.name for lc in book.registry}
    shape = {"id", *LIFECYCLE_COLUMNS}
    t = facts_table
    async with book.read() as conn, book.reads.lenient(conn):
        counts = (await conn.execute(sa.select(t.c.entity_type, sa.func.count()).group_by(t.c.entity_type))).all()
        for entity_type, n in sorted(counts, key=lambda c: str(c[0])):
            if entity_type not in known:
                found.append(Finding(
                    "unregistered_type", str(entity_type), "",
                    f"{n} fact(s) of entity type {entity_type!r}, which no registered lifecycle declares, were not "
                    "checked; open the book with the application's registry (or verify one type at a time)"))
        tables = await conn.run_sync(_unmanaged_columns, managed)
        for name in sorted(tables):
            if not shape <= tables[name]:
                continue
            rows = (await conn.execute(sa.select(sa.func.count()).select_from(sa.table(name)))).scalar()
            if rows:
                found.append(Finding(
                    "unregistered_table", "", "",
                    f"table {name!r} has the lifecycle columns and {rows} row(s), but no registered lifecycle "
                    "manages it, so they were not checked"))
    return found


def _unmanaged_columns(sync: sa.Connection, managed: set[str]) -> dict[str, set[str]]:
    """The column names of each table of the default schema that no registered lifecycle manages (the managed
    ones are not reflected: on SQLite each table costs a query of its own)."""
    inspector = sa.inspect(sync)
    others = [name for name in inspector.get_table_names() if name not in managed]
    if not others:
        return {}
    return {name: {c["name"] for c in columns}
            for (_, name), columns in inspector.get_multi_columns(filter_names=others).items()}


stream_facts = _stream_facts
"""Every fact (of one type, or all) in (type, id, version) order, streamed: ``async for fact in stream_facts(book, None)``."""
