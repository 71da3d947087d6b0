"""Operator surface (specs/outbox.md O15, O16, O19, O23): inspect, retry, expedite, purge, retention. Every write
is audited."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, EntityNotFound, Reason, TransitionRejected, purge, transition
from statebook.lifecycle.engine import purge_many
from statebook.lifecycle.schema import status_in

from . import checks
from ..core.retention import PURGE_BATCH, RETENTION_ACTOR, Progress
from .enqueue import notify
from .errors import DispatchInvalid
from .models import Dispatch
from .schema import dispatch_outbox

OPERATOR_ACTOR = Actor("operator", "api")
RETRYABLE = ("dead_letter", "expired")
EXPEDITED = "dispatch.pending.operator_expedited"
SUCCEEDED = ("delivered", "acked")
"""Terminal statuses kept for ``delivered_days`` by retention; the other terminal ones for ``failed_days``."""
DAY = 86400.0


def _check_status(book: Book, status: str | None) -> None:
    """A status the book's dispatch lifecycle declares (an application may add its own, specs/extending.md)."""
    if status is None:
        return
    checks.text_arg("status", status)
    declared = book.policy("dispatch").statuses
    if status not in declared:
        raise DispatchInvalid(f"status: unknown dispatch status {status[:80]!r}; statuses are {', '.join(declared)}",
                              argument="status", rule="status")


def _terminal(book: Book) -> tuple[str, ...]:
    """The dispatch lifecycle's terminal statuses, in declaration order."""
    lc = book.policy("dispatch")
    return tuple(s for s in lc.statuses if s in lc.terminal)


async def get_dispatch(book: Book, dispatch_id: str) -> Dispatch | None:
    """The dispatch (payload decoded), or None."""
    checks.book_arg(book)
    checks.dispatch_id(dispatch_id)
    t = dispatch_outbox
    async with book.read() as conn:
        row = (await conn.execute(sa.select(t).where(t.c.id == dispatch_id))).first()
    return None if row is None else Dispatch.from_row(row)


async def list_dispatches(book: Book, *, status: str | None = None, limit: int = 50) -> list[Dispatch]:
    """Newest first (created_at, then id), optionally one status, at most ``limit`` rows."""
    checks.book_arg(book)
    _check_status(book, status)
    checks.count("limit", limit, checks.MAX_LIST)
    t = dispatch_outbox
    query = sa.select(t).order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
    if status is not None:
        query = query.where(t.c.status == status)
    async with book.read() as conn:
        rows = (await conn.execute(query)).fetchall()
    return [Dispatch.from_row(r) for r in rows]


async def retry_dispatch(book: Book, dispatch_id: str, *, actor: Actor = OPERATOR_ACTOR,
                         note: str | None = None) -> bool:
    """Send a dead_letter or expired dispatch again: ONE operator transition to pending with
    attempt=0, next_attempt_at=now, last_error=None. False when a concurrent change won the race.
    ``note`` (the operator's why, at most 500 characters) is kept in the fact's summary.

    Raises ``LookupError`` (:class:`EntityNotFound`) when the row does not exist and
    :class:`TransitionRejected` (rule ``status``) when it is in another status; neither writes.
    """
    checks.book_arg(book)
    checks.dispatch_id(dispatch_id)
    checks.actor(actor)
    checks.note(note)
    t = dispatch_outbox
    async with book.read() as conn:
        row = (await conn.execute(sa.select(t.c.status, t.c.attempt).where(t.c.id == dispatch_id))).first()
    if row is None:
        raise EntityNotFound(f"dispatch {dispatch_id!r} does not exist")
    if row.status not in RETRYABLE:
        raise TransitionRejected(
            f"dispatch {dispatch_id} is {row.status!r}; only dead_letter or expired dispatches can be retried",
            rule="status",
        )
    async with book.begin() as tx:
        outcome = await transition(
            tx, "dispatch", dispatch_id, "pending", expected=row.status, guards={"attempt": row.attempt},
            patch={"attempt": 0, "next_attempt_at": tx.clock.now(), "last_error": None},
            reason=Reason("dispatch.pending.operator_retry",
                          checks.with_note(f"operator retry from {row.status}", note)), actor=actor,
            on_conflict="return",
        )
        if outcome.applied:
            await notify(tx, dispatch_id)
    return outcome.applied


