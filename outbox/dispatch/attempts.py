"""Attempts: the records (Candidate, Lease), backoff, the due scan, and the transition each step writes.

The command builders here are shared by the single steps and the batched passes in
:mod:`.delivery`, so a step and a pass can never disagree on what an outcome means.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, Head, Reason, head_columns
from statebook.lifecycle.codec import new_id
from statebook.lifecycle.head import filled
from statebook.lifecycle.queries import ids_in

from ..core import lease as core
from ..core.claims import read_rows
from ..core.due import DueScan

from .errors import DispatchInvalid
from .policy import DUE_STATUSES
from .schema import dispatch_outbox
from .transport import NOTIFY_TIMEOUT_SECONDS, TransportResult, cap_error

LEASE_MARGIN_SECONDS = 5.0
"""What a lease grants beyond the transport timeout: time to start the send and record its outcome."""


def lease_seconds(timeout: float) -> float:
    """How long a claim leases its row for sends bounded by ``timeout`` seconds (O21).

    >>> lease_seconds(10.0), lease_seconds(40.0)
    (15.0, 45.0)
    """
    return timeout + LEASE_MARGIN_SECONDS


CLAIM_LEASE_SECONDS = lease_seconds(NOTIFY_TIMEOUT_SECONDS)
"""The lease for the default transport timeout (10 s): 15 s."""


def claimable(free: int, slowest: float | None) -> int:
    """How many leases a pass may claim with ``free`` idle send slots (O21).

    No more than the free slots until a send of this pass was timed; beyond them, as many waves as
    the slowest send seen lets start within half the lease margin (sends seen to take no time: all).

    >>> claimable(8, None), claimable(8, 4.0), claimable(8, 0.5)
    (8, 8, 48)
    """
    if slowest is None:
        return free
    if slowest <= 0:
        return sys.maxsize
    return free * (1 + int(LEASE_MARGIN_SECONDS / (2 * slowest)))


BASE_BACKOFF_SECONDS = 30
MAX_BACKOFF_SECONDS = 1800
DELIVERY_ACTOR = Actor("system", "delivery")

Finalized = Literal["delivered", "awaiting_ack", "retried", "dead_letter", "conflict"]
Released = Literal["released", "conflict"]
Settled = Literal["expired", "dead_letter"]


def backoff_seconds(attempt: int) -> float:
    """Delay before the next try after ``attempt`` sends: ``min(30 * 2**attempt, 1800)``.

    >>> [backoff_seconds(a) for a in (1, 2, 5, 6, 40)]
    [60.0, 120.0, 960.0, 1800.0, 1800.0]
    """
    if attempt >= 6:  # 30 * 2**6 > 1800; avoids huge integers for absurd attempts
        return float(MAX_BACKOFF_SECONDS)
    return float(min(BASE_BACKOFF_SECONDS * 2 ** max(attempt, 0), MAX_BACKOFF_SECONDS))


@dataclass(frozen=True)
class Candidate(core.Candidate):
    """A due row as a scan read it. Claim and settle compare-and-set against these values (and ``head``)."""

    dispatch_id: str
    status: str
    attempt: int
    next_attempt_at: float
    expires_at: float | None
    max_attempts: int
    ack_required: bool
    kind: str
    deliver_to: str
    payload: str

    @property
    def id(self) -> str:
        """The dispatch's id."""
        return self.dispatch_id

    def expired(self, now: float) -> bool:
        """True when the dispatch has an expiry at or before ``now``: it is expired instead of sent."""
        return self.expires_at is not None and self.expires_at <= now

    @property
    def exhausted(self) -> bool:
        """A lapsed lease on the last allowed attempt: another send would exceed the bound."""
        return self.status == "delivering" and self.attempt >= self.max_attempts


@dataclass(frozen=True)
class Lease(core.Lease):
    """One won claim: the right to run attempt ``attempt`` until ``lease_until``.

    ``claim_id`` fences the finalization: only the claim that wrote it can settle the attempt.
    ``timeout`` is the transport timeout the lease was sized for (``lease_until = claimed at +
    lease_seconds(timeout)``); a send may start only while that much of the lease is left (O21).
    """

    dispatch_id: str
    attempt: int
    kind: str
    deliver_to: str
    payload: str
    ack_required: bool
    max_attempts: int
    timeout: float = NOTIFY_TIMEOUT_SECONDS

    FENCE: ClassVar[tuple[str, ...]] = ("attempt", "claim_id")

    @property
    def id(self) -> str:
        """The dispatch's id."""
        return self.dispatch_id

    def may_start(self, now: float) -> bool:
        """True while a send bounded by the timeout still ends inside the lease (O21).

        A lease that waited too long is not sent; the pass gives its attempt back
        (:func:`release_command`), fenced like a finalization, so no second claimant can send beside it.
        """
        return self.lease_until - now >= self.timeout


