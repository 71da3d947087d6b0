"""Delivery: the steps (settle/expire, claim, execute, finalize) and the passes built from them.

Each step that writes is ONE engine transition in its own transaction, or joins the bound book it
is given, so tests and tools can interleave steps and crash between them. ``execute`` touches no
database: the transport runs between the claim's commit and the finalization, so a crash there
leaves a ``delivering`` row whose lease lapses and which a later scan reclaims (at-least-once,
seed ADR-0059 D3).

A pass claims up to ``batch_size`` due rows in ONE transaction (one set-based engine call: one
transition and one fact per row), runs at most ``concurrency`` transports at once outside any
transaction, and records outcomes as they arrive — results finishing while a finalization commits
are recorded together in the next transaction, each still its own transition.

>>> counts = await deliver_due_dispatches(book, transport=CallableTransport(send))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from statebook.lifecycle import Actor, Book, Command, EntityNotFound, apply, apply_many

from .attempts import (
    CLAIM_LEASE_SECONDS,
    DELIVERY_ACTOR,
    Candidate,
    Finalized,
    Lease,
    Settled,
    backoff_seconds,
    claim_command,
    finalize_command,
    next_due,
    scan,
    scan_heads,
    settle_command,
)
from .errors import DispatchInvalid
from .transport import ArgvTransport, Transport, TransportResult

__all__ = [
    "CLAIM_LEASE_SECONDS", "COUNTERS", "Candidate", "Lease", "backoff_seconds", "claim", "claim_due", "claim_offered",
    "deliver_offered",
    "deliver_due_dispatches", "execute", "expire", "finalize", "finalize_all", "next_due", "run_leases", "scan",
    "settle",
]


async def _applied(book: Book, command: Command) -> bool:
    """Apply one command; False when it lost — including to a purge since the row was read."""
    try:
        return (await apply(book, command)).applied
    except EntityNotFound:
        return False


# -- the steps ------------------------------------------------------------------------------------
async def expire(book: Book, candidate: Candidate, *, now: float, actor: Actor = DELIVERY_ACTOR) -> bool:
    """Move a candidate whose ``expires_at`` has passed to ``expired``; True when that applied.

    Expiry is checked before the claim and wins even when attempts remain.
    """
    if not candidate.expired(now):
        return False
    planned = settle_command(candidate, now, actor)
    assert planned is not None
    return await _applied(book, planned[0])


async def settle(book: Book, candidate: Candidate, *, now: float, actor: Actor = DELIVERY_ACTOR) -> Settled | None:
    """Finish a candidate that must not be sent again, before any claim.

    ``expired`` when its deadline passed; ``dead_letter`` when the lease of its last allowed
    attempt lapsed (the outcome of that send is unknown, and the bound forbids another).
    None when the candidate may be claimed, or when the compare-and-set lost.
    """
    planned = settle_command(candidate, now, actor)
    if planned is None:
        return None
    return planned[1] if await _applied(book, planned[0]) else None


async def claim(book: Book, candidate: Candidate, *, now: float, actor: Actor = DELIVERY_ACTOR) -> Lease | None:
    """Win attempt ``candidate.attempt + 1`` or return None (lost the race, expired, or exhausted).

    A guarded transition to ``delivering``: status, attempt and due time must still be what the
    scan read; it increments ``attempt``, sets the lease as the due time and writes a new claim id.
    On PostgreSQL a row another transaction holds is skipped (``FOR UPDATE SKIP LOCKED``), not
    waited for.
    """
    planned = claim_command(candidate, now, actor)
    if planned is None:
        return None
    command, lease = planned
    [outcome] = await apply_many(book, [command], lock="skip_locked")
    return lease if outcome.applied else None


async def execute(lease: Lease, transport: Transport) -> TransportResult:
    """Run the transport for a lease. No database; never raises for a transport problem."""
    try:
        result = await transport.send(lease.deliver_to, lease.payload)
    except Exception as exc:
        return TransportResult.failed(f"{type(exc).__name__}: {exc}")
    if not isinstance(result, TransportResult):
        return TransportResult.failed(f"transport returned {result!r}, not a TransportResult")
    return result


async def finalize(
    book: Book, lease: Lease, result: TransportResult, *, now: float, actor: Actor = DELIVERY_ACTOR
) -> Finalized:
    """Record one attempt's outcome as ONE transition from ``delivering``.

    Status, ``last_error`` and ``next_attempt_at`` change together or not at all, guarded on the
    lease's attempt and claim id: a stale ("zombie") lease gets ``conflict`` and writes nothing.
    """
    command, ret = finalize_command(lease, result, now, actor)
    return ret if await _applied(book, command) else "conflict"


# -- passes ---------------------------------------------------------------------------------------
log = logging.getLogger("statebook.outbox")

COUNTERS = ("attempted", "delivered", "dead_letter", "expired", "retried")
_COUNTED = {"delivered": "delivered", "awaiting_ack": "delivered", "retried": "retried", "dead_letter": "dead_letter"}


Planned = list[tuple[Command, "str | Lease"]]


def _plan(
    rows: Iterable[tuple[Candidate, dict[str, Any]]], now: float, actor: Actor
) -> tuple[Planned, dict[str, dict[str, Any]]]:
    """The settle or claim command for each row read (once per dispatch), and the rows as read."""
    planned: Planned = []
    seen: dict[str, dict[str, Any]] = {}
    for candidate, row in rows:
        if candidate.dispatch_id in seen:
            continue
        settling = settle_command(candidate, now, actor)
        claiming = None if settling else claim_command(candidate, now, actor)
        if settling or claiming:
            planned.append(settling or claiming)  # type: ignore[arg-type]
            seen[candidate.dispatch_id] = row
    return planned, seen


def _won(planned: Planned, outcomes: list[Any]) -> tuple[list[Lease], dict[str, int]]:
    """The leases won (with the chain head their claim wrote) and the pass's counters."""
    counts = dict.fromkeys(COUNTERS, 0)
    leases: list[Lease] = []
    for (_, what), outcome in zip(planned, outcomes, strict=True):
        if not outcome.applied:
            continue
        if isinstance(what, Lease):
            leases.append(what.with_head(outcome.version, outcome.fact_id, outcome.chain_hash))
            counts["attempted"] += 1
        else:
            counts[what] += 1
    return leases, counts


