"""Delivering notifications: scan, claim, attempt channel by channel, record evidence, finalize (N1-N9).

Each step is its own function, so tests can interleave claimants and crash between any two:

- :func:`scan_due` — due notifications in (due time, id) order, read without locks;
- :func:`claim` — ONE fenced transition writing a fresh ``claim_id`` and the lease's end, after
  reading what the cycle holds on record (:mod:`.evidence`) — or the settlement the record calls for
  instead: delivered from a success the lapsed claim recorded, or the dead letter of a lapsed last
  attempt;
- :func:`run_attempt` — the channels of one attempt, outside any transaction: GUARANTEED runs the
  selected persistent channels in order until one succeeds (WebSocket runs after them, for what it
  is worth: it never satisfies the obligation); BEST_EFFORT runs them all at once. Every channel
  call is guarded (:class:`LeaseGuard`) and leaves one ``channel_attempt`` observation;
- :func:`finalize` — ONE transition fenced by the claim token: delivered, retried with backoff,
  failed (dead-lettered when a GUARANTEED cycle is exhausted) or rate-limited.

:func:`deliver_due_notifications` runs a pass of them with bounded concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, Reason, apply_many, create
from statebook.lifecycle.inputs import shown
from statebook.lifecycle.codec import loads, new_id
from statebook.lifecycle.errors import StatebookError
from statebook.lifecycle.schema import status_in

from statebook.outbox.core.claims import Planned, claim_set, read_rows, record_set
from statebook.outbox.core.slots import Claimed, run_in_slots

from .buckets import MAX_HOLD_SECONDS, draw, hold
from .channels import (
    EPHEMERAL, PERSISTENT_ORDER, Channel, check_order, Delivery, LeaseLost, Mode, NoToken, Observation, ProviderOutcome,
)
from . import evidence, ownership, responses
from .errors import NotificationInvalid
from .policy import RESULT_REASONS, RETRIED_REASON, STARTED_REASON
from .schema import notifications

log = logging.getLogger("statebook.outbox.notifications")

DELIVERY_ACTOR = Actor("system", "notification_delivery")
LEASE_SECONDS = 60.0
"""How long a claim owns its notification (the seed's default lease)."""
DEADLINE_SECONDS = 10.0
"""How long one channel call may take, provider-local retries included (the seed's adapter deadline)."""
BACKOFF_BASE_SECONDS = 1.0
"""The wait after a cycle's first failed attempt; it doubles after each further one (1 s, 2 s, ...)."""
DETAIL_CHARS = 2_000
DEFAULT_SCOPE = "all"
"""The rate-limit scope of a channel's attempts: one bucket per channel (``<channel>:all``) until
settings name finer scopes."""

ACTIVE = sa.text(status_in("notifications.status", ("pending", "rate_limited")))


class EvidenceLost(StatebookError):
    """Recording a channel observation failed: the attempt stops and leaves its claim to lapse (N7)."""


@dataclass(frozen=True)
class Candidate:
    """A due notification as the scan read it (the claim compares against these values)."""

    id: str
    status: str
    claim_id: str | None
    lease_until: float | None
    cycle: int
    attempts: int
    cycle_attempts: int
    max_cycle_attempts: int
    mode: str
    channels: tuple[str, ...]
    recipient: str
    content: Mapping[str, Any]
    next_attempt_at: float
    version: int
    last_fact_id: str
    chain_hash: str
    dedup_claim_id: str | None = None
    response_timeout: float | None = None
    timeout_callback: str | None = None

    @property
    def head(self) -> dict[str, Any]:
        """The row as scanned, for the claim's compare-and-set (``apply_many(seen=)``): the version
        makes a candidate stale as soon as anything moved the row, even back to equal values."""
        return {"status": self.status, "version": self.version, "last_fact_id": self.last_fact_id,
                "chain_hash": self.chain_hash, "claim_id": self.claim_id, "cycle_attempts": self.cycle_attempts}

    @property
    def attempt_limit(self) -> int:
        """Attempts this cycle may take: the configured bound (GUARANTEED) or one (BEST_EFFORT)."""
        return self.max_cycle_attempts if self.mode == Mode.GUARANTEED.value else 1


@dataclass(frozen=True)
class Lease:
    """A won claim: the fencing token, the lease's end, and what the attempt delivers."""

    notification_id: str
    claim_id: str
    lease_until: float
    cycle: int
    attempt: int  # cumulative, the number channel observations carry
    cycle_attempt: int
    attempt_limit: int
    mode: str
    channels: tuple[str, ...]
    recipient: str
    content: Mapping[str, Any]
    duplicate_risk: bool = False
    """The claim before this one stopped after a send was admitted: this attempt may repeat an effect."""
    head: Mapping[str, Any] | None = None
    """The row as the claim left it (status, version, chain head, guarded columns): finalize compares
    against it instead of reading the row again (``apply_many(seen=)``; the compare-and-set decides)."""
    dedup_claim_id: str | None = None
    """The semantic obligation this notification owns (:mod:`.ownership`), or None."""
    response_timeout: float | None = None
    """Seconds a human has to answer once it is delivered (:mod:`.responses`), or None."""
    timeout_callback: str | None = None


Outcome = Literal["delivered", "retry", "dead_letter", "failed", "rate_limited"]
"""What an attempt (or the settlement of a lapsed last attempt) comes to."""


@dataclass(frozen=True)
class Recorded:
    """One recorded channel observation: what was observed, and whether it found no rate-limit token."""

    channel: str
    observation: Observation
    no_token: bool


@dataclass
class AttemptResult:
    """What one attempt came to: the notification's next outcome (None: stop without finalizing — the
    lease was lost or evidence could not be stored) and the observations made."""

    outcome: Outcome | None
    observations: list[Recorded] = field(default_factory=list)
    delivered_channel: str | None = None
    wait: float | None = None  # rate_limited: until the first bucket refills; retry: the provider's longest Retry-After
    error: str | None = None


# -- scan and claim -------------------------------------------------------------------------------
_COLUMNS = ("id", "status", "claim_id", "lease_until", "cycle", "attempts", "cycle_attempts", "max_cycle_attempts",
            "mode", "channels", "recipient", "content", "next_attempt_at", "version", "last_fact_id", "chain_hash",
            "dedup_claim_id", "response_timeout", "timeout_callback")
SCAN = (
    sa.select(*(notifications.c[c] for c in _COLUMNS))
    .where(ACTIVE, notifications.c.next_attempt_at <= sa.bindparam("b_now", type_=sa.Float))
    .order_by(notifications.c.next_attempt_at, notifications.c.id)
    .limit(sa.bindparam("b_limit", type_=sa.Integer))
)
"""The due scan with bound ``b_now``/``b_limit`` (one compiled shape), served by the partial due index
in (next_attempt_at, id) order (N9)."""


def _candidate(row: Mapping[str, Any]) -> Candidate:
    """A scanned row (the driver's values: JSON columns as text) as its Candidate."""
    channels, content = row["channels"], row["content"]
    return Candidate(**{**row, "channels": tuple(loads(channels) if isinstance(channels, str) else channels),
                        "content": loads(content) if isinstance(content, str) else content})


async def scan_due(book: Book, *, now: float, limit: int = 100) -> list[Candidate]:
    """Due notifications (pending or rate-limited, ``next_attempt_at <= now``), by due time then id (N9);
    read without locks (:func:`claim_due` scans, locks and claims in one transaction)."""
    return [_candidate(r) for r in await read_rows(book, SCAN, {"b_now": now, "b_limit": limit}, lock=False)]


def _command(c: Candidate, target: str, code: str, summary: str, patch: dict[str, Any]) -> Command:
    return Command("notification", c.id, target, Reason(code, summary), DELIVERY_ACTOR, (c.status,),
                   {"claim_id": c.claim_id, "cycle_attempts": c.cycle_attempts}, patch)


def claim_command(c: Candidate, *, now: float, lease_seconds: float, record: evidence.Record = evidence.NOTHING
                  ) -> tuple[Command, Lease | Outcome]:
    """The candidate's claim and the lease it grants — or the settlement it gets instead, and its name:
    ``delivered`` from a qualifying success its lapsed claim recorded (N10a), or, for a lapsed lease on the
    cycle's last attempt, ``failed`` (dead-lettered when GUARANTEED). ``record``: what the cycle holds
    (:func:`.evidence.read_records`)."""
    if record.success is not None and c.claim_id is not None:
        # Fenced by the lapsed claim's token, as that worker's own finalization would have been.
        command = _command(c, "delivered", evidence.SETTLED_REASON,
                           f"{record.success} accepted attempt {c.cycle_attempts} of cycle {c.cycle}; its worker "
                           "stopped before recording the outcome",
                           {"claim_id": None, "lease_until": None, "delivered_channel": record.success,
                            "last_error": None})
        return command, "delivered"
    if c.cycle_attempts >= c.attempt_limit and c.claim_id is not None:
        dead = c.mode == Mode.GUARANTEED.value
        command = _command(c, "failed", "notification.failed.cycle_exhausted" if dead else "notification.failed.best_effort",
                           f"the lease of attempt {c.cycle_attempts} (the cycle's last) lapsed without an outcome",
                           {"dead_letter": 1 if dead else 0, "claim_id": None, "lease_until": None,
                            "last_error": "the lease lapsed without an outcome"})
        return command, "dead_letter" if dead else "failed"
    token, until = new_id(), now + lease_seconds
    if c.status == "rate_limited":
        code, summary = "notification.pending.rate_limit_cleared", f"attempt {c.cycle_attempts + 1} after the rate limit"
    elif c.claim_id is not None:
        code, summary = "notification.pending.reclaimed", f"lease lapsed; attempt {c.cycle_attempts + 1} of cycle {c.cycle}"
    else:
        code, summary = "notification.pending.claimed", f"attempt {c.cycle_attempts + 1} of cycle {c.cycle}"
    patch = {"claim_id": token, "lease_until": until, "next_attempt_at": until, "attempts": c.attempts + 1,
             "cycle_attempts": c.cycle_attempts + 1}
    lease = Lease(c.id, token, until, c.cycle, c.attempts + 1, c.cycle_attempts + 1, c.attempt_limit, c.mode,
                  c.channels, c.recipient, c.content, duplicate_risk=record.duplicate_risk, dedup_claim_id=c.dedup_claim_id,
                  response_timeout=c.response_timeout, timeout_callback=c.timeout_callback)
    return _command(c, "pending", code, summary, patch), lease


def _won(lease: Lease, outcome: Any) -> Lease:
    """The lease with the row its claim wrote, which finalize compares against."""
    head = {"status": "pending", "version": outcome.version, "last_fact_id": outcome.fact_id,
            "chain_hash": outcome.chain_hash, "claim_id": lease.claim_id, "cycle_attempts": lease.cycle_attempt}
    return dataclasses.replace(lease, head=head)


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
    return _won(what, outcome)


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


async def _fail_owner(tx: Book, command: Command, head: Mapping[str, Any] | None, cid: str, *, now: float) -> bool:
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
        found = [_candidate(r) for r in rows]
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
    leases: list[Lease] = []
    done = await claim_set(book, SCAN, {"b_now": now, "b_limit": limit}, plan)
    for c in owners:
        if await claim(book, c, now=now, lease_seconds=lease_seconds) is None:
            status = await _status(book, c.id)
            if status == "delivered":
                counts["delivered"] += 1
            elif status == "failed":
                counts["dead_letter" if c.mode == Mode.GUARANTEED.value else "failed"] += 1
    for what, outcome in done:
        if not outcome.applied:
            continue
        if isinstance(what, Lease):
            leases.append(_won(what, outcome))
            counts["claimed"] += 1
        else:
            counts[what] += 1
    return leases, counts


# -- one channel call -------------------------------------------------------------------------------
class LeaseGuard:
    """The runtime's side of one channel call (:class:`~.channels.Guard`): checks the claim and the
    lease, admits the send (token and ``started`` fact in one transaction), remembers what happened."""

    def __init__(self, book: Book, lease: Lease, channel: str, *, deadline_end: float, duplicate_risk: bool) -> None:
        self.book = book
        self.lease = lease
        self.channel = channel
        self.deadline_end = deadline_end
        self.duplicate_risk = duplicate_risk
        self.attempt_id: str | None = None
        self.started: Mapping[str, Any] | None = None  # the started row's head, for the result's compare-and-set
        self.no_token: float | None = None
        self.storage_error: BaseException | None = None
        self.lease_lost: str | None = None
        self.retries = 0  # provider retries recorded on the started observation

    def remaining(self) -> float:
        """Seconds left before the adapter deadline or the lease's end, whichever comes first."""
        return max(0.0, min(self.deadline_end, self.lease.lease_until) - self.book.clock.now())

    async def _owned(self) -> None:
        """The claim is still ours and the lease has not lapsed (a read; writes nothing)."""
        now = self.book.clock.now()
        if now >= self.lease.lease_until:
            self.lease_lost = "the lease lapsed"
            raise LeaseLost(self.lease_lost)
        t = notifications
        try:
            async with self.book.read() as conn:
                row = (await conn.execute(sa.select(t.c.claim_id, t.c.status).where(t.c.id == self.lease.notification_id))).first()
        except Exception as exc:
            self.storage_error = exc
            raise
        if row is None or row.claim_id != self.lease.claim_id or row.status != "pending":
            self.lease_lost = "the claim is no longer this worker's"
            raise LeaseLost(self.lease_lost)

    async def guard_provider_attempt(self) -> None:
        """Before a provider effect after the first (a provider-local retry): the claim and the lease
        checked. Before the admission that is all (nothing is written); after it, the retry is recorded
        on the started observation (``channel_attempt.started.retried``, ``provider_retries`` + 1)
        before the effect, so whoever closes the observation later knows how many effects it may stand
        for (N10b)."""
        await self._owned()
        if self.attempt_id is not None:
            await self._to_the_end(self._retry(self.retries + 1, self.book.clock.now()))

    async def admit(self) -> None:
        """Right before the first provider effect: the claim and lease checked, the channel's token
        drawn and ``channel_attempt.started.admitted`` written, in ONE transaction (N4, N5, N8)."""
        if self.attempt_id is not None:
            return
        await self._owned()
        await self._to_the_end(self._admission(new_id(), self.book.clock.now()))
        if self.no_token is not None:
            raise NoToken(self.no_token)

    async def _to_the_end(self, write: Any) -> None:
        """Run an evidence write to its end even when the call's deadline (or a stop) cuts the call
        meanwhile: a transaction is never cancelled mid-statement, and afterwards it is known whether
        the fact committed. The call is then cut as soon as the transaction ended."""
        writing = asyncio.ensure_future(write)
        try:
            await asyncio.shield(writing)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await writing
            raise
        except Exception as exc:
            self.storage_error = exc
            raise

    async def _retry(self, n: int, now: float) -> None:
        """Record provider retry ``n`` on the started observation, compared against the row as the last
        write left it: a reclaim that closed the observation meanwhile means the claim is another's."""
        assert self.attempt_id is not None
        command = Command("channel_attempt", self.attempt_id, "started",
                          Reason(RETRIED_REASON, f"{self.channel}: provider retry {n}"), DELIVERY_ACTOR, ("started",),
                          {}, {"provider_retries": n})
        seen = {self.attempt_id: self.started} if self.started is not None else None
        try:
            async with self.book.begin() as tx:
                [outcome] = await apply_many(tx, [command], seen=seen)
        except Exception as exc:
            self.storage_error = exc
            raise
        if not outcome.applied:
            self.lease_lost = "another claim closed the observation"
            raise LeaseLost(self.lease_lost)
        self.retries = n
        self.started = {"status": "started", "version": outcome.version, "last_fact_id": outcome.fact_id,
                        "chain_hash": outcome.chain_hash}

    async def _admission(self, attempt_id: str, now: float) -> None:
        """Draw the token and write the started fact in ONE transaction (or find no token: nothing written)."""
        try:
            async with self.book.begin() as tx:
                wait = await draw(tx, self.channel, DEFAULT_SCOPE, now=now)
                if wait > 0:
                    self.no_token = wait
                    return
                made = await create(tx, "channel_attempt", values=self._values(attempt_id, now, started=True),
                                    status="started", reason=Reason(STARTED_REASON, f"{self.channel} admitted the send"),
                                    actor=DELIVERY_ACTOR, fresh_id=True)
                self.started = {"status": "started", "version": made.version, "last_fact_id": made.fact_id,
                                "chain_hash": made.chain_hash}
        except Exception as exc:
            self.storage_error = exc
            raise
        self.attempt_id = attempt_id  # committed: also known when the call was cut meanwhile (admit)

    def _values(self, attempt_id: str, now: float, *, started: bool) -> dict[str, Any]:
        lease = self.lease
        return {
            "id": attempt_id, "notification_id": lease.notification_id, "cycle": lease.cycle, "attempt": lease.attempt,
            "channel": self.channel, "position": lease.channels.index(self.channel) + 1, "claim_id": lease.claim_id, "lease_until": lease.lease_until,
            "provider_retries": 0, "duplicate_risk": 1 if self.duplicate_risk else 0, "detail": None,
            "made_at": now, "started_at": now if started else None, "ended_at": None,
        }


async def attempt_channel(book: Book, lease: Lease, channel: Channel, *, deadline: float = DEADLINE_SECONDS,
                          duplicate_risk: bool = False) -> Recorded:
    """One guarded channel call and its recorded observation (N4-N7). Raises :class:`LeaseLost` when
    the lease was lost before or during the call (the observation, if any, is recorded first) and
    :class:`EvidenceLost` when the observation could not be stored."""
    clock = book.clock
    start = clock.now()
    if lease.lease_until - start < deadline:
        raise LeaseLost(f"less than the {deadline:g}s adapter deadline is left of the lease")
    guard = LeaseGuard(book, lease, channel.name, deadline_end=start + deadline, duplicate_risk=duplicate_risk)
    delivery = Delivery(lease.notification_id, lease.recipient, lease.content, lease.cycle, lease.attempt, channel.name)
    observed: Observation | None = None
    failure: str | None = None
    try:
        async with asyncio.timeout(deadline):
            if not channel.reports_admission:
                await guard.admit()  # admitted at its entry: everything after may be an effect
            observed = await channel.send(delivery, guard)
    except TimeoutError:
        failure = f"no answer within the {deadline:g}s adapter deadline"
    except NoToken:
        pass
    except LeaseLost as exc:
        failure = f"stopped: {exc}"
    except Exception as exc:
        # Recorded by its type only: an adapter's exception text may carry a URL or a token (N43).
        failure = f"the adapter raised {type(exc).__name__}"
    if guard.storage_error is not None:
        raise EvidenceLost(f"could not record the {channel.name} observation: {guard.storage_error}") from guard.storage_error
    observation = _judged(guard, observed, failure)
    await _record(book, guard, observation)
    if guard.lease_lost is not None:
        raise LeaseLost(guard.lease_lost)
    return Recorded(channel.name, observation, guard.no_token is not None)


def _judged(guard: LeaseGuard, observed: Observation | None, failure: str | None) -> Observation:
    """The observation to record: what the channel said, or what its failure means (N6)."""
    if guard.no_token is not None:
        return Observation(ProviderOutcome.RATE_LIMITED, "no rate-limit token", retry_after=guard.no_token)
    admitted = guard.attempt_id is not None
    # Where the channel reports nothing, the retries its guards recorded are what is known (N10b).
    if observed is None:
        return Observation(ProviderOutcome.UNKNOWN if admitted else ProviderOutcome.NOT_STARTED, failure,
                           guard.retries)
    if not isinstance(observed, Observation):
        return Observation(ProviderOutcome.UNKNOWN if admitted else ProviderOutcome.NOT_STARTED,
                           f"the channel returned {shown(observed)}, not an Observation", guard.retries)
    if not admitted and observed.outcome not in (ProviderOutcome.NOT_STARTED, ProviderOutcome.RATE_LIMITED):
        # A channel that reports its admission returned a result without admitting: an adapter bug.
        # Its effect had no STARTED before it; record it as UNKNOWN, never as a success.
        return Observation(ProviderOutcome.UNKNOWN, f"the channel reported {observed.outcome.value} without admitting its send")
    return observed


async def _record(book: Book, guard: LeaseGuard, observation: Observation) -> None:
    """The observation's fact: the result of the admitted attempt, or an observation without admission."""
    now = book.clock.now()
    detail = None if observation.detail is None else str(observation.detail)[:DETAIL_CHARS]
    status = observation.outcome.value
    reason = Reason(RESULT_REASONS[status], f"{guard.channel}: {status}")
    try:
        if guard.attempt_id is not None:
            command = Command("channel_attempt", guard.attempt_id, status, reason, DELIVERY_ACTOR, ("started",), {},
                              {"provider_retries": observation.retries, "detail": detail, "ended_at": now})
            seen = {guard.attempt_id: guard.started} if guard.started is not None else None
            async with book.begin() as tx:
                [outcome] = await apply_many(tx, [command], seen=seen)  # closed by another claim meanwhile: a conflict
                if outcome.applied and provider_wait(observation) is not None:
                    # The provider's Retry-After holds the channel's bucket for the whole fleet (N8, N42).
                    await hold(tx, guard.channel, DEFAULT_SCOPE, seconds=provider_wait(observation), now=now)
        else:
            values = guard._values(new_id(), now, started=False) | {"detail": detail, "ended_at": now}
            await create(book, "channel_attempt", values=values, status=status, reason=reason, actor=DELIVERY_ACTOR,
                         fresh_id=True)
    except Exception as exc:
        raise EvidenceLost(f"could not record the {guard.channel} observation: {exc}") from exc


def provider_wait(observation: Observation) -> float | None:
    """The seconds a provider's 429 asked to wait (``Retry-After``), within the hold's bound; None when
    the observation is not the provider's own rate limit."""
    if observation.outcome is not ProviderOutcome.RATE_LIMITED or observation.retry_after is None:
        return None
    wait = observation.retry_after
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait == wait or wait <= 0:
        return None
    return float(min(wait, MAX_HOLD_SECONDS))


# -- one attempt ------------------------------------------------------------------------------------
async def run_attempt(book: Book, lease: Lease, channels: Mapping[str, Channel], *,
                      deadline: float = DEADLINE_SECONDS, order: Sequence[str] = PERSISTENT_ORDER) -> AttemptResult:
    """The channels of one attempt, outside any transaction; what the notification comes to (N1, N6-N8).
    ``order``: the fallback order of the persistent channels (:func:`~.channels.check_order`)."""
    selected = [n for n in lease.channels if n in channels]
    missing = [n for n in lease.channels if n not in channels]
    result = AttemptResult(None)
    if missing:
        result.error = f"no adapter configured for {', '.join(missing)}"
    try:
        if lease.mode == Mode.GUARANTEED.value:
            ordered = [*(n for n in order if n in selected), *(n for n in selected if n in EPHEMERAL)]
            # Positions follow this attempt's run order, so its history reads in fallback order.
            run_lease = dataclasses.replace(lease, channels=(*ordered, *(n for n in lease.channels if n not in ordered)))
            await _guaranteed(book, run_lease, channels, ordered, deadline, result)
        else:
            await _best_effort(book, lease, channels, selected, deadline, result)
    except (LeaseLost, EvidenceLost) as exc:
        result.outcome, result.error = None, str(exc)
        return result
    seen = result.observations
    if result.delivered_channel is not None:
        result.outcome = "delivered"
    elif seen and all(r.no_token for r in seen):  # no selected channel had a token: the budget is not used (N8)
        result.outcome = "rate_limited"
        result.wait = min(r.observation.retry_after or 0.0 for r in seen)
    elif lease.mode == Mode.BEST_EFFORT.value:
        result.outcome = "failed"
    else:
        result.outcome = "retry" if lease.cycle_attempt < lease.attempt_limit else "dead_letter"
        asked = [w for r in seen if not r.no_token and (w := provider_wait(r.observation)) is not None]
        result.wait = max(asked) if asked else None  # a retry waits at least what the provider asked
    if result.error is None and seen:
        last = seen[-1]
        detail = last.observation.detail
        result.error = f"{last.channel}: {last.observation.outcome.value}" + (f" ({detail})" if detail else "")
    return result


async def _guaranteed(book: Book, lease: Lease, channels: Mapping[str, Channel], selected: list[str],
                      deadline: float, result: AttemptResult) -> None:
    """Persistent channels in fallback order (``selected`` is in it) until the first SUCCESS; WebSocket after."""
    risk = lease.duplicate_risk
    for name in (n for n in selected if n in PERSISTENT_ORDER):
        recorded = await attempt_channel(book, lease, channels[name], deadline=deadline, duplicate_risk=risk)
        result.observations.append(recorded)
        if recorded.observation.outcome is ProviderOutcome.SUCCESS:
            result.delivered_channel = name
            break
        risk = risk or recorded.observation.outcome is ProviderOutcome.UNKNOWN
    for name in (n for n in EPHEMERAL if n in selected):
        with contextlib.suppress(LeaseLost):  # never satisfies a GUARANTEED obligation, so never decides it
            result.observations.append(await attempt_channel(book, lease, channels[name], deadline=deadline,
                                                             duplicate_risk=risk))


async def _best_effort(book: Book, lease: Lease, channels: Mapping[str, Channel], selected: list[str],
                       deadline: float, result: AttemptResult) -> None:
    """Every selected channel at once (WebSocket in its own task beside the persistent ones)."""
    calls = [attempt_channel(book, lease, channels[n], deadline=deadline, duplicate_risk=lease.duplicate_risk)
             for n in selected]
    found = await asyncio.gather(*calls, return_exceptions=True)
    lost: BaseException | None = None
    for name, item in zip(selected, found, strict=True):
        if isinstance(item, LeaseLost):
            lost = item
            continue
        if isinstance(item, BaseException):
            raise item  # EvidenceLost, or a cancellation
        result.observations.append(item)
        if item.observation.outcome is ProviderOutcome.SUCCESS and result.delivered_channel is None:
            result.delivered_channel = name
    if lost is not None and result.delivered_channel is None:
        raise lost


# -- finalize ---------------------------------------------------------------------------------------
def backoff_seconds(cycle_attempt: int) -> float:
    """1 s after a cycle's first failed attempt, doubling after each further one."""
    return BACKOFF_BASE_SECONDS * 2 ** (max(cycle_attempt, 1) - 1)


def finalize_command(lease: Lease, result: AttemptResult, *, now: float) -> Command:
    """The transition recording what the attempt came to, fenced by the claim token."""
    if result.outcome is None:
        raise ValueError("this attempt has no outcome to finalize (its lease was lost or evidence failed)")
    error = None if result.error is None else result.error[:DETAIL_CHARS]
    cleared = {"claim_id": None, "lease_until": None}
    if result.outcome == "delivered":
        target, code, patch = "delivered", "notification.delivered.channel_success", {
            **cleared, "delivered_channel": result.delivered_channel, "last_error": None}
        summary = f"{result.delivered_channel} accepted attempt {lease.cycle_attempt} of cycle {lease.cycle}"
    elif result.outcome == "retry":
        wait = max(backoff_seconds(lease.cycle_attempt), result.wait or 0.0)
        target, code, patch = "pending", "notification.pending.retry", {
            **cleared, "next_attempt_at": now + wait, "last_error": error}
        summary = f"attempt {lease.cycle_attempt} of cycle {lease.cycle} failed; next in {wait:g}s"
    elif result.outcome == "dead_letter":
        target, code, patch = "failed", "notification.failed.cycle_exhausted", {**cleared, "dead_letter": 1,
                                                                                "last_error": error}
        summary = f"cycle {lease.cycle} exhausted after {lease.cycle_attempt} attempts"
    elif result.outcome == "failed":
        target, code, patch = "failed", "notification.failed.best_effort", {**cleared, "last_error": error}
        summary = "no channel succeeded (best effort)"
    else:
        wait = result.wait or 0.0
        target, code, patch = "rate_limited", "notification.rate_limited.no_token", {
            **cleared, "next_attempt_at": now + wait, "cycle_attempts": lease.cycle_attempt - 1, "last_error": error}
        summary = f"no selected channel had a rate-limit token; due again in {wait:.3f}s"
    return Command("notification", lease.notification_id, target, Reason(code, summary), DELIVERY_ACTOR,
                   ("pending",), {"claim_id": lease.claim_id, "cycle_attempts": lease.cycle_attempt}, patch)


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


async def _deliver(tx: Book, command: Command, head: Mapping[str, Any] | None, *, cid: str | None,
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
) -> dict[str, int]:
    """One pass over at most ``limit`` due notifications, at most ``concurrency`` attempts at once
    (:func:`statebook.outbox.core.slots.run_in_slots`, the dispatch pass's slots): claims in sets as slots
    free (:func:`claim_due`), attempts outside any transaction, finalizations of attempts that end
    together in one transaction. Its counters (``stopped``: attempts that ended without an outcome).
    ``order``: the persistent channels' fallback order, a permutation of :data:`~.channels.PERSISTENT_ORDER`."""
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
            return await run_attempt(book, lease, channels, deadline=deadline, order=order)
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
