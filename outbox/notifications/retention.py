"""Explicit retention of settled notifications, with an idempotency horizon (specs/notifications.md N14, N30).

Nothing removes a notification by itself: no start-up, worker or daemon path calls
:func:`apply_notification_retention`; an operator (``statebook notify retain``) or the application does.

>>> report = await apply_notification_retention(book, before=now - 30 * 86400, horizon=7 * 86400)  # doctest: +SKIP
>>> report.counts["notification"]["removed"]  # doctest: +SKIP
12

What may go: ``delivered``, ``deduplicated`` and ``failed`` without a pending dead letter, last changed
before the cutoff and created before ``now - horizon`` (an idempotency record is never removed before
the horizon, N14). What stays: unsettled work (``pending``, ``rate_limited``), unresolved dead letters,
and every notification something still relies on — named by a retained notification as its owner
(``obligation_owner_id``) or replay (``replayed_in``), naming an unsettled successor or replay, owning
a claim, named by a satisfied claim whose window is open (arrivals are still deduplicated against it),
or with an admitted send still open, or whose response still waits for a human. A removed notification's
channel attempts and answered response go with it. Claims stay: a claim's id is its obligation's, and a
purged id is never reused, so removing one would refuse every later intake of that obligation (the
ownership state machine found this); a claim is one small row per obligation. Every removal is a purge
through the engine (a tombstone fact);
the run itself is a ``notification_retention`` entity with its counts.

Like the dispatch outbox's bulk purge (:mod:`statebook.outbox.dispatch.admin`), candidates are listed once and
removed :data:`~statebook.outbox.core.retention.PURGE_BATCH` at a time, each batch in ONE transaction that locks
its rows, then the claims they are counted under (the lock every intake of the obligation queues on),
and only then reads what links to them: an arrival cannot link to a notification between the check
and the purge.
"""

from __future__ import annotations

import contextlib

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Reason, create, transition
from statebook.lifecycle.codec import new_id
from statebook.lifecycle.engine import purge_many
from statebook.lifecycle import inputs
from statebook.lifecycle.inputs import duration, timestamp
from statebook.lifecycle.queries import lock_rows
from statebook.lifecycle.schema import status_in
from statebook.outbox.core.retention import PURGE_BATCH, RETENTION_ACTOR, Progress

from .errors import checked, refused
from .policy import ATTEMPT_RESULTS
from .schema import channel_attempts, dedup_claims, notification_responses, notifications

if TYPE_CHECKING:  # sqlalchemy.ext.asyncio loads the ORM: importing the package stays without it
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["RETENTION_ACTOR", "RetentionReport", "apply_notification_retention"]

REMOVABLE = ("delivered", "deduplicated", "failed")
"""The settled statuses retention may remove (``failed`` only without a pending dead letter)."""
UNSETTLED = ("pending", "rate_limited")
MAX_HORIZON = 100 * 366 * 86400.0

ENTITY = "notification_retention"
REASONS = {
    "notification": Reason("notification.purged.retention", "retention: settled, past the cutoff and the horizon"),
    "channel_attempt": Reason("channel_attempt.purged.retention", "retention: its notification was removed"),
    "notification_response": Reason("notification_response.purged.retention",
                                    "retention: its notification was removed"),
}


@dataclass(frozen=True)
class RetentionReport:
    """What one run removed (or, with ``dry_run``, would remove): the run's id, its counts per kind
    (``removed``, ``protected`` and ``protected_by`` reason), and the ids per kind."""

    run_id: str
    dry_run: bool
    counts: dict[str, dict[str, Any]]
    notifications: tuple[str, ...]
    channel_attempts: tuple[str, ...]
    notification_responses: tuple[str, ...] = ()


