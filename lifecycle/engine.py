"""``create``, ``transition`` and ``purge`` (and their batch forms): the only code that writes status or facts.

Every command runs the same way (specs/lifecycle.md L4, L5, L17): the policy checks it before any
write; the rows it moves are read in the command's unit — locked on PostgreSQL, under the single
writer on SQLite, or taken as the caller ``seen`` them; :mod:`.plan` makes each fact and the row
it projects; the book's :class:`~.store.Store` writes rows and facts in ONE transaction with the
compare-and-set (version, status, chain head, guards) in the statement's WHERE clause. A conflict
writes nothing. A single command is a batch of one; it raises :class:`~.errors.TransitionConflict` when
it loses, unless the caller asks for the outcome (``on_conflict="return"``), while a batch answers each
command with its :class:`Outcome`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from . import tracing
from .book import Book
from .codec import new_id
from .errors import (
    ConstraintViolation, DuplicateEntity, EntityNotFound, IdempotencyMismatch, InvalidArgument, StorageError,
    TransitionConflict, TransitionRejected,
)
from .head import HEAD, Head
from .inputs import KEY_CHARS, check_columns, check_reason_actor, plain_texts, text
from .plan import (
    Command, NewEntity, Outcome, applied, conflict, differing, matches, plan_create, plan_purge, plan_transition,
)
from .policy import Lifecycle
from .reasons import Actor, Reason
from .schema import data_column_names, row_defaults
from .store import RowWrite, Store, Unit

__all__ = ["Command", "NewEntity", "OnConflict", "Outcome", "apply", "apply_many", "create", "create_many", "purge",
           "purge_many", "transition"]

BATCH = 500
"""Rows per statement: plans are chunked so a statement's parameters stay bounded."""

OnConflict = Literal["raise", "return"]
"""What a single command does when it loses its compare-and-set: raise :class:`~.errors.TransitionConflict`
(the default), or return the ``conflict`` :class:`Outcome` to a caller that handles it."""


