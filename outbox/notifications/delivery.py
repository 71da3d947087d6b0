"""Delivering notifications on the delivery core: claim, attempt, finalize, and a pass of them (N1-N11).

Each step is its own function, so tests can interleave claimants and crash between any two:

- :func:`scan_due` — due notifications in (due time, id) order, read without locks;
- :func:`claim` / :func:`claim_due` — the claim (:func:`.attempts.claim_command`) after reading what the
  cycle holds on record (:mod:`.evidence`), or the settlement the record calls for instead; a settlement
  that moves an obligation (:mod:`.ownership`) or starts a response (:mod:`.responses`) runs in a
  transaction of its own;
- :func:`~.calls.run_attempt` — the channels of one attempt, outside any transaction (:mod:`.calls`);
- :func:`finalize` / :func:`finalize_all` — ONE transition fenced by the claim token
  (:func:`.attempts.finalize_command`), with what a terminal outcome causes.

:func:`deliver_due_notifications` runs a pass of them in the core's slots (:mod:`statebook.outbox.core.slots`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Command, Head, apply_many
from statebook.outbox.core.claims import Planned, claim_set, read_rows, record_set, won
from statebook.outbox.core.slots import Claimed, run_in_slots

from . import evidence, ownership, responses
from .attempts import (
    DEADLINE_SECONDS, DUE, LEASE_SECONDS, SCAN, AttemptResult, Candidate, Lease, Outcome, candidate, claim_command,
    finalize_command,
)
from .calls import run_attempt
from .channels import PERSISTENT_ORDER, Channel, LinkHook, Mode, check_order
from .errors import NotificationInvalid
from .schema import notifications

log = logging.getLogger("statebook.outbox.notifications")


# -- scan and claim -------------------------------------------------------------------------------
async def scan_due(book: Book, *, now: float, limit: int = 100) -> list[Candidate]:
    """Due notifications (pending or rate-limited, ``next_attempt_at <= now``), by due time then id (N9);
    read without locks (:func:`claim_due` scans, locks and claims in one transaction)."""
    return [candidate(r) for r in await read_rows(book, SCAN, DUE.params(now, limit), lock=False)]


async def claim(book: Book, candidate: Candidate, *, now: float, lease_seconds: float = LEASE_SECONDS
                ) -> Lease | None:
    """Claim one due notification: a fresh fencing token and lease, the attempt counted; None when
    another claimant won (nothing written). A notification whose lapsed claim recorded a qualifying
    success is settled delivered from it instead (N10a), and a lapsed lease on the cycle's last attempt
    is not claimed again: the notification is failed (dead-lettered when GUARANTEED); None either way.
    The single step of :func:`claim_due`, for tests and tools that interleave claimants."""
    c = candidate
    record = evidence.NOTHING
    if evidence.needs_reading(c):
        async with book.begin() as tx:
            record = (await evidence.read_records(tx, [c], now=now)).get(c.id, evidence.NOTHING)
    command, what = claim_command(c, now=now, lease_seconds=lease_seconds, record=record)
    if not isinstance(what, Lease) and _settles_more(c, what):
        async with book.begin() as tx:
            await _settle(tx, command, c, what, now=now)
        return None
    # Compared against the row as scanned: a candidate whose row moved since (another claim, even one that
    # put claim_id and cycle_attempts back as they were) is a lost race, nothing more.
    [outcome] = await apply_many(book, [command], seen={c.id: c.head})
    if not isinstance(what, Lease) or not outcome.applied:
        return None
    return what.won(outcome)


def _settles_more(c: Candidate, what: Outcome) -> bool:
    """Whether a claim's settlement writes more than the notification — its obligation's changes, or the
    response a delivery starts — so that it runs in a transaction of its own, claim row first."""
    if what == "delivered":
        return c.dedup_claim_id is not None or c.response_timeout is not None
    return c.dedup_claim_id is not None


async def _settle(tx: Book, command: Command, c: Candidate, what: Outcome, *, now: float) -> bool:
    """A claim's settlement with what it causes, in ``tx``; True when it applied."""
    if what == "delivered":
        return await _deliver(tx, command, c.head, cid=c.dedup_claim_id, response_timeout=c.response_timeout,
                              callback=c.timeout_callback, now=now)
    assert c.dedup_claim_id is not None
    return await _fail_owner(tx, command, c.head, c.dedup_claim_id, now=now)


async def _status(book: Book, notification_id: str) -> str | None:
    t = notifications
    async with book.read() as conn:
        return (await conn.execute(sa.select(t.c.status).where(t.c.id == notification_id))).scalar()