# -- reading ------------------------------------------------------------------------------------
def _columns() -> list[Any]:
    t = dispatch_outbox
    return [
        t.c.id, t.c.status, t.c.attempt, t.c.next_attempt_at, t.c.expires_at, t.c.max_attempts, t.c.ack_required,
        t.c.kind, t.c.deliver_to, sa.cast(t.c.payload, sa.Text).label("payload"), t.c.claim_id,
    ]


GUARDED = ("attempt", "next_attempt_at", "claim_id")
"""The columns a claim or settle compares beside the head (``apply_many(seen=)``)."""

DUE = DueScan(dispatch_outbox, DUE_STATUSES, _columns(),
              (dispatch_outbox.c.next_attempt_at, dispatch_outbox.c.created_at, dispatch_outbox.c.id))
"""The due rows: pending or lease-lapsed delivering (:data:`.policy.DUE_STATUSES`); served by
``idx_dispatch_outbox_due`` in (next_attempt_at, created_at, id) order: due time, then the event's time
(a retry due with a fresh row goes first when its event is older), then id (O11)."""
ACTIVE = DUE.active
SCAN = DUE.query


async def scan_heads(
    book: Book, *, now: float, limit: int, skip_locked: bool = False
) -> list[tuple[Candidate, Head]]:
    """Like :func:`scan`, with each row's head as ``apply_many(seen=...)`` takes it.

    With ``skip_locked`` the rows are locked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) until the
    bound transaction ends, so concurrent workers pick disjoint rows.
    """
    if limit < 1:
        raise DispatchInvalid(f"limit must be >= 1, got {limit}", argument="limit", rule="range")
    rows = await read_rows(book, SCAN, DUE.params(now, limit), lock=skip_locked)
    return [with_head(r) for r in rows]


_by_ids: dict[str, Any] = {}


async def read_candidates(book: Book, ids: list[str]) -> list[tuple[Candidate, Head]]:
    """The pending or delivering rows among ``ids``, read by key, as :func:`scan_heads` returns them."""
    store = book.store
    query = _by_ids.get(book.dialect)
    if query is None:
        t = dispatch_outbox
        query = _by_ids[book.dialect] = sa.select(
            *_columns(), *(c for c in head_columns(t) if c.name != "status")).where(ACTIVE, ids_in(t.c.id, "b_ids"))
    async with store.reader(book.conn) as unit:
        rows = await store.select(unit, query, {"b_ids": ids})
    return [with_head(r) for r in rows]


def with_head(row: Mapping[str, Any]) -> tuple[Candidate, Head]:
    """A row read by a scan (payload as text) as its Candidate, and its head for ``apply_many(seen=)``."""
    candidate = filled(
        Candidate, dispatch_id=row["id"], status=row["status"], attempt=row["attempt"],
        next_attempt_at=row["next_attempt_at"], expires_at=row["expires_at"], max_attempts=row["max_attempts"],
        ack_required=bool(row["ack_required"]), kind=row["kind"], deliver_to=row["deliver_to"],
        payload=row["payload"], head=Head.of(row, *GUARDED),
    )
    return candidate, candidate.head


async def scan(book: Book, *, now: float, limit: int = 100, skip_locked: bool = False) -> list[Candidate]:
    """Due rows: pending or lease-lapsed delivering with ``next_attempt_at <= now``.

    Ordered by (next_attempt_at, created_at, id), at most ``limit``; ``skip_locked`` as in :func:`scan_heads`
    (see :func:`statebook.outbox.dispatch.delivery.claim_due`).
    """
    return [candidate for candidate, _ in await scan_heads(book, now=now, limit=limit, skip_locked=skip_locked)]


async def next_due(book: Book) -> float | None:
    """The earliest ``next_attempt_at`` of any pending or delivering row (None when idle)."""
    return await DUE.next_due(book)


