"""Delivery passes: claim due rows in sets, send within bounded concurrency, record outcomes as they arrive.

A pass claims due rows in set-based transactions (one engine call: one transition and one fact per
row), runs at most ``concurrency`` transports at once outside any transaction, and records outcomes
as they arrive — results finishing while a finalization commits are recorded together in the next
transaction, each still its own transition. A pass never holds a lease it cannot start in time
(O21): it first claims no more than its free send slots, and claims beyond them only as far as the
sends it has seen show they will start within the lease margin; every send checks its lease just
before it starts and is skipped, not sent, when less than the transport timeout is left; the pass
then releases it (``delivering -> pending``, the attempt given back, due at once). The single steps
are in :mod:`.steps`.

>>> counts = await deliver_due_dispatches(book, transport=CallableTransport(send))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, Literal, TypeVar

from statebook.lifecycle import Actor, Book, Command, Head, apply_many

from . import checks
from ..core.claims import Planned, claim_set, record_set, won
from ..core.slots import Claimed, run_in_slots
from .errors import DispatchInvalid
from .transport import NOTIFY_TIMEOUT_SECONDS, ArgvTransport, Transport, TransportResult, check_elements, send_timeout
from .attempts import (
    DELIVERY_ACTOR,
    DUE,
    SCAN,
    Candidate,
    Finalized,
    Lease,
    Released,
    claim_command,
    claimable,
    finalize_command,
    release_command,
    settle_command,
    with_head,
)
from .steps import execute

__all__ = [
    "COUNTERS", "claim_due", "claim_offered", "deliver_due_dispatches", "deliver_offered", "finalize_all",
    "release_all", "run_leases",
]

log = logging.getLogger("statebook.outbox")

COUNTERS = ("attempted", "delivered", "dead_letter", "expired", "retried")
_COUNTED = {"delivered": "delivered", "awaiting_ack": "delivered", "retried": "retried", "dead_letter": "dead_letter"}

R = TypeVar("R", bound=str)
"""What recording a lease returns when its command applies (an outcome, or ``released``)."""


Plan = list[tuple[Command, "str | Lease"]]


def _plan(
    rows: Iterable[tuple[Candidate, Head]], now: float, actor: Actor, timeout: float
) -> tuple[Plan, dict[str, Head]]:
    """The settle or claim command for each row read (once per dispatch), and the heads as read."""
    planned: Plan = []
    seen: dict[str, Head] = {}
    for candidate, row in rows:
        if candidate.dispatch_id in seen:
            continue
        settling = settle_command(candidate, now, actor)
        claiming = None if settling else claim_command(candidate, now, actor, timeout)
        if settling or claiming:
            planned.append(settling or claiming)  # type: ignore[arg-type]
            seen[candidate.dispatch_id] = row
    return planned, seen


def _won(planned: Iterable[tuple["str | Lease", Any]]) -> tuple[list[Lease], dict[str, int]]:
    """The leases won (with the head their claim left) and the pass's counters."""
    counts = dict.fromkeys(COUNTERS, 0)
    return won(planned, counts, "attempted"), counts


async def claim_due(
    book: Book, *, now: float, limit: int = 100, actor: Actor = DELIVERY_ACTOR,
    timeout: float = NOTIFY_TIMEOUT_SECONDS,
) -> tuple[list[Lease], dict[str, int]]:
    """Scan, settle and claim up to ``limit`` due rows in ONE transaction; the won leases.

    On PostgreSQL the scan locks its rows ``FOR UPDATE SKIP LOCKED``, so concurrent workers claim
    disjoint rows instead of colliding. Counts ``attempted`` (claims won only), ``expired`` and
    ``dead_letter`` (lapsed last attempts). Each lease is sized for sends of ``timeout`` seconds.
    """
    if limit < 1:
        raise DispatchInvalid(f"limit must be >= 1, got {limit}", argument="limit", rule="range")

    async def plan(_tx: Book, rows: list[dict[str, Any]]) -> list[Planned[str | Lease]]:
        planned, seen = _plan((with_head(r) for r in rows), now, actor, timeout)
        return [Planned(command, seen[command.entity_id], what) for command, what in planned]

    return _won(await claim_set(book, SCAN, DUE.params(now, limit), plan))