async def _fail_owner(tx: Book, command: Command, head: Head | None, cid: str, *, now: float) -> bool:
    """An owner's failing transition and what it does to its obligation (:mod:`.ownership`), in ``tx``:
    the successor is chosen under lock first and recorded as ``dedup_successor_id``; the obligation's
    writes follow only when the owner's own fenced transition applied. True when it applied."""
    plan = await ownership.plan_failure(tx, owner_id=command.entity_id, cid=cid, now=now)
    if plan.successor is not None:
        command = dataclasses.replace(command, patch={**command.patch, "dedup_successor_id": plan.successor})
    [outcome] = await apply_many(tx, [command], seen={command.entity_id: head} if head is not None else None)
    if outcome.applied:
        await ownership.apply_failure(tx, plan, now=now)
    return outcome.applied


async def claim_due(book: Book, *, now: float, limit: int, lease_seconds: float = LEASE_SECONDS
                    ) -> tuple[list[Lease], dict[str, int]]:
    """Scan, settle and claim up to ``limit`` due notifications in ONE transaction
    (:func:`statebook.outbox.core.claims.claim_set`, the dispatch claim's too): rows locked ``FOR UPDATE
    SKIP LOCKED`` on PostgreSQL, the record of each cycle read (:func:`.evidence.read_records`: what
    lapsed claims left ``started`` closed as ``unknown``), one claim (or settlement) per row compared
    against the row as read. The leases won, and counters ``claimed``, ``delivered`` (settled from a
    recorded success), ``dead_letter`` and ``failed``."""

    async def plan(tx: Book, rows: list[dict[str, Any]]) -> list[Planned[Lease | Outcome]]:
        found = [candidate(r) for r in rows]
        records = await evidence.read_records(tx, found, now=now)
        planned = []
        for c in found:
            command, what = claim_command(c, now=now, lease_seconds=lease_seconds,
                                          record=records.get(c.id, evidence.NOTHING))
            if not isinstance(what, Lease) and _settles_more(c, what):
                owners.append(c)  # settled after this transaction, claim row first (the ownership lock order)
                continue
            planned.append(Planned(command, c.head, what))
        return planned

    owners: list[Candidate] = []
    counts = dict.fromkeys(("claimed", "delivered", "dead_letter", "failed"), 0)
    done = await claim_set(book, SCAN, DUE.params(now, limit), plan)
    for c in owners:
        if await claim(book, c, now=now, lease_seconds=lease_seconds) is None:
            status = await _status(book, c.id)
            if status == "delivered":
                counts["delivered"] += 1
            elif status == "failed":
                counts["dead_letter" if c.mode == Mode.GUARANTEED.value else "failed"] += 1
    return won(done, counts, "claimed"), counts


# -- finalize ---------------------------------------------------------------------------------------
async def finalize(book: Book, lease: Lease, result: AttemptResult, *, now: float) -> str:
    """Record what the attempt came to as ONE transition fenced by the claim token: the outcome, or
    ``conflict`` (the claim is no longer this lease's: nothing written)."""
    command = finalize_command(lease, result, now=now)
    if _alone(lease, result):
        return await _finalize_owner(book, lease, result, command, now=now)
    seen = {lease.notification_id: lease.head} if lease.head is not None else None
    [outcome] = await apply_many(book, [command], seen=seen)
    return result.outcome if outcome.applied else "conflict"  # type: ignore[return-value]


def _alone(lease: Lease, result: AttemptResult) -> bool:
    """Whether this finalization writes more than the notification (its obligation's changes, or the
    response a delivery starts), so that it runs in a transaction of its own, not in a group."""
    if lease.dedup_claim_id is not None and result.outcome in ("delivered", "dead_letter", "failed"):
        return True
    return lease.response_timeout is not None and result.outcome == "delivered"


async def _finalize_owner(book: Book, lease: Lease, result: AttemptResult, command: Command, *, now: float) -> str:
    """A terminal outcome with what it causes, in ONE transaction: a delivery satisfies the owner's
    followers (:mod:`.ownership`) and starts the response it expects (:mod:`.responses`); a failure
    elects a successor."""
    assert result.outcome is not None
    cid = lease.dedup_claim_id
    async with book.begin() as tx:
        if result.outcome != "delivered":
            assert cid is not None
            applied = await _fail_owner(tx, command, lease.head, cid, now=now)
        else:
            applied = await _deliver(tx, command, lease.head, cid=cid, response_timeout=lease.response_timeout,
                                     callback=lease.timeout_callback, now=now)
    return result.outcome if applied else "conflict"


async def _deliver(tx: Book, command: Command, head: Head | None, *, cid: str | None,
                   response_timeout: float | None, callback: str | None, now: float) -> bool:
    """A delivering transition and what it causes, in ``tx``: the owner's followers satisfied, the
    response it expects started. True when it applied."""
    if cid is not None:
        # Every ownership change takes the claim's row lock first (intakes, failures, replays): so does this.
        await ownership.lock(tx, cid)
    nid = command.entity_id
    [outcome] = await apply_many(tx, [command], seen={nid: head} if head is not None else None)
    if outcome.applied and cid is not None:
        await ownership.owner_delivered(tx, owner_id=nid, cid=cid, now=now)
    if outcome.applied and response_timeout is not None:
        await responses.start_response(tx, nid, timeout=response_timeout, callback=callback, now=now)
    return outcome.applied