async def claim_due(
    book: Book, *, now: float, limit: int = 100, actor: Actor = DELIVERY_ACTOR
) -> tuple[list[Lease], dict[str, int]]:
    """Scan, settle and claim up to ``limit`` due rows in ONE transaction; the won leases.

    On PostgreSQL the scan locks its rows ``FOR UPDATE SKIP LOCKED``, so concurrent workers claim
    disjoint rows instead of colliding. Counts ``attempted`` (claims won only), ``expired`` and
    ``dead_letter`` (lapsed last attempts).
    """
    async with book.begin() as tx:
        planned, seen = _plan(await scan_heads(tx, now=now, limit=limit, skip_locked=True), now, actor)
        # The scan locked and read these rows in this transaction: no second read.
        outcomes = await apply_many(tx, [command for command, _ in planned], lock="skip_locked", seen=seen)
    return _won(planned, outcomes)


async def claim_offered(
    book: Book, offered: list[tuple[Candidate, dict[str, Any]]], *, now: float, actor: Actor = DELIVERY_ACTOR
) -> tuple[list[Lease], dict[str, int]]:
    """Settle or claim rows the caller already read (an offer, see :mod:`.offers`) without scanning.

    Each is the usual guarded transition, compared against the row as given (``apply_many(seen=)``);
    a row that changed since is a lost race. On PostgreSQL, with an unbound book and only claims,
    that is ONE statement. Counts as :func:`claim_due` does.
    """
    planned, seen = _plan(offered, now, actor)
    if not planned:
        return [], dict.fromkeys(COUNTERS, 0)
    outcomes = await apply_many(book, [command for command, _ in planned], seen=seen)
    return _won(planned, outcomes)


async def finalize_all(
    book: Book, done: list[tuple[Lease, TransportResult]], *, now: float, actor: Actor = DELIVERY_ACTOR
) -> list[Finalized]:
    """Finalize several results in one transaction, one transition each (distinct dispatches)."""
    planned = [finalize_command(lease, result, now, actor) for lease, result in done]
    heads = {lease.dispatch_id: lease.head() for lease, _ in done}
    seen = {k: v for k, v in heads.items() if v is not None}
    outcomes = await apply_many(book, [command for command, _ in planned], seen=seen)
    return [ret if outcome.applied else "conflict" for (_, ret), outcome in zip(planned, outcomes, strict=True)]


