"""What is special about delivering a notification: its records, its due scan, and what a claim and a
finalization write (N1-N9). The delivery core (:mod:`statebook.outbox.core`) runs them.

A claim is ONE fenced transition writing a fresh ``claim_id`` and the lease's end (:func:`claim_command`),
or the settlement the cycle's record calls for instead; a finalization is ONE transition fenced by the
claim token (:func:`finalize_command`): delivered, retried with backoff, failed (dead-lettered when a
GUARANTEED cycle is exhausted) or rate-limited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from statebook.lifecycle import Actor, Command, Head, Reason
from statebook.lifecycle.codec import loads, new_id
from statebook.lifecycle.errors import StatebookError
from statebook.outbox.core import lease as core
from statebook.outbox.core.due import DueScan

from . import evidence
from .channels import Mode, Observation
from .schema import notifications

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


class EvidenceLost(StatebookError):
    """Recording a channel observation failed: the attempt stops and leaves its claim to lapse (N7)."""


@dataclass(frozen=True)
class Candidate(core.Candidate):
    """A due notification as the scan read it (the claim compares against these values and ``head``:
    the version makes a candidate stale as soon as anything moved the row, even back to equal values)."""

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
    dedup_claim_id: str | None = None
    response_timeout: float | None = None
    timeout_callback: str | None = None

    @property
    def attempt_limit(self) -> int:
        """Attempts this cycle may take: the configured bound (GUARANTEED) or one (BEST_EFFORT)."""
        return self.max_cycle_attempts if self.mode == Mode.GUARANTEED.value else 1


@dataclass(frozen=True)
class Lease(core.Lease):
    """A won claim: the fencing token, the lease's end, and what the attempt delivers. ``head`` is the
    row as the claim left it: finalize compares against it instead of reading the row again."""

    notification_id: str
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
    dedup_claim_id: str | None = None
    """The semantic obligation this notification owns (:mod:`.ownership`), or None."""
    response_timeout: float | None = None
    """Seconds a human has to answer once it is delivered (:mod:`.responses`), or None."""
    timeout_callback: str | None = None
    links: Mapping[str, str] = field(default_factory=dict)
    """The response links this attempt's deliveries carry (:data:`~.channels.LinkHook`): made per attempt."""

    @property
    def id(self) -> str:
        """The notification's id."""
        return self.notification_id

    def fence(self) -> dict[str, Any]:
        """The claim token and the cycle's attempt count the claim wrote: what finalize is guarded on."""
        return {"claim_id": self.claim_id, "cycle_attempts": self.cycle_attempt}


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


# -- the due scan and the claim -------------------------------------------------------------------
_FIELDS = tuple(f.name for f in fields(Candidate) if f.name != "head")
GUARDED = ("claim_id", "cycle_attempts")
"""The columns a claim compares beside the head."""
DUE = DueScan(notifications, ("pending", "rate_limited"), [notifications.c[c] for c in _FIELDS],
              (notifications.c.next_attempt_at, notifications.c.id))
"""Pending or rate-limited notifications with ``next_attempt_at <= now``, served by the partial due
index in (next_attempt_at, id) order (N9)."""
SCAN = DUE.query


def candidate(row: Mapping[str, Any]) -> Candidate:
    """A scanned row (the driver's values: JSON columns as text) as its Candidate."""
    channels, content = row["channels"], row["content"]
    values = {name: row[name] for name in _FIELDS}
    values["channels"] = tuple(loads(channels) if isinstance(channels, str) else channels)
    values["content"] = loads(content) if isinstance(content, str) else content
    return Candidate(**values, head=Head.of(row, *GUARDED))

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
    lease = Lease(c.id, c.cycle, c.attempts + 1, c.cycle_attempts + 1, c.attempt_limit, c.mode, c.channels,
                  c.recipient, c.content, duplicate_risk=record.duplicate_risk, dedup_claim_id=c.dedup_claim_id,
                  response_timeout=c.response_timeout, timeout_callback=c.timeout_callback, claim_id=token,
                  lease_until=until)
    return _command(c, "pending", code, summary, patch), lease




# -- finalize -------------------------------------------------------------------------------------
def backoff_seconds(cycle_attempt: int) -> float:
    """1 s after a cycle's first failed attempt, doubling after each further one."""
    return BACKOFF_BASE_SECONDS * 2.0 ** (max(cycle_attempt, 1) - 1)


def finalize_command(lease: Lease, result: AttemptResult, *, now: float) -> Command:
    """The transition recording what the attempt came to, fenced by the claim token."""
    if result.outcome is None:
        raise ValueError("this attempt has no outcome to finalize (its lease was lost or evidence failed)")
    error = None if result.error is None else result.error[:DETAIL_CHARS]
    cleared: dict[str, Any] = {"claim_id": None, "lease_until": None}
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
