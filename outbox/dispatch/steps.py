"""The steps of a delivery — settle or expire, claim, execute, finalize, release — each separately callable.

Each step that writes is ONE engine transition in its own transaction, or joins the bound book it
is given, so tests and tools can interleave steps and crash between them. ``execute`` touches no
database: the transport runs between the claim's commit and the finalization, so a crash there
leaves a ``delivering`` row whose lease lapses and which a later scan reclaims (at-least-once,
specs/outbox.md O5, O7). The passes built from these steps are in :mod:`.delivery`.
"""

from __future__ import annotations

import asyncio

from statebook.lifecycle import Actor, Book, Command, EntityNotFound, apply_many, tracing
from statebook.lifecycle.engine import apply

from .attempts import (
    DELIVERY_ACTOR,
    Candidate,
    Finalized,
    Lease,
    Released,
    Settled,
    claim_command,
    finalize_command,
    release_command,
    settle_command,
)
from .signal import traceparent_of, with_attempt
from .transport import NOTIFY_TIMEOUT_SECONDS, Transport, TransportResult

__all__ = ["claim", "execute", "expire", "finalize", "release", "settle"]


async def _applied(book: Book, command: Command) -> bool:
    """Apply one command; False when it lost — including to a purge since the row was read."""
    try:
        return (await apply(book, command, on_conflict="return")).applied
    except EntityNotFound:
        return False


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


async def claim(
    book: Book, candidate: Candidate, *, now: float, actor: Actor = DELIVERY_ACTOR,
    timeout: float = NOTIFY_TIMEOUT_SECONDS,
) -> Lease | None:
    """Win attempt ``candidate.attempt + 1`` or return None (lost the race, expired, or exhausted).

    A guarded transition to ``delivering``: status, attempt and due time must still be what the
    scan read; it increments ``attempt``, sets the lease (``now + lease_seconds(timeout)``, O21) as
    the due time and writes a new claim id. On PostgreSQL a row another transaction holds is
    skipped (``FOR UPDATE SKIP LOCKED``), not waited for.
    """
    planned = claim_command(candidate, now, actor, timeout)
    if planned is None:
        return None
    command, lease = planned
    [outcome] = await apply_many(book, [command], lock="skip_locked")
    return lease if outcome.applied else None


async def execute(lease: Lease, transport: Transport, *, now: float | None = None) -> TransportResult | None:
    """Run the transport for a lease. No database; never raises for a transport problem.

    Given ``now`` (the clock when the send would start), a lease with less than its transport
    timeout left is not sent — None — and a send is cut when it outlives the lease (O21).
    """
    tracer = tracing.active()
    if tracer is None:
        return await _execute(lease, transport, now)
    attributes: dict[str, tracing.Attribute] = {"messaging.system": "statebook", "messaging.operation.name": "process",
                  "messaging.operation.type": "process", "messaging.destination.name": "dispatch",
                  "messaging.message.id": lease.dispatch_id, "statebook.dispatch.kind": lease.kind,
                  "statebook.dispatch.attempt": lease.attempt}
    # The parent is the enqueue's send span, carried in the envelope (tracing may have been off then).
    with tracer.span("process dispatch", "consumer", attributes, parent=traceparent_of(lease.payload)) as span:
        result = await _execute(lease, transport, now)
        if result is None:
            span.set("statebook.dispatch.sent", False)  # released: less than the transport timeout was left
        elif not result.ok:
            span.fail("timeout" if result.evidence.get("timed_out") else "transport_failed")
        return result


async def _execute(lease: Lease, transport: Transport, now: float | None) -> TransportResult | None:
    try:
        if now is None:
            result = await transport.send(lease.deliver_to, with_attempt(lease.payload, lease.attempt))
        elif not lease.may_start(now):
            return None
        else:
            payload = with_attempt(lease.payload, lease.attempt)  # the envelope carries the attempt it makes (O1)
            async with asyncio.timeout(lease.lease_until - now):  # same task: no per-send Task (wait_for on 3.11)
                result = await transport.send(lease.deliver_to, payload)
    except TimeoutError:
        return TransportResult.failed("timeout: the send outlived its lease and was cut", timed_out=True)
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


async def release(book: Book, lease: Lease, *, now: float, actor: Actor = DELIVERY_ACTOR) -> Released:
    """Give back a lease that was not sent (O21) as ONE transition ``delivering -> pending``.

    Nothing was sent, so the attempt is not used up: the row returns to ``lease.attempt - 1``, due
    ``now``, and the next claim takes it as the same attempt number. Fenced like a finalization (O8):
    a lease whose row was reclaimed, acknowledged or retried since gets ``conflict`` and writes nothing.
    """
    return "released" if await _applied(book, release_command(lease, now, actor)) else "conflict"