# -- create -----------------------------------------------------------------------------------------
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

    ``values`` are the data columns (``id`` may be among them or given as ``entity_id``). With
    ``if_absent=True`` a row that would violate a unique constraint (its id or e.g. a dedup key) is
    not inserted and a ``conflict`` outcome is returned instead of an error — nothing is written.
    ``fresh_id=True`` says the caller drew the id with :func:`codec.new_id` just now, so it cannot
    belong to a purged history and the probe for one is skipped.
    """
    data = dict(values)
    if entity_id is not None:
        data["id"] = entity_id
    [outcome] = await _create(book, entity_type, [NewEntity(data, status, reason, actor, metadata)], if_absent,
                              trust_ids=fresh_id)
    return outcome


async def create_many(
    book: Book, entity_type: str, items: Sequence[NewEntity], *, if_absent: bool = False, fresh_ids: bool = False
) -> list[Outcome]:
    """Insert many entities and their first facts in one transaction (outcomes in input order).

    With ``if_absent=True`` rows hitting a unique constraint are skipped (``conflict`` outcomes).
    ``fresh_ids=True`` says every id given was drawn with :func:`codec.new_id` just now (as
    ``create``'s ``fresh_id``), so none can belong to a purged history and the probe for one is skipped.
    """
    return await _create(book, entity_type, items, if_absent, trust_ids=fresh_ids)


async def _create(book: Book, entity_type: str, items: Sequence[NewEntity], if_absent: bool, *,
                  trust_ids: bool) -> list[Outcome]:
    lc = book.policy(entity_type)
    at = book.clock.now()
    columns = data_column_names(lc.table)
    defaults = row_defaults(lc.table)
    plans: list[RowWrite] = []
    chosen: list[str] = []  # caller-chosen ids may belong to a purged history; generated ones cannot
    limits = book.limits
    for item in items:
        if not isinstance(item, NewEntity):
            raise InvalidArgument(f"items: expected NewEntity, got {type(item).__name__}", argument="items",
                                  rule="type")
        check_reason_actor(item.reason, item.actor, item.metadata, limits)
        lc.check_reason(item.reason.code)
        if item.status not in lc.initial:
            raise TransitionRejected(
                f"{entity_type}: {item.status!r} is not an initial status (initial: {', '.join(sorted(lc.initial))})",
                rule="initial",
            )
        data = dict(item.values)
        if data.get("id") is None:
            data["id"] = new_id()
        elif not trust_ids:
            chosen.append(data["id"])
        if not data.keys() <= columns:
            unknown = ", ".join(sorted(map(repr, data.keys() - columns)))
            raise TransitionRejected(f"{entity_type}: {unknown} are not data columns of table {lc.table.name!r}",
                                     rule="patch")
        check_columns(lc.table, data, limits)
        if len(data) < len(columns):
            # The fact records every data column (L7): those not given hold their declared default.
            data = {**defaults, **data}
        plans.append(plan_create(lc, data, item, at, book.chain_secret))
    store = book.store
    if len(plans) == 1:  # the common single create: no de-duplication or grouping to do
        tried, groups = plans, [plans]
    else:
        taken: set[str] = set()
        tried = []
        for write in plans:
            if if_absent and write.entity_id in taken:
                continue  # a repeated id in one batch: the first is tried, the rest are conflicts
            taken.add(write.entity_id)
            tried.append(write)
        groups = _groups(tried, lambda w: tuple(w.values))
    inserted: set[str] = set()
    async with store.unit(book.conn, one_statement=not chosen and _one_statement(groups)) as unit:
        purged = await _histories(store, unit, entity_type, chosen) if chosen else set()
        if purged and not if_absent:
            raise DuplicateEntity(f"{entity_type} {sorted(purged)[0]!r} has a history (it was purged); "
                                  "ids are not reused")
        for group in groups:
            for chunk in _chunks([w for w in group if w.entity_id not in purged] if purged else group):
                try:
                    inserted |= await store.insert(unit, lc.table, chunk, if_absent=if_absent,
                                                   notify=lc.notify_channel)
                except ConstraintViolation as exc:
                    if if_absent or not exc.unique:
                        raise
                    raise DuplicateEntity(f"{entity_type}: a row could not be inserted: {exc}") from exc
        if inserted:
            unit.wrote.add(entity_type)
    announce(book, unit)
    first = {id(w) for w in tried} if tried is not plans else None
    return [
        Outcome("applied", entity_type, w.entity_id, w.values["status"], 1, w.fact["id"], row=w.values,
                chain_hash=w.fact["hash"])
        if (first is None or id(w) in first) and w.entity_id in inserted
        else conflict(entity_type, w.entity_id)
        for w in plans
    ]


async def _histories(store: Store, unit: Unit, entity_type: str, ids: list[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(ids), BATCH):
        found |= await store.histories(unit, entity_type, ids[start : start + BATCH])
    return found


# -- transition -------------------------------------------------------------------------------------
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
    on_conflict: OnConflict = "raise",
) -> Outcome:
    """Move one entity along a declared edge. See the module docstring for the guarantees.

    A row no longer in an ``expected`` status, or whose guards differ, raises
    :class:`~.errors.TransitionConflict` (entity, expected and actual status) and writes nothing;
    with ``on_conflict="return"`` the ``conflict`` outcome is returned instead. An idempotent
    replay is ``applied`` (``replayed=True``), never a conflict.

    >>> await transition(book, "dispatch", did, "delivering", expected="pending",
    ...     guards={"attempt": 0}, patch={"attempt": 1, "next_attempt_at": now + 15},
    ...     reason=Reason("dispatch.delivering.attempt"), actor=Actor("system", "delivery"))  # doctest: +SKIP
    """
    cmd = Command(
        entity_type, entity_id, target, reason, actor, _statuses("expected", expected),
        _mapping("guards", guards), _mapping("patch", patch), idempotency_key, _mapping("metadata", metadata),
    )
    return await apply(book, cmd, on_conflict=on_conflict)


async def apply(book: Book, cmd: Command, *, on_conflict: OnConflict = "raise") -> Outcome:
    """Apply one command (a batch of one); a missing entity raises :class:`EntityNotFound`, a lost
    compare-and-set :class:`~.errors.TransitionConflict` unless ``on_conflict="return"``."""
    differed: dict[str, tuple[str, ...]] | None = {} if _raises(on_conflict) else None
    [outcome] = await _apply(book, [cmd], lock="wait", seen={}, missing_raises=True, differed=differed)
    if differed is not None and outcome.kind == "conflict":
        raise TransitionConflict(outcome, expected=cmd.expected, target=cmd.target,
                                 guards=differed.get(cmd.entity_id, ()))
    return outcome


async def apply_many(
    book: Book,
    commands: Sequence[Command],
    *,
    lock: Literal["wait", "skip_locked"] = "wait",
    seen: Mapping[str, Head | Mapping[str, Any]] | None = None,
) -> list[Outcome]:
    """Apply transitions of one entity type to distinct entities in one transaction.

    Each command is checked against the policy first (a forbidden one raises, nothing written). Rows
    whose status or guards no longer match — or, with ``lock="skip_locked"``, rows another
    transaction holds — get a ``conflict`` outcome; the rest are applied.

    ``seen`` maps entity ids to their heads as the caller last saw them (:class:`~.head.Head`: from
    a read with :func:`~.head.head_columns`, or :meth:`Outcome.head` — e.g. the row a claim just
    wrote; a row read with those columns and the guarded ones serves as well). Those rows are not read again: the compare-and-set decides, so a row changed since is a
    ``conflict``. Keyed commands (with an idempotency key) are always read under lock.
    """
    if not commands:
        return []
    return await _apply(book, commands, lock=lock, seen=seen or {}, missing_raises=False)


async def _apply(book: Book, commands: Sequence[Command], *, lock: Literal["wait", "skip_locked"],
                 seen: Mapping[str, Head | Mapping[str, Any]], missing_raises: bool,
                 differed: dict[str, tuple[str, ...]] | None = None) -> list[Outcome]:
    tracer = tracing.active()
    if tracer is None:
        return await _apply_commands(book, commands, lock=lock, seen=seen, missing_raises=missing_raises,
                                     differed=differed)
    kind = getattr(commands[0], "entity_type", "")
    attributes = {"statebook.entity.type": kind, "statebook.transition.count": len(commands)}
    targets = {getattr(c, "target", "") for c in commands}
    if len(targets) == 1:  # a batch may move its entities to different statuses (a pass's outcomes)
        attributes["statebook.transition.target"] = targets.pop()
    if len(commands) == 1:
        attributes["statebook.entity.id"] = getattr(commands[0], "entity_id", "")
    with tracer.span(f"transition {kind}", "internal", attributes) as span:
        outcomes = await _apply_commands(book, commands, lock=lock, seen=seen, missing_raises=missing_raises,
                                     differed=differed)
        span.set("statebook.transition.applied", sum(1 for o in outcomes if o.applied))
        return outcomes


async def _apply_commands(book: Book, commands: Sequence[Command], *, lock: Literal["wait", "skip_locked"],
                          seen: Mapping[str, Head | Mapping[str, Any]], missing_raises: bool,
                          differed: dict[str, tuple[str, ...]] | None = None) -> list[Outcome]:
    """``differed``, when given, collects for each conflict on a row in an expected status the guarded
    columns that differed (from the row already read: the error needs no read of its own)."""
    for c in commands:
        if not isinstance(c, Command):
            raise InvalidArgument(f"commands: expected Command, got {type(c).__name__}", argument="commands",
                                  rule="type")
        text("entity_id", c.entity_id, max_chars=KEY_CHARS, empty=False)
    entity_type = commands[0].entity_type
    lc = book.policy(entity_type)
    ids = [c.entity_id for c in commands]
    if len(set(ids)) != len(ids) or any(c.entity_type != entity_type for c in commands):
        raise InvalidArgument("commands: apply_many takes commands for distinct entities of one entity type",
                              argument="commands", rule="distinct")
    limits = book.limits
    for c in commands:
        _check_inputs(lc, c, limits)
        lc.check_command(c.expected, c.target, actor_type=c.actor.type, patch=c.patch, guard=c.guards,
                         reason_code=c.reason.code)
    keyed = [c for c in commands if c.idempotency_key is not None]
    unseen = [c.entity_id for c in commands if c.entity_id not in seen or c.idempotency_key is not None]
    store = book.store
    whole = not unseen and _one_statement(_groups(commands, lambda c: (tuple(c.guards), tuple(c.patch))))
    outcomes: dict[str, Outcome] = {}
    async with store.unit(book.conn, one_statement=whole) as unit:
        current: dict[str, Head | Mapping[str, Any]] = dict(seen)
        guard_cols = sorted({g for c in commands for g in c.guards})
        row: Head | Mapping[str, Any] | None
        for chunk in _chunks(unseen):
            for row in await store.rows(unit, lc.table, ("id", *HEAD, *guard_cols), chunk, lock=lock):
                current[row["id"]] = row
        if keyed:
            await _replays(store, unit, keyed, current, outcomes)
        writes: list[tuple[Command, RowWrite]] = []
        at = book.clock.now()
        for c in commands:
            if c.entity_id in outcomes:
                continue
            row = current.get(c.entity_id)
            if row is None and missing_raises:
                raise EntityNotFound(f"{entity_type} {c.entity_id!r} does not exist")
            if not matches(c, row):
                outcomes[c.entity_id] = conflict(entity_type, c.entity_id, row)
                if differed is not None and row is not None:
                    differed[c.entity_id] = differing(c, row)
                continue
            # matches() is False for a missing row, so row is not None here.
            writes.append((c, plan_transition(lc, c, row, at, book.chain_secret)))  # type: ignore[arg-type]
        trusted = set(unseen)
        for group in _groups(writes, lambda cw: _update_shape(cw[1])):
            for chunk in _chunks(group):
                updated = await store.update(unit, lc.table, [w for _, w in chunk])
                for c, w in chunk:
                    if c.entity_id in updated:
                        outcomes[c.entity_id] = applied(c, w)
                    elif c.entity_id in trusted:
                        # Read under lock in this unit: a miss means the facts would not match the rows.
                        raise StorageError(f"compare-and-set missed locked row {entity_type} {c.entity_id}")
                    else:
                        outcomes[c.entity_id] = conflict(entity_type, c.entity_id)
                if updated:
                    unit.wrote.add(entity_type)
    announce(book, unit)
    return [outcomes[c.entity_id] for c in commands]


async def _replays(store: Store, unit: Unit, keyed: list[Command], current: Mapping[str, Head | Mapping[str, Any]],
                   outcomes: dict[str, Outcome]) -> None:
    """Keyed commands whose key already produced a fact: the original outcome, or a mismatch.

    Runs after the rows are locked, so a racing command with the same key has committed (or not
    begun) by now: exactly one applies, the other replays (L9).
    """
    found = await store.facts_by_key(unit, keyed[0].entity_type, [(c.entity_id, c.idempotency_key or "")
                                                                  for c in keyed])
    for c in keyed:
        fact = found.get((c.entity_id, c.idempotency_key or ""))
        if fact is None:
            continue
        if fact["command_digest"] != c.digest():
            raise IdempotencyMismatch(
                f"idempotency key {c.idempotency_key!r} was already used on {c.entity_type} {c.entity_id} "
                "for a different command; use a new key for a new command"
            )
        outcomes[c.entity_id] = Outcome("applied", c.entity_type, c.entity_id, fact["status"], fact["version"],
                                        fact["id"], replayed=True)


def _raises(on_conflict: Any) -> bool:
    if on_conflict == "raise":
        return True
    if on_conflict == "return":
        return False
    raise InvalidArgument(f"on_conflict: expected 'raise' or 'return', got {on_conflict!r}"[:200],
                          argument="on_conflict", rule="vocabulary")


def _statuses(argument: str, value: Any) -> tuple[str, ...]:
    """One status or an iterable of them, as a tuple (each then checked as text)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(value)
    raise InvalidArgument(f"{argument}: expected a status or a list of statuses, got {type(value).__name__}",
                          argument=argument, rule="type")


def _mapping(argument: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{argument}: expected a mapping of column names to values, got {type(value).__name__}",
                              argument=argument, rule="type")
    return dict(value)


def _check_inputs(lc: Lifecycle, c: Command, limits: Any) -> None:
    for argument, value in (("guards", c.guards), ("patch", c.patch), ("metadata", c.metadata)):
        if type(value) is not dict and not isinstance(value, Mapping):
            raise InvalidArgument(f"{argument}: expected a mapping, got {type(value).__name__}", argument=argument,
                                  rule="type")
    if not isinstance(c.expected, tuple):
        raise InvalidArgument(f"expected: expected a tuple of statuses, got {type(c.expected).__name__}",
                              argument="expected", rule="type")
    check_reason_actor(c.reason, c.actor, c.metadata, limits)
    if not plain_texts((c.target, *c.expected, *c.patch, *c.guards), KEY_CHARS):  # else each explains itself
        text("target", c.target, max_chars=KEY_CHARS)
        for status in c.expected:
            text("expected", status, max_chars=KEY_CHARS)
        for name in (*c.patch, *c.guards):
            text("field name", name, max_chars=KEY_CHARS)
    if c.idempotency_key is not None:
        text("idempotency_key", c.idempotency_key, max_chars=KEY_CHARS, empty=False)
    check_columns(lc.table, c.patch, limits, what="patch")
    check_columns(lc.table, c.guards, limits, what="guards")


def _update_shape(write: RowWrite) -> tuple[Any, ...]:
    return (write.guards, tuple(write.values))


# -- purge ------------------------------------------------------------------------------------------
async def purge(
    book: Book,
    entity_type: str,
    entity_id: str,
    *,
    reason: Reason,
    actor: Actor,
    expected: Iterable[str] | str | None = None,
    force: bool = False,
    on_conflict: OnConflict = "raise",
) -> Outcome:
    """Delete a row and append its tombstone fact (status NULL) in one transaction.

    Only purgeable statuses (the terminal ones unless declared otherwise) are accepted without
    ``force``. The history stays: ``verify`` accepts facts of a missing row that ends in a tombstone.
    A row not in ``expected`` raises :class:`~.errors.TransitionConflict` and is left as it is, as a
    transition's does; ``on_conflict="return"`` returns the ``conflict`` outcome instead.
    """
    raising = _raises(on_conflict)
    [outcome] = await _purge(book, entity_type, [entity_id], reason=reason, actor=actor, expected=expected,
                             force=force, missing_raises=True)
    if raising and outcome.kind == "conflict":
        raise TransitionConflict(outcome, expected=_allowed(book.policy(entity_type), expected), target=None)
    return outcome


async def purge_many(
    book: Book,
    entity_type: str,
    entity_ids: Sequence[str],
    *,
    reason: Reason,
    actor: Actor,
    expected: Iterable[str] | str | None = None,
    force: bool = False,
) -> list[Outcome]:
    """:func:`purge` for many rows of one type in one transaction, set-based (a bounded number of
    statements per :data:`BATCH` rows). A row that is missing or not in ``expected`` is a conflict."""
    if not isinstance(entity_ids, Sequence) or isinstance(entity_ids, str):
        raise InvalidArgument(f"entity_ids: expected a list of ids, got {type(entity_ids).__name__}",
                              argument="entity_ids", rule="type")
    for entity_id in entity_ids:
        text("entity_id", entity_id, max_chars=KEY_CHARS, empty=False)
    if len(set(entity_ids)) != len(entity_ids):
        raise InvalidArgument("entity_ids: purge_many takes distinct entity ids", argument="entity_ids",
                              rule="distinct")
    if not entity_ids:
        return []
    return await _purge(book, entity_type, entity_ids, reason=reason, actor=actor, expected=expected, force=force,
                        missing_raises=False)


async def _purge(book: Book, entity_type: str, entity_ids: Sequence[str], *, reason: Reason, actor: Actor,
                 expected: Iterable[str] | str | None, force: bool, missing_raises: bool) -> list[Outcome]:
    lc = book.policy(entity_type)
    check_reason_actor(reason, actor, None, book.limits)
    for entity_id in entity_ids:
        text("entity_id", entity_id, max_chars=KEY_CHARS, empty=False)
    lc.check_reason(reason.code)
    allowed = _allowed(lc, expected)
    for status in allowed:
        text("expected", status, max_chars=KEY_CHARS)
    store = book.store
    outcomes: dict[str, Outcome] = {}
    async with store.unit(book.conn) as unit:
        current: dict[str, Mapping[str, Any]] = {}
        row: Mapping[str, Any] | None
        for chunk in _chunks(list(entity_ids)):
            for row in await store.rows(unit, lc.table, ("id", *HEAD), chunk, lock="wait"):
                current[row["id"]] = row
        at = book.clock.now()
        writes: list[RowWrite] = []
        for entity_id in entity_ids:
            row = current.get(entity_id)
            if row is None:
                if missing_raises:
                    raise EntityNotFound(f"{entity_type} {entity_id!r} does not exist")
                outcomes[entity_id] = conflict(entity_type, entity_id)
                continue
            if row["status"] not in allowed:
                outcomes[entity_id] = conflict(entity_type, entity_id, row)
                continue
            _check_purgeable(lc, entity_id, row["status"], force)
            writes.append(plan_purge(lc, entity_id, row, reason, actor, at, force, book.chain_secret))
        for chunk in _chunks(writes):
            deleted = await store.delete(unit, lc.table, chunk)
            for w in chunk:
                outcomes[w.entity_id] = (
                    Outcome("applied", entity_type, w.entity_id, None, w.fact["version"], w.fact["id"])
                    if w.entity_id in deleted else conflict(entity_type, w.entity_id)
                )
            if deleted:
                unit.wrote.add(entity_type)
    announce(book, unit)
    return [outcomes[entity_id] for entity_id in entity_ids]


def _allowed(lc: Lifecycle, expected: Iterable[str] | str | None) -> tuple[str, ...]:
    """The statuses a purge accepts: those ``expected``, or any."""
    return (_statuses("expected", expected) if expected is not None else ()) or lc.statuses


def _check_purgeable(lc: Lifecycle, entity_id: str, status: str, force: bool) -> None:
    if not force and status not in (lc.purgeable or ()):
        raise TransitionRejected(
            f"{lc.entity_type} {entity_id} is {status!r}, which is not purgeable "
            f"({', '.join(sorted(lc.purgeable or ())) or 'none'}); pass force=True to purge it anyway",
            rule="purge",
        )


# -- helpers ----------------------------------------------------------------------------------------
def announce(book: Book, unit: Unit) -> None:
    """After a unit of the book's own has committed: its ``on_commit`` callbacks for what it wrote (a
    bound book's transaction announces at its own commit, Book.begin)."""
    if book.conn is None:
        for entity_type in unit.wrote:
            book.committed(entity_type)


def _groups(items: Iterable[Any], key: Any) -> list[list[Any]]:
    """Items grouped by statement shape, in first-seen order."""
    groups: dict[Any, list[Any]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())


def _chunks(items: Sequence[Any]) -> Sequence[Sequence[Any]]:
    if len(items) <= BATCH:
        return (items,) if items else ()
    return [items[start : start + BATCH] for start in range(0, len(items), BATCH)]


def _one_statement(groups: list[list[Any]]) -> bool:
    return len(groups) == 1 and len(groups[0]) <= BATCH