async def _finalize_group(
    book: Book, done: list[tuple[Lease, TransportResult]], now: Callable[[], float], actor: Actor
) -> list[Finalized | None]:
    if len({lease.dispatch_id for lease, _ in done}) == len(done):
        try:
            return list(await finalize_all(book, done, now=now(), actor=actor))
        except Exception:
            log.warning("group finalization failed; finalizing one by one", exc_info=True)
    outcomes: list[Finalized | None] = []
    for lease, result in done:
        try:
            outcomes.append(await finalize(book, lease, result, now=now(), actor=actor))
        except Exception:
            # The row stays delivering; its lease lapses and a later scan reclaims it.
            log.exception("could not finalize dispatch %s attempt %s", lease.dispatch_id, lease.attempt)
            outcomes.append(None)
    return outcomes


async def run_leases(
    book: Book,
    leases: Iterable[Lease],
    transport: Transport,
    *,
    concurrency: int = 8,
    now: Callable[[], float] | None = None,
    actor: Actor = DELIVERY_ACTOR,
) -> dict[str, int]:
    """Execute leases with at most ``concurrency`` transports in flight; finalize as they finish."""
    if book.conn is not None:
        raise DispatchInvalid("transports must not run inside a database transaction; pass an unbound book")
    clock = now or book.clock.now
    counts = dict.fromkeys(COUNTERS, 0)
    gate = asyncio.Semaphore(concurrency)
    queue: asyncio.Queue[tuple[Lease, TransportResult]] = asyncio.Queue()
    leases = list(leases)

    async def send(lease: Lease) -> None:
        async with gate:
            result = await execute(lease, transport)
        queue.put_nowait((lease, result))

    async def finalizer() -> None:
        remaining = len(leases)
        while remaining:
            done = [await queue.get()]
            await asyncio.sleep(0)  # let sends that are already finishing join this group
            while not queue.empty():
                done.append(queue.get_nowait())
            remaining -= len(done)
            for outcome in await _finalize_group(book, done, clock, actor):
                key = _COUNTED.get(outcome or "")
                if key:
                    counts[key] += 1

    tasks = [asyncio.ensure_future(finalizer()), *(asyncio.ensure_future(send(lease)) for lease in leases)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return counts


async def deliver_due_dispatches(
    book: Book,
    *,
    now: float | None = None,
    transport: Transport | None = None,
    notify_template: list[str] | None = None,
    batch_size: int = 100,
    concurrency: int = 8,
    actor: Actor = DELIVERY_ACTOR,
) -> dict[str, int]:
    """One delivery pass over at most ``batch_size`` due rows; the seed's five counters.

    ``attempted`` counts claims won (not rows seen); ``delivered`` successful sends whose outcome
    was recorded (including ack-required sends now awaiting their ack); ``retried`` failures
    scheduled again; ``dead_letter`` and ``expired`` rows moved there. Without ``transport`` an
    :class:`ArgvTransport` over ``notify_template`` is used; a missing or invalid template fails
    each claimed row, it does not raise.

    >>> counts = await deliver_due_dispatches(book, transport=CallableTransport(send))  # doctest: +SKIP
    """
    if batch_size < 1 or concurrency < 1:
        raise DispatchInvalid(f"batch_size and concurrency must be >= 1, got {batch_size} and {concurrency}")
    if book.conn is not None:
        raise DispatchInvalid("deliver_due_dispatches runs transports; pass an unbound book, not a transaction")
    if transport is None:
        transport = ArgvTransport(notify_template)
    clock: Callable[[], float] = (lambda: now) if now is not None else book.clock.now
    leases, counts = await claim_due(book, now=clock(), limit=batch_size, actor=actor)
    return await _run_and_count(book, leases, counts, transport, concurrency, clock, actor)


async def deliver_offered(
    book: Book,
    offered: list[tuple[Candidate, dict[str, Any]]],
    *,
    transport: Transport,
    concurrency: int = 8,
    actor: Actor = DELIVERY_ACTOR,
) -> dict[str, int]:
    """:func:`deliver_due_dispatches` for rows already read (an offer): claim them, send, record."""
    if book.conn is not None:
        raise DispatchInvalid("deliver_offered runs transports; pass an unbound book, not a transaction")
    clock = book.clock.now
    leases, counts = await claim_offered(book, offered, now=clock(), actor=actor)
    return await _run_and_count(book, leases, counts, transport, concurrency, clock, actor)


async def _run_and_count(
    book: Book, leases: list[Lease], counts: dict[str, int], transport: Transport, concurrency: int,
    clock: Callable[[], float], actor: Actor,
) -> dict[str, int]:
    if leases:
        ran = await run_leases(book, leases, transport, concurrency=concurrency, now=clock, actor=actor)
        for key in ("delivered", "dead_letter", "retried"):
            counts[key] += ran[key]
    return counts
