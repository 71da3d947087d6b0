"""The channel side of one attempt, outside any transaction: the channels run in their mode's order,
each call guarded by the claim and leaving one ``channel_attempt`` observation (N1, N4-N8).

:func:`run_attempt` — GUARANTEED runs the selected persistent channels in order until one succeeds
(WebSocket runs after them, for what it is worth: it never satisfies the obligation); BEST_EFFORT runs
them all at once. :func:`attempt_channel` is one call: :class:`LeaseGuard` checks the claim and the
lease, admits the send (token and ``started`` fact in one transaction) and the observation is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Command, Head, Reason, apply_many, create, tracing
from statebook.lifecycle.codec import new_id
from statebook.lifecycle.inputs import shown

from .attempts import (
    DEADLINE_SECONDS, DEFAULT_SCOPE, DELIVERY_ACTOR, DETAIL_CHARS, AttemptResult, EvidenceLost, Lease, Recorded,
)
from .buckets import MAX_HOLD_SECONDS, draw, hold
from .channels import (
    EPHEMERAL, PERSISTENT_ORDER, Channel, Delivery, LeaseLost, LinkHook, Mode, NoToken, Observation, ProviderOutcome,
)
from .policy import RESULT_REASONS, RETRIED_REASON, STARTED_REASON
from .schema import notifications


# -- one attempt ------------------------------------------------------------------------------------
async def run_attempt(book: Book, lease: Lease, channels: Mapping[str, Channel], *,
                      deadline: float = DEADLINE_SECONDS, order: Sequence[str] = PERSISTENT_ORDER,
                      links: LinkHook | None = None) -> AttemptResult:
    """The channels of one attempt, outside any transaction; what the notification comes to (N1, N6-N8).
    ``order``: the fallback order of the persistent channels (:func:`~.channels.check_order`); ``links``:
    makes the response links every channel of the attempt carries (:data:`~.channels.LinkHook`)."""
    if links is not None:
        # The deadline as it will be once this attempt delivers (at the earliest): a link never outlives it.
        due_at = None if lease.response_timeout is None else book.clock.now() + lease.response_timeout
        lease = dataclasses.replace(lease, links=dict(links(lease.notification_id, lease.recipient, due_at)))
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
        self.started: Head | None = None  # the started row's head, for the result's compare-and-set
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
        self.started = outcome.head()

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
                self.started = made.head()
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
    tracer = tracing.active()
    if tracer is None:
        return await _attempt_channel(book, lease, channel, deadline, duplicate_risk)
    attributes: dict[str, tracing.Attribute] = {"statebook.channel.name": channel.name, "statebook.notification.id": lease.notification_id,
                  "statebook.notification.attempt": lease.attempt}
    with tracer.span(f"attempt {channel.name}", "client", attributes) as span:
        recorded = await _attempt_channel(book, lease, channel, deadline, duplicate_risk)
        outcome = recorded.observation.outcome.value
        span.set("statebook.channel.outcome", outcome)
        if recorded.observation.outcome is not ProviderOutcome.SUCCESS:
            span.fail(outcome)  # the outcome's name, never its detail (a provider may echo a secret)
        return recorded


async def _attempt_channel(book: Book, lease: Lease, channel: Channel, deadline: float,
                           duplicate_risk: bool) -> Recorded:
    clock = book.clock
    start = clock.now()
    if lease.lease_until - start < deadline:
        raise LeaseLost(f"less than the {deadline:g}s adapter deadline is left of the lease")
    guard = LeaseGuard(book, lease, channel.name, deadline_end=start + deadline, duplicate_risk=duplicate_risk)
    delivery = Delivery(lease.notification_id, lease.recipient, lease.content, lease.cycle, lease.attempt, channel.name,
                        lease.links)
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
    observation = _unlinked(_judged(guard, observed, failure), lease.links)
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


def _unlinked(observation: Observation, links: Mapping[str, str]) -> Observation:
    """``observation`` with its detail cut of every response link (a URL or its token) a provider may
    have echoed back: a link is the recipient's credential, never stored in a fact."""
    detail = observation.detail
    if not links or detail is None:
        return observation
    detail = str(detail)
    for url in links.values():
        for secret in (url, url.rsplit("/", 1)[-1]):
            if secret:
                detail = detail.replace(secret, "****")
    return dataclasses.replace(observation, detail=detail)


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
                if outcome.applied and (waited := provider_wait(observation)) is not None:
                    # The provider's Retry-After holds the channel's bucket for the whole fleet (N8, N42).
                    await hold(tx, guard.channel, DEFAULT_SCOPE, seconds=waited, now=now)
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