class _Tally:
    def __init__(self) -> None:
        self.removed: dict[str, list[str]] = {kind: [] for kind in REASONS}
        self.protected: dict[str, dict[str, int]] = {kind: {} for kind in REASONS}

    def protect(self, kind: str, why: str, n: int = 1) -> None:
        if n:
            self.protected[kind][why] = self.protected[kind].get(why, 0) + n

    def counts(self) -> dict[str, dict[str, Any]]:
        return {kind: {"removed": len(self.removed[kind]), "protected": sum(self.protected[kind].values()),
                       "protected_by": dict(sorted(self.protected[kind].items()))} for kind in REASONS}


def _check(book: Any, before: Any, horizon: Any, dry_run: Any, actor: Any, progress: Any) -> float:
    """Every argument checked, in order; returns the cutoff in POSIX seconds."""
    checked(inputs.book, "book", book)
    if book.conn is not None:
        raise refused("book", "bound", "retention runs its own transactions, one per batch; pass an unbound book, "
                                       "not one from book.begin()")
    cutoff = checked(timestamp, "before", before)
    checked(duration, "horizon", horizon, high=MAX_HORIZON, positive=True)
    checked(inputs.flag, "dry_run", dry_run)
    checked(inputs.actor, "actor", actor)
    checked(inputs.callback, "progress", progress)
    return cutoff


async def apply_notification_retention(
    book: Book,
    *,
    before: datetime | float,
    horizon: float,
    dry_run: bool = False,
    actor: Actor = RETENTION_ACTOR,
    progress: Progress | None = None,
) -> RetentionReport:
    """Remove settled notifications last changed before ``before`` (an aware ``datetime`` or POSIX seconds)
    and created more than ``horizon`` seconds ago, keeping what anything unsettled or retained relies on
    (see the module docstring).

    Refuses (:class:`NotificationInvalid`, nothing written) a bad argument and a cutoff younger than
    the horizon (``before > now - horizon``, rule ``horizon``). Records the run — ``running``, then
    ``completed`` with its counts, or ``failed`` with the error (re-raised). A dry run is recorded
    too and removes nothing; its report lists what would have gone.
    """
    before = _check(book, before, horizon, dry_run, actor, progress)
    now = book.clock.now()
    edge = now - horizon
    if before > edge:
        raise refused("before", "horizon",
                      f"the cutoff {before:.3f} is younger than the idempotency horizon of {horizon:g} s "
                      f"(now {now:.3f}): pass a cutoff at or before {edge:.3f}, or a shorter horizon")
    run_id = new_id()
    values = {"id": run_id, "cutoff": before, "horizon": horizon, "dry_run": int(dry_run), "started_at": now,
              "ended_at": None, "counts": {}, "error": None}
    await create(book, ENTITY, values=values, status="running", actor=actor, fresh_id=True,
                 reason=Reason("notification_retention.running.started",
                               f"{'dry run' if dry_run else 'retention'} before {before:g}, horizon {horizon:g} s"))
    tally = _Tally()
    try:
        await _notifications(book, tally, before=before, edge=edge, now=now, dry_run=dry_run, actor=actor,
                             progress=progress)
    except Exception as exc:
        with contextlib.suppress(Exception):  # the run's own error is the one to raise
            await transition(book, ENTITY, run_id, "failed", expected="running", actor=actor,
                             reason=Reason("notification_retention.failed.error", type(exc).__name__[:200]),
                             patch={"ended_at": book.clock.now(), "counts": tally.counts(),
                                    "error": f"{type(exc).__name__}: {exc}"[:2000]})
        raise
    counts = tally.counts()
    await transition(book, ENTITY, run_id, "completed", expected="running", actor=actor, patch={
        "ended_at": book.clock.now(), "counts": counts},
        reason=Reason("notification_retention.completed.finished",
                      ", ".join(f"{kind} {c['removed']} removed, {c['protected']} protected"
                                for kind, c in counts.items())))
    return RetentionReport(run_id, dry_run, counts, *(tuple(tally.removed[kind]) for kind in REASONS))