async def claim_offered(
    book: Book, offered: list[tuple[Candidate, Head]], *, now: float, actor: Actor = DELIVERY_ACTOR,
    timeout: float = NOTIFY_TIMEOUT_SECONDS,
) -> tuple[list[Lease], dict[str, int]]:
    """Settle or claim rows the caller already read (an offer, see :mod:`.offers`) without scanning.

    Each is the usual guarded transition, compared against the row as given (``apply_many(seen=)``);
    a row that changed since is a lost race. On PostgreSQL, with an unbound book and only claims,
    that is ONE statement. Counts as :func:`claim_due` does.
    """
    planned, seen = _plan(offered, now, actor, timeout)
    if not planned:
        return [], dict.fromkeys(COUNTERS, 0)
    outcomes = await apply_many(book, [command for command, _ in planned], seen=seen)
    return _won((what, outcome) for (_, what), outcome in zip(planned, outcomes, strict=True))


async def finalize_all(
    book: Book, done: list[tuple[Lease, TransportResult]], *, now: float, actor: Actor = DELIVERY_ACTOR
) -> list[Finalized]:
    """Finalize several results in one transaction, one transition each (distinct dispatches)."""
    planned = [(lease, *finalize_command(lease, result, now, actor)) for lease, result in done]
    return await _record_all(book, planned)


async def release_all(
    book: Book, leases: list[Lease], *, now: float, actor: Actor = DELIVERY_ACTOR
) -> list[Released]:
    """Release several unsent leases in one transaction, one transition each (distinct dispatches)."""
    planned: list[tuple[Lease, Command, Literal["released"]]] = [
        (lease, release_command(lease, now, actor), "released") for lease in leases]
    return await _record_all(book, planned)


async def _record_all(book: Book, planned: list[tuple[Lease, Command, R]]) -> list[R | Literal["conflict"]]:
    """Apply each lease's command in one transaction; what each returns, or ``conflict`` where it lost."""
    heads = {lease.dispatch_id: lease.head for lease, _, _ in planned}
    seen = {k: v for k, v in heads.items() if v is not None}
    outcomes = await apply_many(book, [command for _, command, _ in planned], seen=seen)
    return [ret if outcome.applied else "conflict" for (_, _, ret), outcome in zip(planned, outcomes, strict=True)]


def _record_command(lease: Lease, result: TransportResult | None, now: float, actor: Actor) -> tuple[Command, str]:
    """A sent lease's finalization, or the release of one that was not sent (``result`` None)."""
    if result is None:
        return release_command(lease, now, actor), "released"
    return finalize_command(lease, result, now, actor)


async def _record_group(
    book: Book, done: list[tuple[Lease, TransportResult | None]], now: Callable[[], float], actor: Actor
) -> list[str | None]:
    """Record what a pass's sends came to — outcomes and releases — together, one transition each."""
    at = now()
    planned = [(lease, *_record_command(lease, result, at, actor)) for lease, result in done]
    applied = await record_set(book, [(command, lease.head) for lease, command, _ in planned])
    return [None if ok is None else ret if ok else "conflict" for (_, _, ret), ok in zip(planned, applied, strict=True)]


Refill = Callable[[int], Awaitable[tuple[list[Lease], dict[str, int]]]]
"""Claims up to n more leases for a running pass: the won leases and the claim's counters."""

_paces: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
"""The slowest send of each transport's last timed pass (O21), so that passes run one after another
with one transport (a worker, a tick loop) claim a fast transport's batch at once from the second on."""


def _pace(transport: Transport) -> float | None:
    try:
        return _paces.get(transport)
    except TypeError:  # not weak-referenceable: each pass starts from its free slots
        return None