async def expedite_dispatch(book: Book, dispatch_id: str, *, actor: Actor = OPERATOR_ACTOR,
                            note: str | None = None) -> bool:
    """Deliver a pending dispatch now instead of after its backoff: ONE operator transition ``pending ->
    pending`` (``dispatch.pending.operator_expedited``) that patches ``next_attempt_at = now``, compared
    and set on the due time and attempt read (O23). The attempt count and its bound stay, so expediting
    never sends more than ``max_attempts`` times; a running worker sends it at once (woken on PostgreSQL).

    True when the dispatch is due now (made so, or it already was: nothing written); False when a
    concurrent change won the race. Raises :class:`EntityNotFound` when the row does not exist and
    :class:`TransitionRejected` (rule ``status``) in another status — a dead letter or an expired dispatch
    is retried instead (:func:`retry_dispatch`) — and (rule ``actor``) for an actor that is not an operator.
    ``note`` is kept in the fact's summary.
    """
    checks.book_arg(book)
    checks.dispatch_id(dispatch_id)
    checks.actor(actor)
    checks.note(note)
    t = dispatch_outbox
    async with book.read() as conn:
        row = (await conn.execute(sa.select(t.c.status, t.c.attempt, t.c.next_attempt_at)
                                  .where(t.c.id == dispatch_id))).first()
    if row is None:
        raise EntityNotFound(f"dispatch {dispatch_id!r} does not exist")
    if row.status != "pending":
        hint = "; retry it instead (statebook dispatch retry)" if row.status in RETRYABLE else ""
        raise TransitionRejected(
            f"dispatch {dispatch_id} is {row.status!r}; only a pending dispatch can be expedited{hint}", rule="status")
    guards = {"next_attempt_at": row.next_attempt_at, "attempt": row.attempt}
    # The policy's edge decides who may (an operator), also when there is nothing to write.
    book.policy("dispatch").check_command(["pending"], "pending", actor_type=actor.type, patch=("next_attempt_at",),
                                          guard=tuple(guards), reason_code=EXPEDITED)
    if row.next_attempt_at <= book.clock.now():
        return True  # already due: the next pass takes it in its turn
    async with book.begin() as tx:
        now = tx.clock.now()
        outcome = await transition(
            tx, "dispatch", dispatch_id, "pending", expected="pending", guards=guards, patch={"next_attempt_at": now},
            reason=Reason(EXPEDITED,
                          checks.with_note(f"expedited by an operator: attempt {row.attempt + 1} due now, not in "
                                           f"{row.next_attempt_at - now:.0f} s", note)),
            actor=actor, on_conflict="return",
        )
        if outcome.applied:
            await notify(tx, dispatch_id)
    return outcome.applied


async def purge_dispatch(
    book: Book, dispatch_id: str, *, actor: Actor = OPERATOR_ACTOR, force: bool = False, note: str | None = None
) -> bool:
    """Delete one row and append its tombstone fact; False when the row does not exist.

    Non-terminal rows are refused (:class:`TransitionRejected`) unless ``force=True``. ``note`` is kept
    in the tombstone's summary.
    """
    checks.book_arg(book)
    checks.dispatch_id(dispatch_id)
    checks.actor(actor)
    checks.flag("force", force)
    checks.note(note)
    try:
        outcome = await purge(
            book, "dispatch", dispatch_id,
            reason=Reason("dispatch.purged.operator", checks.with_note("purged by an operator", note)),
            actor=actor, force=force, on_conflict="return",
        )
    except EntityNotFound:
        return False
    return outcome.applied


def settled_only(book: Book, statuses: Iterable[str]) -> list[Any]:
    """When every status is terminal, the settled index's own predicate (as literal SQL) to add to a
    query over them: it changes no result, and SQLite uses a partial index only for a query that
    repeats its predicate (specs/performance.md, "Dispatch indexes")."""
    lifecycle = book.policy("dispatch")
    if not set(statuses) <= lifecycle.terminal:
        return []
    return [sa.text(status_in("dispatch_outbox.status", [s for s in lifecycle.statuses if s in lifecycle.terminal]))]


def settled_query(book: Book, statuses: list[str], before: float) -> sa.Select[Any]:
    """(id, status) of the rows in ``statuses`` last changed before ``before``, oldest first."""
    t = dispatch_outbox
    return (
        sa.select(t.c.id, t.c.status)
        .where(t.c.status.in_(statuses), t.c.updated_at < before, *settled_only(book, statuses))
        .order_by(t.c.updated_at, t.c.id)
    )