# -- notifications -----------------------------------------------------------------------------------
def _eligible(t: sa.Table, before: float, edge: float) -> list[sa.ColumnElement[bool]]:
    return [t.c.status.in_(REMOVABLE), t.c.updated_at < before, t.c.created_at < edge,
            sa.or_(t.c.status != "failed", t.c.dead_letter == 0)]


async def _notifications(book: Book, tally: _Tally, *, before: float, edge: float, now: float, dry_run: bool,
                         actor: Actor, progress: Progress | None) -> None:
    t = notifications
    lc = book.policy("notification")
    settled = sa.text(status_in("notifications.status", [s for s in lc.statuses if s in lc.terminal]))
    # Followers and replayed descendants first: once they are gone, their owners are free in a later batch.
    linked_first = sa.case((sa.or_(t.c.obligation_owner_id.is_not(None), t.c.replayed_in.is_not(None)), 0), else_=1)
    listing = (sa.select(t.c.id).where(*_eligible(t, before, edge), settled)
               .order_by(linked_first, t.c.updated_at, t.c.id))
    old = (t.c.updated_at < before, t.c.created_at < edge)
    async with book.read() as conn:
        ids = [r.id for r in await conn.execute(listing)]
        for why, where in (("unsettled", t.c.status.in_(UNSETTLED)),
                           ("dead_letter", sa.and_(t.c.status == "failed", t.c.dead_letter == 1))):
            n = (await conn.execute(sa.select(sa.func.count()).select_from(t).where(where, *old))).scalar_one()
            tally.protect("notification", why, n)
    gone: set[str] = set()  # removed by this run (a dry run reads them as they were)
    for start in range(0, len(ids), PURGE_BATCH):
        chunk = ids[start : start + PURGE_BATCH]
        if dry_run:
            async with book.read() as conn:
                keep, owned, answers = await _decide(book, conn, chunk, before=before, edge=edge, now=now,
                                                     gone=gone, lock=False)
            removed = [i for i in chunk if i not in keep]
            attempts = [a for a, owner in owned if owner not in keep]
            answers = [i for i in answers if i not in keep]
        else:
            async with book.begin() as tx, tx.read() as conn:
                keep, owned, answers = await _decide(tx, conn, chunk, before=before, edge=edge, now=now,
                                                     gone=gone, lock=True)
                wanted = [i for i in chunk if i not in keep]
                outcomes = await purge_many(tx, "notification", wanted, reason=REASONS["notification"], actor=actor,
                                            expected=REMOVABLE)
                removed = [i for i, o in zip(wanted, outcomes, strict=True) if o.applied]
                taken = set(removed)
                attempts = [a for a, owner in owned if owner in taken]
                # Results only: an open observation kept its notification (``open_attempt``).
                outcomes = await purge_many(tx, "channel_attempt", attempts, reason=REASONS["channel_attempt"],
                                            actor=actor, expected=sorted(ATTEMPT_RESULTS))
                attempts = [a for a, o in zip(attempts, outcomes, strict=True) if o.applied]
                # Answered or timed out only: a pending response kept its notification (``response_pending``).
                answers = [i for i in answers if i in taken]
                outcomes = await purge_many(tx, "notification_response", answers,
                                            reason=REASONS["notification_response"], actor=actor,
                                            expected=("acked", "dismissed", "timed_out"))
                answers = [i for i, o in zip(answers, outcomes, strict=True) if o.applied]
        for why, n in keep.counts().items():
            tally.protect("notification", why, n)
        gone.update(removed)
        tally.removed["notification"] += removed
        tally.removed["channel_attempt"] += attempts
        tally.removed["notification_response"] += answers
        if progress is not None:
            progress(start + len(chunk), len(ids))


class _Keep(dict[str, str]):
    """Notification id -> why it is kept."""

    def add(self, ids: Iterable[str | None], why: str, among: Iterable[str]) -> None:
        wanted = set(among)
        for i in ids:
            if i is not None and i in wanted and i not in self:
                self[i] = why

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for why in self.values():
            out[why] = out.get(why, 0) + 1
        return out


