"""Operator surface (specs/outbox.md O15, O16, O19): inspect, retry, purge, retention. Every write is audited."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, EntityNotFound, Reason, TransitionRejected, purge, transition
from statebook.lifecycle.engine import purge_many

from .enqueue import notify
from .errors import DispatchInvalid
from .schema import dispatch_outbox

OPERATOR_ACTOR = Actor("operator", "api")
RETENTION_ACTOR = Actor("system", "retention")
RETRYABLE = ("dead_letter", "expired")
SUCCEEDED = ("delivered", "acked")
"""Terminal statuses kept for ``delivered_days`` by retention; the other terminal ones for ``failed_days``."""
DAY = 86400.0


def _decode(row: Any) -> dict[str, Any]:
    out = dict(row._mapping)
    if isinstance(out.get("payload"), str | bytes):
        out["payload"] = json.loads(out["payload"])
    out["ack_required"] = bool(out["ack_required"])
    return out


def _check_status(book: Book, status: str | None) -> None:
    """A status the book's dispatch lifecycle declares (an application may add its own, specs/extending.md)."""
    declared = book.policy("dispatch").statuses
    if status is not None and status not in declared:
        raise DispatchInvalid(f"unknown dispatch status {status!r}; statuses are {', '.join(declared)}")


def _terminal(book: Book) -> tuple[str, ...]:
    """The dispatch lifecycle's terminal statuses, in declaration order."""
    lc = book.policy("dispatch")
    return tuple(s for s in lc.statuses if s in lc.terminal)


async def get_dispatch(book: Book, dispatch_id: str) -> dict[str, Any] | None:
    """The row as a dict (payload decoded), or None."""
    t = dispatch_outbox
    async with book.read() as conn:
        row = (await conn.execute(sa.select(t).where(t.c.id == dispatch_id))).first()
    return None if row is None else _decode(row)


async def list_dispatches(book: Book, *, status: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Newest first (created_at, then id), optionally one status, at most ``limit`` rows."""
    _check_status(book, status)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise DispatchInvalid(f"limit must be a positive integer, got {limit!r}")
    t = dispatch_outbox
    query = sa.select(t).order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
    if status is not None:
        query = query.where(t.c.status == status)
    async with book.read() as conn:
        rows = (await conn.execute(query)).fetchall()
    return [_decode(r) for r in rows]


async def retry_dispatch(book: Book, dispatch_id: str, *, actor: Actor = OPERATOR_ACTOR) -> bool:
    """Send a dead_letter or expired dispatch again: ONE operator transition to pending with
    attempt=0, next_attempt_at=now, last_error=None. False for another status or a lost race.

    Raises ``LookupError`` when the row does not exist.
    """
    t = dispatch_outbox
    async with book.read() as conn:
        row = (await conn.execute(sa.select(t.c.status, t.c.attempt).where(t.c.id == dispatch_id))).first()
    if row is None:
        raise EntityNotFound(f"dispatch {dispatch_id!r} does not exist")
    if row.status not in RETRYABLE:
        return False
    async with book.begin() as tx:
        outcome = await transition(
            tx, "dispatch", dispatch_id, "pending", expected=row.status, guards={"attempt": row.attempt},
            patch={"attempt": 0, "next_attempt_at": tx.clock.now(), "last_error": None},
            reason=Reason("dispatch.pending.operator_retry", f"operator retry from {row.status}"), actor=actor,
        )
        if outcome.applied:
            await notify(tx, dispatch_id)
    return outcome.applied


async def purge_dispatch(
    book: Book, dispatch_id: str, *, actor: Actor = OPERATOR_ACTOR, force: bool = False
) -> bool:
    """Delete one row and append its tombstone fact; False when the row does not exist.

    Non-terminal rows are refused (:class:`TransitionRejected`) unless ``force=True``.
    """
    try:
        outcome = await purge(
            book, "dispatch", dispatch_id, reason=Reason("dispatch.purged.operator", "purged by an operator"),
            actor=actor, force=force,
        )
    except EntityNotFound:
        return False
    return outcome.applied


PURGE_BATCH = 500
"""Rows per purge transaction: a bulk purge is set-based, a bounded transaction at a time."""

Progress = Callable[[int, int], None]
"""Called with (rows done, rows in all) after each batch of a bulk purge."""


async def _purge_matching(
    book: Book, statuses: Iterable[str], before: float, *, dry_run: bool, force: bool, reason: Reason, actor: Actor,
    progress: Progress | None = None,
) -> list[tuple[str, str]]:
    """(id, status) of each row purged, or that would be with ``dry_run``.

    The rows are listed once, then purged :data:`PURGE_BATCH` at a time, each batch one set-based
    ``purge_many`` in its own transaction (O5: each row still gets its tombstone fact). A row that
    changed or vanished since it was listed is left alone (a conflict).
    """
    t = dispatch_outbox
    wanted = list(statuses)
    query = (
        sa.select(t.c.id, t.c.status)
        .where(t.c.status.in_(wanted), t.c.updated_at < before)
        .order_by(t.c.updated_at, t.c.id)
    )
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
    before: float,
    statuses: Iterable[str] | None = None,
    dry_run: bool = False,
    force: bool = False,
    actor: Actor = OPERATOR_ACTOR,
    progress: Progress | None = None,
) -> list[str]:
    """Purge rows in ``statuses`` (default: the terminal ones) last changed before ``before``.

    Returns the ids purged (or, with ``dry_run``, that would be). Each purge is audited by a
    tombstone fact. Non-terminal statuses are refused unless ``force=True``: a pending or
    delivering row is live work.
    """
    terminal = _terminal(book)
    chosen = tuple(terminal if statuses is None else statuses)
    if not chosen:
        raise DispatchInvalid("statuses must name at least one status (or be None for the terminal ones)")
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
    now: float,
    delivered_days: float = 7,
    failed_days: float = 30,
    actor: Actor = RETENTION_ACTOR,
    progress: Progress | None = None,
) -> dict[str, int]:
    """Purge delivered/acked rows settled more than ``delivered_days`` ago and the other terminal rows
    (dead_letter, expired, and any terminal status an application adds) settled more than
    ``failed_days`` ago. Returns the number purged per terminal status."""
    if not (0 < delivered_days < float("inf") and 0 < failed_days < float("inf")):
        raise DispatchInvalid(f"retention periods must be positive and finite, got {delivered_days} and {failed_days}")
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
