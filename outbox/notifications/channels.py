"""The channel protocol: what a notification channel adapter implements (specs/notifications.md N4-N6).

A channel makes one *observation* per call: it may try its provider several times (provider-local
retries, within the adapter deadline) and reports one :class:`Observation`. Around each call the
runtime holds the lease; the channel tells it when the provider admits the send:

- ``await guard.admit()`` right before the first provider effect: the runtime checks the claim and
  the lease, draws the channel's rate-limit token and writes ``channel_attempt.started`` — in one
  transaction — and only then may the effect happen. No token raises :class:`NoToken` (the channel
  returns without sending; the runtime records ``RATE_LIMITED``).
- ``await guard.guard_provider_attempt()`` before each further provider effect (a retry): a lease
  check raising :class:`LeaseLost` when the claim is gone or the lease would lapse. Before the
  admission it writes nothing; after it, the runtime records the retry on the started observation
  before returning (not another start), so the record bounds how many effects the observation stands for.

An exception escaping ``send`` is recorded by its type only (its text may carry a secret): an adapter
reports what went wrong in its :class:`Observation`'s ``detail``, built from status codes and provider
error codes, never from an exception's message.

A channel that does not report its admission (``reports_admission = False``) is admitted at its
entry: everything after the call starts counts as a possible effect (a timeout is then ``UNKNOWN``,
never ``NOT_STARTED``). A channel with internal retries that does not declare
``guards_provider_attempts = True`` is guarded at its entry only. Real adapters (Slack, email,
PagerDuty, webhook, WebSocket, Apprise) live in ``statebook.adapters.channels``, with the contract test
case every adapter passes; :mod:`.scripted` has test channels.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

PERSISTENT_ORDER = ("slack", "email", "pagerduty", "webhook", "apprise")
"""The persistent channels, in the default order a GUARANTEED attempt runs the selected ones (a
deployment may set another order: ``deliver_due_notifications(order=...)``, ``[notifications] order``)."""
EPHEMERAL = ("websocket",)
"""Channels whose success never satisfies a GUARANTEED obligation."""
CHANNEL_NAMES = (*PERSISTENT_ORDER, *EPHEMERAL)
FOLLOWS_RESPONSES = ("pagerduty",)
"""Channels whose provider keeps an incident per notification: acknowledged and resolved when the
human answers (:mod:`.responses`), through dispatches routed ``follow:<channel>``."""


class Mode(str, enum.Enum):
    """How hard a notification tries: GUARANTEED (every channel in order, cycles, dead letter) or BEST_EFFORT (one
    try).
    """

    GUARANTEED = "guaranteed"
    BEST_EFFORT = "best_effort"


class ProviderOutcome(str, enum.Enum):
    """What one channel observation found (the ``channel_attempt`` result statuses)."""

    SUCCESS = "success"          # the provider accepted the send (never mere queueing on our side)
    REJECTED = "rejected"        # the provider refused it
    UNKNOWN = "unknown"          # admitted, then no answer in time: not evidence of rejection
    NOT_STARTED = "not_started"  # a timeout or cancellation before admission: nothing was sent
    RATE_LIMITED = "rate_limited"  # no token here, or the provider said 429


@dataclass(frozen=True)
class Observation:
    """A channel call's result. ``retries``: provider-local retries it summarises; ``retry_after``:
    seconds the provider asked to wait (a 429's ``Retry-After``)."""

    outcome: ProviderOutcome
    detail: str | None = None
    retries: int = 0
    retry_after: float | None = None


@dataclass(frozen=True)
class Delivery:
    """What a channel is asked to deliver: one attempt of one notification on this channel. ``links``:
    action (``acked``, ``dismissed``) -> the URL the recipient opens to answer, when the deployment makes
    response links (:data:`LinkHook`); each is a credential for this recipient, so a channel sends it to the
    recipient only and never logs it."""

    notification_id: str
    recipient: str
    content: Mapping[str, Any]
    cycle: int
    attempt: int
    channel: str
    links: Mapping[str, str] = field(default_factory=dict)


LinkHook = Callable[[str, str, "float | None"], Mapping[str, str]]
"""Makes a delivery's response links: ``(notification_id, recipient, due_at)`` -> action -> URL, where
``due_at`` is the response deadline (POSIX seconds) when the notification waits for an answer, else None.
The composition root passes one to :class:`~.worker.NotificationWorker` (``links=``) when response
links are configured; the outbox itself makes none."""


class LeaseLost(Exception):
    """Raised by a guard: the claim is no longer this worker's, or its lease would lapse first."""


class NoToken(Exception):
    """Raised by ``admit``: the channel's rate-limit bucket has no token now."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"no rate-limit token for {retry_after:.3f}s")
        self.retry_after = retry_after


class Guard(Protocol):
    """The runtime's side of one channel call (see the module docstring)."""

    async def admit(self) -> None:
        """Admit the send: take a rate-limit token and record the attempt as started; raises when the lease is lost
        or no token comes in time. Call it right before the provider's first effect.
        """
        ...

    async def guard_provider_attempt(self) -> None:
        """Check the lease is still held right before a further provider effect (a retry); raises when it is lost.
        """
        ...

    def remaining(self) -> float:
        """Seconds left of this call's adapter deadline (socket budgets come from it)."""
        ...


@runtime_checkable
class Channel(Protocol):
    """A channel adapter: ``name`` is one of :data:`CHANNEL_NAMES`."""

    name: str
    persistent: bool
    reports_admission: bool
    guards_provider_attempts: bool

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """Send ``delivery`` through the provider, calling ``guard`` before each effect, and return what the
        provider answered as an ``Observation``.
        """
        ...


def is_persistent(name: str) -> bool:
    """True for a channel whose messages persist for the recipient (the ones a GUARANTEED notification may end on).
    """
    return name in PERSISTENT_ORDER


def run_order(names: list[str], order: Sequence[str] = PERSISTENT_ORDER) -> list[str]:
    """The selected channels in the order an attempt runs them: persistent ones in ``order`` (a
    permutation of :data:`PERSISTENT_ORDER`, see :func:`check_order`), then WebSocket."""
    return [n for n in (*order, *EPHEMERAL) if n in names]


def check_order(order: Sequence[str]) -> tuple[str, ...]:
    """``order`` as a fallback order: every persistent channel exactly once (ValueError otherwise)."""
    names = tuple(order)
    if sorted(names) != sorted(PERSISTENT_ORDER):
        raise ValueError(f"a fallback order names every persistent channel exactly once ({', '.join(PERSISTENT_ORDER)}); "
                         f"got {', '.join(map(str, names)) or 'none'}")
    return names