async def _rows(book: Book, conn: AsyncConnection, query: sa.Select[Any], lock: bool) -> list[Any]:
    if lock:
        query = lock_rows(query, "wait")
    return list(await conn.execute(query))


async def _decide(book: Book, conn: AsyncConnection, chunk: list[str], *, before: float, edge: float, now: float,
                  gone: set[str], lock: bool) -> tuple[_Keep, list[tuple[str, str]], list[str]]:
    """Which of ``chunk`` stay, and why; and the (attempt id, notification id) of their channel attempts.
    With ``lock``, the rows and then their claims are locked first (in that order, the order a
    settlement takes them), so nothing can link to a row between this decision and its purge."""
    t, c, a = notifications, dedup_claims, channel_attempts  # tables
    keep = _Keep()
    rows = await _rows(book, conn, sa.select(t.c.id, t.c.dedup_claim_id, t.c.dedup_successor_id, t.c.replayed_in)
                       .where(t.c.id.in_(chunk), *_eligible(t, before, edge)), lock)
    found = {r.id for r in rows}
    keep.add((i for i in chunk if i not in found), "changed", chunk)  # settled again, replayed, or gone since listed
    ids = sorted(found)
    claim_ids = sorted({r.dedup_claim_id for r in rows if r.dedup_claim_id is not None})
    if ids:
        # The claims they are counted under, and any naming one of them as its owner.
        claims = await _rows(book, conn, sa.select(c.c.id, c.c.status, c.c.owner_id, c.c.window_until)
                             .where(sa.or_(c.c.id.in_(claim_ids), c.c.owner_id.in_(ids))).order_by(c.c.id), lock)
        keep.add((k.owner_id for k in claims if k.status == "owned"), "owns_claim", ids)
        keep.add((k.owner_id for k in claims if k.status == "satisfied" and now < k.window_until), "open_window", ids)
    # Forward links: an unsettled successor or replay it handed its obligation to.
    targets = {r.dedup_successor_id for r in rows} | {r.replayed_in for r in rows}
    targets.discard(None)
    if targets:
        live = {r.id for r in await conn.execute(
            sa.select(t.c.id).where(t.c.id.in_(sorted(targets)), t.c.status.in_(UNSETTLED)))}
        keep.add((r.id for r in rows if r.dedup_successor_id in live or r.replayed_in in live), "links_unsettled",
                 ids)
    attempts = [(r.id, r.notification_id, r.status) for r in await conn.execute(
        sa.select(a.c.id, a.c.notification_id, a.c.status).where(a.c.notification_id.in_(ids)).order_by(a.c.id))]
    keep.add((owner for _, owner, status in attempts if status not in ATTEMPT_RESULTS), "open_attempt", ids)
    # A response still waiting for a human is live work (part 3): its notification stays.
    answers = [(r.id, r.status) for r in await conn.execute(
        sa.select(notification_responses.c.id, notification_responses.c.status)
        .where(notification_responses.c.id.in_(ids)).order_by(notification_responses.c.id))]
    keep.add((i for i, status in answers if status == "pending"), "response_pending", ids)
    # Backward links: a retained notification names it as its owner or as the replay covering it. A
    # linker removed in this batch frees its target; one kept (for any reason) keeps it: to a fixpoint.
    links: list[tuple[str, str]] = []
    for column in (t.c.obligation_owner_id, t.c.replayed_in):
        links += [(r.id, r.target) for r in await conn.execute(
            sa.select(t.c.id, column.label("target")).where(column.in_(ids)))]
    grew = True
    while grew:
        before_size = len(keep)
        retained = (target for linker, target in links
                    if (linker not in found and linker not in gone) or linker in keep)
        keep.add(retained, "linked", ids)
        grew = len(keep) > before_size
    return (keep, [(i, owner) for i, owner, _ in attempts if owner not in keep],
            [i for i, _ in answers if i not in keep])
