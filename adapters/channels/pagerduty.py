"""PagerDuty: Events API v2 ``trigger`` for a notification, and the ``acknowledge`` / ``resolve`` that
follow the human (:class:`PagerDutyFollowTransport`).

The event's ``dedup_key`` is the notification id, so a repeated trigger after an UNKNOWN is one
incident at PagerDuty (the destination-level idempotency of ADR-0059), and an acknowledgement finds
the incident by the same key. Outcomes: ``2xx`` (``202``) SUCCESS, ``429`` RATE_LIMITED, ``5xx``
retried then UNKNOWN, ``400`` (and any other ``4xx``) REJECTED with PagerDuty's message.

The trigger's ``payload``: ``summary`` is the notification's text (:func:`~.http.text_of`, cut to
1024 characters), ``source`` and ``severity`` come from the settings (a ``severity`` in the content
wins when it is one of PagerDuty's four), ``custom_details`` carries the recipient and the content; a
delivery with response links adds the event's ``links`` (``href``, ``text``: Acknowledge, Dismiss).

>>> PagerDutyConfig(routing_key=SecretRef(env="PAGERDUTY_ROUTING_KEY")).build()   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from statebook.lifecycle.clock import Clock
from statebook.lifecycle.codec import dumps, loads
from statebook.outbox.notifications import Delivery, Guard, Observation
from statebook.outbox.dispatch.transport import TransportResult

from .http import httpx  # the channels extra, checked there
from .http import MAX_TRIES, Answer, HttpSender, Outgoing, checked_url, clock_or_system, provider_text, status_verdict, text_of
from .links import LABELS, ordered
from .secrets import SecretRef, mask

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SEVERITIES = ("critical", "error", "warning", "info")
SUMMARY_CHARS = 1024
FOLLOW_ROUTE = "follow:pagerduty"
"""The dispatch route of the acknowledge / resolve events (:class:`PagerDutyFollowTransport`)."""
FOLLOW_ACTIONS = ("acknowledge", "resolve")
FOLLOW_TIMEOUT_SECONDS = 10.0


def _message(answer: Answer, secrets: tuple[str, ...] = ()) -> str | None:
    """PagerDuty's refusal (``{"status": "invalid event", "errors": ["..."]}``): its first error, else its message."""
    reply = answer.json()
    if not isinstance(reply, dict):
        return None
    errors = reply.get("errors")
    first = errors[0] if isinstance(errors, list) and errors else reply.get("message") or reply.get("status")
    return provider_text(first, secrets)


class PagerDutyChannel:
    """The ``pagerduty`` channel: persistent; reports its admission and guards its retries (:mod:`.http`)."""

    name = "pagerduty"
    persistent = True
    reports_admission = True
    guards_provider_attempts = True

    def __init__(self, *, routing_key: str, url: str = EVENTS_URL, source: str = "statebook",
                 severity: str = "critical", max_tries: int = MAX_TRIES, trust_env: bool = True,
                 clock: Clock | None = None) -> None:
        if severity not in SEVERITIES:
            raise ValueError(f"severity: one of {', '.join(SEVERITIES)}, got {severity!r}")
        self.routing_key = routing_key
        self.url = checked_url(url, "the PagerDuty url")
        self.source = source
        self.severity = severity
        self.clock = clock_or_system(clock)
        self.secrets = (routing_key,)
        self.sender = HttpSender(secrets=self.secrets, max_tries=max_tries, trust_env=trust_env)

    def __repr__(self) -> str:
        return f"PagerDutyChannel(url={self.url!r}, routing_key={mask(self.routing_key)})"

    __str__ = __repr__

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.sender.aclose()

    def event(self, delivery: Delivery) -> dict[str, Any]:
        """The Events API v2 trigger for ``delivery`` (``dedup_key``: the notification id)."""
        content = dict(delivery.content)
        severity = content.get("severity") if content.get("severity") in SEVERITIES else self.severity
        event: dict[str, Any] = {"routing_key": self.routing_key, "event_action": "trigger", "dedup_key": delivery.notification_id,
                 "payload": {"summary": text_of(content)[:SUMMARY_CHARS], "source": self.source, "severity": severity,
                             "custom_details": {"recipient": delivery.recipient, "content": content}}}
        if links := ordered(delivery.links):
            event["links"] = [{"href": url, "text": LABELS[action]} for action, url in links]
        return event

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """Trigger the incident (see the module for the outcomes)."""
        outgoing = Outgoing(self.url, dumps(self.event(delivery)).encode())
        return await self.sender.post(guard, lambda: outgoing, self._verdict)

    def _verdict(self, answer: Answer) -> Observation | None:
        return status_verdict(answer, clock=self.clock, secrets=self.secrets,
                              provider_code=lambda a: _message(a, self.secrets))