# -- commands (shared by the single steps and the batched passes) ---------------------------------
def _command(dispatch_id: str, target: str, reason: Reason, actor: Actor, expected: str, guards: dict[str, Any],
             patch: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> Command:
    return Command("dispatch", dispatch_id, target, reason, actor, (expected,), guards, patch or {}, None, metadata or {})


def _as_scanned(candidate: Candidate) -> dict[str, Any]:
    return {"attempt": candidate.attempt, "next_attempt_at": candidate.next_attempt_at}


def settle_command(candidate: Candidate, now: float, actor: Actor) -> tuple[Command, Settled] | None:
    """The transition finishing a candidate that must not be sent again, or None."""
    c = candidate
    if c.expired(now):
        reason = Reason("dispatch.expired.deadline", f"expired at {c.expires_at} (attempt {c.attempt})")
        return _command(c.dispatch_id, "expired", reason, actor, c.status, _as_scanned(c)), "expired"
    if c.exhausted:
        reason = Reason("dispatch.dead_letter.max_attempts", f"lease lapsed on attempt {c.attempt}")
        error = f"the lease of attempt {c.attempt} (the last allowed) lapsed without an outcome"
        return _command(c.dispatch_id, "dead_letter", reason, actor, "delivering", _as_scanned(c),
                        {"last_error": error}), "dead_letter"
    return None


def claim_command(
    candidate: Candidate, now: float, actor: Actor, timeout: float = NOTIFY_TIMEOUT_SECONDS
) -> tuple[Command, Lease] | None:
    """The claim of the candidate's next attempt and the lease it grants, or None if not claimable.

    The lease is derived from ``timeout``, the longest one send may take (O21).
    """
    c = candidate
    if c.status not in ("pending", "delivering") or c.next_attempt_at > now or settle_command(c, now, actor):
        return None
    attempt = c.attempt + 1
    lease = filled(
        Lease, dispatch_id=c.dispatch_id, attempt=attempt, lease_until=now + lease_seconds(timeout), kind=c.kind,
        deliver_to=c.deliver_to, payload=c.payload, ack_required=c.ack_required, max_attempts=c.max_attempts,
        claim_id=new_id(), timeout=timeout, head=None,
    )
    if c.status == "delivering":
        reason = Reason("dispatch.delivering.reclaimed", f"lease of attempt {c.attempt} lapsed; attempt {attempt}")
    else:
        reason = Reason("dispatch.delivering.attempt", f"attempt {attempt} of {c.max_attempts}")
    patch = {"attempt": attempt, "next_attempt_at": lease.lease_until, "claim_id": lease.claim_id}
    return _command(c.dispatch_id, "delivering", reason, actor, c.status, _as_scanned(c), patch), lease


def finalize_command(lease: Lease, result: TransportResult, now: float, actor: Actor) -> tuple[Command, Finalized]:
    """The ONE transition recording an attempt's outcome, guarded on the lease's attempt and claim id."""
    a = lease.attempt
    at_bound = a >= lease.max_attempts
    patch: dict[str, Any]
    ret: Finalized
    if result.ok and not lease.ack_required:
        target, ret, patch = "delivered", "delivered", {}
        reason = Reason("dispatch.delivered.transport_ok", f"attempt {a} succeeded")
    elif result.ok and at_bound:
        target, ret = "dead_letter", "dead_letter"
        patch = {"last_error": f"no acknowledgement after {a} successful send(s) (max_attempts={lease.max_attempts})"}
        reason = Reason("dispatch.dead_letter.ack_timeout", f"attempt {a} sent; no acknowledgement within the bound")
    elif result.ok:
        target, ret = "pending", "awaiting_ack"
        patch = {"next_attempt_at": now + backoff_seconds(a)}
        reason = Reason("dispatch.pending.awaiting_ack", f"attempt {a} sent; resend unless acknowledged")
    else:
        error = cap_error(result.error or "the transport reported failure")
        if at_bound:
            target, ret, patch = "dead_letter", "dead_letter", {"last_error": error}
            reason = Reason("dispatch.dead_letter.max_attempts", f"attempt {a} of {lease.max_attempts} failed")
        else:
            target, ret = "pending", "retried"
            patch = {"last_error": error, "next_attempt_at": now + backoff_seconds(a)}
            reason = Reason("dispatch.pending.transport_failed", f"attempt {a} failed; retry after backoff")
    # The attempt is unchanged, but recording it makes each outcome fact name the attempt it settles.
    patch = {"attempt": a, **patch}
    metadata = {"transport": dict(result.evidence)} if result.evidence else None
    guards = {"attempt": a, "claim_id": lease.claim_id}
    return _command(lease.dispatch_id, target, reason, actor, "delivering", guards, patch, metadata), ret


def release_command(lease: Lease, now: float, actor: Actor) -> Command:
    """The transition giving back a lease skipped before its send (O21): ``delivering -> pending``.

    Nothing was sent, so the attempt is not used up: ``attempt`` goes back to ``lease.attempt - 1``
    and the row is due ``now``, for the next claim to take as the same attempt number. Guarded, like
    a finalization (O8), on the lease's attempt and claim id: a lease whose row was reclaimed since
    gets ``conflict`` and writes nothing. The claim id stays, as every finalization leaves it; the
    next claim writes a new one.
    """
    a = lease.attempt
    left = max(lease.lease_until - now, 0.0)
    reason = Reason("dispatch.pending.released", f"lease of attempt {a} had {left:.1f} s left, less than the "
                    f"{lease.timeout:g} s transport timeout; not sent")
    guards = {"attempt": a, "claim_id": lease.claim_id}
    patch = {"attempt": a - 1, "next_attempt_at": now}
    return _command(lease.dispatch_id, "pending", reason, actor, "delivering", guards, patch)