async def finalize_all(book: Book, done: list[tuple[Lease, AttemptResult]], *, now: float) -> list[str | None]:
    """:func:`finalize` for several attempts (distinct notifications) in one transaction, one
    transition each; None where the outcome could not be written (the claim lapses and a later pass
    takes the notification again)."""
    owners = [i for i, (lease, result) in enumerate(done) if _alone(lease, result)]
    plain = [item for i, item in enumerate(done) if i not in set(owners)]
    planned = [(finalize_command(lease, result, now=now), lease.head) for lease, result in plain]
    applied = iter(await record_set(book, planned) if planned else [])
    found: list[str | None] = []
    for i, (lease, result) in enumerate(done):
        if i in owners:  # with its obligation's writes: its own transaction
            try:
                found.append(await finalize(book, lease, result, now=now))
            except Exception:
                log.exception("could not record the outcome of notification %s", lease.notification_id)
                found.append(None)
            continue
        ok = next(applied)
        found.append(None if ok is None else result.outcome if ok else "conflict")
    return found


# -- a pass -----------------------------------------------------------------------------------------
COUNTERS = ("claimed", "delivered", "retried", "dead_letter", "failed", "rate_limited", "stopped", "conflict")


async def deliver_due_notifications(
    book: Book, channels: Mapping[str, Channel], *, limit: int = 100, concurrency: int = 8,
    lease_seconds: float = LEASE_SECONDS, deadline: float = DEADLINE_SECONDS, order: Sequence[str] = PERSISTENT_ORDER,
    links: LinkHook | None = None,
) -> dict[str, int]:
    """One pass over at most ``limit`` due notifications, at most ``concurrency`` attempts at once
    (:func:`statebook.outbox.core.slots.run_in_slots`, the dispatch pass's slots): claims in sets as slots
    free (:func:`claim_due`), attempts outside any transaction, finalizations of attempts that end
    together in one transaction. Its counters (``stopped``: attempts that ended without an outcome).
    ``order``: the persistent channels' fallback order, a permutation of :data:`~.channels.PERSISTENT_ORDER`;
    ``links``: makes the response links each delivery carries (:data:`~.channels.LinkHook`; none by default)."""
    if book.conn is not None:
        raise NotificationInvalid("book: deliver_due_notifications runs channels outside any transaction; pass an "
                                  "unbound book", argument="book", rule="bound")
    if not 0 < deadline < lease_seconds:
        raise NotificationInvalid(f"deadline: the adapter deadline ({deadline:g}s) must be shorter than the lease "
                                  f"({lease_seconds:g}s)", argument="deadline", rule="range")
    try:
        order = check_order(order)
    except ValueError as exc:
        raise NotificationInvalid(f"order: {exc}", argument="order", rule="order") from None
    counts = dict.fromkeys(COUNTERS, 0)
    clock = book.clock

    async def more(n: int) -> Claimed[Lease]:
        won, claimed = await claim_due(book, now=clock.now(), limit=n, lease_seconds=lease_seconds)
        return Claimed(won, claimed, sum(claimed.values()))

    async def attempt(lease: Lease) -> AttemptResult:
        try:
            return await run_attempt(book, lease, channels, deadline=deadline, order=order, links=links)
        except Exception as exc:
            log.error("notification %s: the attempt failed; its claim lapses and a later pass retries it",
                      lease.notification_id, exc_info=exc)
            return AttemptResult(None, error=f"{type(exc).__name__}: {exc}")

    async def record(done: list[tuple[Lease, AttemptResult]]) -> None:
        decided = [(lease, result) for lease, result in done if result.outcome is not None]
        counts["stopped"] += len(done) - len(decided)
        if decided:
            for (lease, result), outcome in zip(decided, await finalize_all(book, decided, now=clock.now()), strict=True):
                counts[{"retry": "retried", None: "stopped"}.get(outcome, outcome)] += 1  # type: ignore[index]
                if outcome is not None and outcome != "conflict":
                    log.info("notification %s attempt %s: %s%s", lease.notification_id, lease.attempt, outcome,
                             f" via {result.delivered_channel}" if result.delivered_channel else "",
                             extra={"notification_id": lease.notification_id, "attempt": lease.attempt,
                                    "outcome": outcome, "channel": result.delivered_channel})

    await run_in_slots([], attempt, record, concurrency=concurrency, counts=counts, refill=more, budget=limit,
                       what="notification attempt", overlap=True)
    return counts