async def _purge_matching(
    book: Book, statuses: Iterable[str], before: float, *, dry_run: bool, force: bool, reason: Reason, actor: Actor,
    progress: Progress | None = None,
) -> list[tuple[str, str]]:
    """(id, status) of each row purged, or that would be with ``dry_run``.

    The rows are listed once, then purged :data:`PURGE_BATCH` at a time, each batch one set-based
    ``purge_many`` in its own transaction (O5: each row still gets its tombstone fact). A row that
    changed or vanished since it was listed is left alone (a conflict).
    """
    wanted = list(statuses)
    query = settled_query(book, wanted, before)
    async with book.read() as conn:
        rows = [(r.id, r.status) for r in await conn.execute(query)]
    if dry_run:
        return rows
    purged: list[tuple[str, str]] = []
    for start in range(0, len(rows), PURGE_BATCH):
        chunk = rows[start : start + PURGE_BATCH]
        outcomes = await purge_many(book, "dispatch", [dispatch_id for dispatch_id, _ in chunk], reason=reason,
                                    actor=actor, expected=wanted, force=force)
        purged += [pair for pair, outcome in zip(chunk, outcomes, strict=True) if outcome.applied]
        if progress is not None:
            progress(start + len(chunk), len(rows))
    return purged


async def purge_dispatches(
    book: Book,
    *,
    before: datetime | float,
    statuses: Iterable[str] | None = None,
    dry_run: bool = False,
    force: bool = False,
    actor: Actor = OPERATOR_ACTOR,
    progress: Progress | None = None,
) -> list[str]:
    """Purge rows in ``statuses`` (default: the terminal ones) last changed before ``before`` (an aware
    ``datetime`` or POSIX seconds).

    Returns the ids purged (or, with ``dry_run``, that would be). Each purge is audited by a
    tombstone fact. Non-terminal statuses are refused unless ``force=True``: a pending or
    delivering row is live work.
    """
    checks.book_arg(book)
    before = checks.when("before", before)
    checks.flag("dry_run", dry_run)
    checks.flag("force", force)
    checks.actor(actor)
    checks.callback("progress", progress)
    terminal = _terminal(book)
    chosen = tuple(terminal if statuses is None else checks.texts("statuses", statuses))
    if not chosen:
        raise DispatchInvalid("statuses: must name at least one status (or be None for the terminal ones)",
                              argument="statuses", rule="empty")
    for status in chosen:
        _check_status(book, status)
    live = sorted(set(chosen) - set(terminal))
    if live and not force:
        raise TransitionRejected(
            f"refusing to purge non-terminal status(es) {', '.join(live)}: they are live work; pass force=True "
            "(--force) to purge them anyway",
            rule="purge",
        )
    purged = await _purge_matching(
        book, chosen, before, dry_run=dry_run, force=force,
        reason=Reason("dispatch.purged.operator", f"bulk purge of {', '.join(chosen)} before {before}"), actor=actor,
        progress=progress,
    )
    return [dispatch_id for dispatch_id, _ in purged]


async def apply_retention(
    book: Book,
    *,
    now: datetime | float,
    delivered_days: float = 7,
    failed_days: float = 30,
    actor: Actor = RETENTION_ACTOR,
    progress: Progress | None = None,
) -> dict[str, int]:
    """Purge delivered/acked rows settled more than ``delivered_days`` ago and the other terminal rows
    (dead_letter, expired, and any terminal status an application adds) settled more than
    ``failed_days`` ago, counted back from ``now`` (an aware ``datetime`` or POSIX seconds). Returns the number
    purged per terminal status."""
    checks.book_arg(book)
    now = checks.when("now", now)
    checks.days("delivered_days", delivered_days)
    checks.days("failed_days", failed_days)
    checks.actor(actor)
    checks.callback("progress", progress)
    terminal = _terminal(book)
    counts = dict.fromkeys(terminal, 0)
    succeeded = tuple(s for s in SUCCEEDED if s in terminal)
    others = tuple(s for s in terminal if s not in SUCCEEDED)
    for statuses, days in ((succeeded, delivered_days), (others, failed_days)):
        if not statuses:
            continue
        reason = Reason("dispatch.purged.retention", f"retention: settled more than {days:g} day(s) ago")
        for _, status in await _purge_matching(
            book, statuses, now - days * DAY, dry_run=False, force=False, reason=reason, actor=actor,
            progress=progress,
        ):
            counts[status] += 1
    return counts