class PagerDutyFollowTransport:
    """The dispatch transport of route ``follow:pagerduty``: sends the ``acknowledge`` or ``resolve`` of
    a dispatch envelope whose ``body`` is ``{"notification_id", "dedup_key", "action", "responder"}``,
    with the trigger's ``dedup_key``. ``2xx`` is success; anything else a failed attempt the outbox
    retries (both actions are idempotent at PagerDuty). One try per send, within ``timeout``."""

    def __init__(self, *, routing_key: str, url: str = EVENTS_URL, timeout: float = FOLLOW_TIMEOUT_SECONDS,
                 trust_env: bool = True) -> None:
        self.routing_key = routing_key
        self.url = checked_url(url, "the PagerDuty url")
        self.timeout = timeout
        self.sender = HttpSender(secrets=(routing_key,), trust_env=trust_env)

    def __repr__(self) -> str:
        return f"PagerDutyFollowTransport(url={self.url!r}, routing_key={mask(self.routing_key)})"

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.sender.aclose()

    async def send(self, deliver_to: str, payload: str) -> TransportResult:
        """Post the envelope's action; a failed :class:`TransportResult` for any problem, never a raise."""
        if deliver_to != FOLLOW_ROUTE:
            return TransportResult.failed(f"the PagerDuty follow transport serves {FOLLOW_ROUTE!r}, not {deliver_to!r}")
        try:
            body = loads(payload).get("body") or {}
            action, key = body.get("action"), body.get("dedup_key") or body.get("notification_id")
        except (ValueError, AttributeError):
            return TransportResult.failed("the payload is not a dispatch envelope with a body")
        if action not in FOLLOW_ACTIONS or not isinstance(key, str) or not key:
            return TransportResult.failed(f"a follow event needs an action ({' or '.join(FOLLOW_ACTIONS)}) and a "
                                          f"dedup_key; got action {action!r}")
        event = {"routing_key": self.routing_key, "event_action": action, "dedup_key": key}
        evidence = {"channel": "pagerduty", "action": action, "dedup_key": key}
        try:
            answer = await self.sender.post_once(Outgoing(self.url, dumps(event).encode()), timeout=self.timeout)
        except (TimeoutError, httpx.HTTPError) as exc:
            timed_out = isinstance(exc, TimeoutError | httpx.TimeoutException)
            what = f"no answer within {self.timeout:g}s" if timed_out else type(exc).__name__  # never str(exc): the URL
            return TransportResult.failed(f"{action}: {what}", timed_out=timed_out, **evidence)
        if 200 <= answer.status < 300:
            return TransportResult(True, None, {**evidence, "status": answer.status})
        named = _message(answer, (self.routing_key,))
        return TransportResult.failed(f"HTTP {answer.status}" + (f": {named}" if named else ""), status=answer.status,
                                      **evidence)


class PagerDutyConfig(BaseModel):
    """``[notifications.pagerduty]``: the routing key (a secret), the Events API URL, the event's
    ``source`` and default ``severity``."""

    model_config = ConfigDict(extra="forbid")

    routing_key: SecretRef
    url: str = EVENTS_URL
    source: str = "statebook"
    severity: Literal["critical", "error", "warning", "info"] = "critical"
    max_tries: int = Field(default=MAX_TRIES, ge=1, le=10)
    follow_timeout: float = Field(default=FOLLOW_TIMEOUT_SECONDS, gt=0, le=120)
    trust_env: bool = True
    """Take proxy settings from the environment (httpx's ``trust_env``)."""

    def build(self, *, clock: Clock | None = None) -> PagerDutyChannel:
        """The channel, its routing key revealed once."""
        return PagerDutyChannel(routing_key=self.routing_key.reveal(), url=self.url, source=self.source,
                                severity=self.severity, max_tries=self.max_tries, trust_env=self.trust_env, clock=clock)

    def build_follow(self) -> PagerDutyFollowTransport:
        """The ``follow:pagerduty`` dispatch transport, its routing key revealed once."""
        return PagerDutyFollowTransport(routing_key=self.routing_key.reveal(), url=self.url,
                                        timeout=self.follow_timeout, trust_env=self.trust_env)