async def run_leases(
    book: Book,
    leases: Iterable[Lease],
    transport: Transport,
    *,
    concurrency: int = 8,
    now: Callable[[], float] | None = None,
    actor: Actor = DELIVERY_ACTOR,
    refill: Refill | None = None,
    budget: int = 0,
) -> dict[str, int]:
    """Execute leases with at most ``concurrency`` transports in flight; finalize as they finish.

    Each send checks its lease with ``now`` right before it starts and is skipped when less than the
    transport timeout is left (O21): the lease is released — its row ``pending`` again, due at once,
    the attempt not used up — in the same transaction as the outcomes that finish with it. With
    ``refill``, slots that fall idle are filled by claiming more leases, ``budget`` rows at most.
    The slots are :func:`.slots.run_in_slots`, the notification pass's too.
    """
    checks.book_arg(book, unbound="run_leases")
    clock = now or book.clock.now
    counts = dict.fromkeys(COUNTERS, 0)
    slowest: float | None = None  # of this pass's sends; until one is timed, the transport's last pass
    earlier = _pace(transport)

    async def send(lease: Lease) -> TransportResult | None:
        nonlocal slowest
        started = clock()
        result = await execute(lease, transport, now=started)
        # A skipped lease means sends got slower than timed: claim only free slots from now on.
        slowest = max(slowest or 0.0, clock() - started if result is not None else lease.timeout)
        return result

    async def record(done: list[tuple[Lease, TransportResult | None]]) -> None:
        for lease, result in done:
            if result is None:
                log.warning("dispatch %s attempt %s not sent: less than its %gs transport timeout was left "
                            "of the lease; releasing it for a later claim", lease.dispatch_id, lease.attempt,
                            lease.timeout)
        for (lease, result), outcome in zip(done, await _record_group(book, done, clock, actor), strict=True):
            key = _COUNTED.get(outcome or "")
            if key:
                counts[key] += 1
            if outcome is not None and outcome != "released":
                log.info("dispatch %s (%s) attempt %s: %s", lease.dispatch_id, lease.kind, lease.attempt, outcome,
                         extra={"dispatch_id": lease.dispatch_id, "attempt": lease.attempt,
                                         "outcome": outcome, "kind": lease.kind})

    async def more(n: int) -> Claimed[Lease]:
        assert refill is not None
        won, claimed = await refill(n)
        return Claimed(won, claimed, claimed["attempted"] + claimed["expired"] + claimed["dead_letter"])

    def want(free: int) -> int:
        """How many to claim with ``free`` idle slots (see :func:`.attempts.claimable`)."""
        return claimable(free, earlier if slowest is None else slowest)

    try:
        await run_in_slots(leases, send, record, concurrency=concurrency, counts=counts,
                           refill=more if refill is not None else None, budget=budget, want=want, what="dispatch send")
    finally:
        if slowest is not None:
            with contextlib.suppress(TypeError):
                _paces[transport] = slowest
    return counts


async def deliver_due_dispatches(
    book: Book,
    *,
    now: datetime | float | None = None,
    transport: Transport | None = None,
    notify_template: list[str] | None = None,
    batch_size: int = 100,
    concurrency: int = 8,
    actor: Actor = DELIVERY_ACTOR,
) -> dict[str, int]:
    """One delivery pass over at most ``batch_size`` due rows; its five counters (O11).

    ``attempted`` counts claims won (not rows seen); ``delivered`` successful sends whose outcome
    was recorded (including ack-required sends now awaiting their ack); ``retried`` failures
    scheduled again; ``dead_letter`` and ``expired`` rows moved there. Without ``transport`` an
    :class:`ArgvTransport` over ``notify_template`` is used; a missing or invalid template fails
    each claimed row, it does not raise. Leases are sized for the transport's timeout and claimed
    no faster than sends can start (O21). ``now`` (an aware ``datetime`` or POSIX seconds) fixes the pass's
    time; by default each step reads the book's clock.

    >>> counts = await deliver_due_dispatches(book, transport=CallableTransport(send))  # doctest: +SKIP
    """
    checks.book_arg(book, unbound="deliver_due_dispatches")
    clock: Callable[[], float] = book.clock.now
    if now is not None:
        at = checks.when("now", now)
        clock = lambda: at  # noqa: E731
    checks.count("batch_size", batch_size, checks.MAX_BATCH)
    checks.count("concurrency", concurrency, checks.MAX_CONCURRENCY)
    checks.actor(actor)
    if transport is None:
        check_elements("notify_template", notify_template)
        transport = ArgvTransport(notify_template)
    else:
        checks.transport_arg(transport)
    refill = _due_claimer(book, clock, send_timeout(transport), actor)
    return await run_leases(book, [], transport, concurrency=concurrency, now=clock, actor=actor, refill=refill,
                            budget=batch_size)


def _due_claimer(book: Book, clock: Callable[[], float], timeout: float, actor: Actor) -> Refill:
    async def claim_some(limit: int) -> tuple[list[Lease], dict[str, int]]:
        return await claim_due(book, now=clock(), limit=limit, actor=actor, timeout=timeout)
    return claim_some


async def deliver_offered(
    book: Book,
    offered: list[tuple[Candidate, Head]],
    *,
    transport: Transport,
    concurrency: int = 8,
    actor: Actor = DELIVERY_ACTOR,
) -> dict[str, int]:
    """:func:`deliver_due_dispatches` for rows already read (an offer): claim them, send, record.

    At most ``concurrency`` offers are claimed up front; the pass claims the rest through the scan
    as its slots free (O21).
    """
    checks.book_arg(book, unbound="deliver_offered")
    clock = book.clock.now
    timeout = send_timeout(transport)
    leases, counts = await claim_offered(book, offered[:concurrency], now=clock(), actor=actor, timeout=timeout)
    budget = max(0, len(offered) - concurrency)
    if leases or budget:
        ran = await run_leases(book, leases, transport, concurrency=concurrency, now=clock, actor=actor,
                               refill=_due_claimer(book, clock, timeout, actor), budget=budget)
        for key in COUNTERS:
            counts[key] += ran[key]
    return counts
