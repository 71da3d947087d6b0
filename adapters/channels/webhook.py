"""A generic signed webhook: a JSON POST to a receiver of the user's own, persistent.

The body (canonical JSON)::

    {"notification_id": "...", "recipient": "...", "content": {...}, "cycle": 1, "attempt": 1}

with ``"links": {"acked": URL, "dismissed": URL}`` beside them when the delivery has response links

and the headers:

- ``X-Statebook-Timestamp``: POSIX seconds (an integer, from the injected clock) of this try;
- ``X-Statebook-Signature``: ``v1=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed with the secret>``;
- ``Idempotency-Key``: ``<notification_id>:<cycle>`` — the same for every try and every attempt of a
  cycle, so a receiver can drop a repeat after an UNKNOWN.

A receiver checks a request with :func:`verify_signature` (constant-time, with a timestamp
tolerance against replays). Outcomes: ``2xx`` SUCCESS, ``429`` RATE_LIMITED (``Retry-After``), ``408``
and ``5xx`` retried then UNKNOWN, any other ``4xx`` REJECTED. The URL is a secret too (it often
carries a token), as is the signing secret.

>>> WebhookConfig(url=SecretRef(env="HOOK_URL"), secret=SecretRef(file="/run/secrets/hook")).build()  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import hmac

from pydantic import BaseModel, ConfigDict, Field

from statebook.lifecycle.clock import Clock
from statebook.lifecycle.codec import dumps
from statebook.outbox.notifications import Delivery, Guard, Observation

from .http import MAX_TRIES, Answer, HttpSender, Outgoing, checked_url, clock_or_system, status_verdict
from .links import ordered
from .secrets import SecretRef, mask

TIMESTAMP_HEADER = "X-Statebook-Timestamp"
SIGNATURE_HEADER = "X-Statebook-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SCHEME = "v1"
TOLERANCE_SECONDS = 300.0
"""How old (or how far ahead) a timestamp :func:`verify_signature` accepts by default."""


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def sign(secret: str | bytes, timestamp: str | int, body: str | bytes) -> str:
    """The ``X-Statebook-Signature`` value: ``v1=`` and the hex HMAC-SHA256 of ``"<timestamp>.<body>"``."""
    mac = hmac.new(_bytes(secret), str(timestamp).encode() + b"." + _bytes(body), hashlib.sha256)
    return f"{SCHEME}={mac.hexdigest()}"


def verify_signature(secret: str | bytes, timestamp: str | int, body: str | bytes, signature: str, *, now: float,
                     tolerance: float = TOLERANCE_SECONDS) -> bool:
    """True when ``signature`` (the header's value; several comma-separated ``v1=`` entries are allowed,
    for a secret's rotation) signs ``timestamp`` and ``body`` with ``secret``, and ``timestamp`` is
    within ``tolerance`` seconds of ``now``. Compares in constant time.

    >>> verify_signature("s3cret", 1000, b"{}", sign("s3cret", 1000, b"{}"), now=1010.0)
    True
    """
    try:
        stamp = int(str(timestamp).strip())
    except ValueError:
        return False
    if abs(now - stamp) > tolerance:
        return False
    expected = sign(secret, stamp, body).encode()
    matched = False
    for candidate in signature.split(","):
        matched |= hmac.compare_digest(expected, candidate.strip().encode())
    return matched


class WebhookChannel:
    """The ``webhook`` channel: persistent; reports its admission and guards its retries (:mod:`.http`)."""

    name = "webhook"
    persistent = True
    reports_admission = True
    guards_provider_attempts = True

    def __init__(self, *, url: str, secret: str, max_tries: int = MAX_TRIES, trust_env: bool = True,
                 clock: Clock | None = None) -> None:
        if not secret:
            raise ValueError("a signed webhook needs a signing secret")
        self.url = checked_url(url, "the webhook url")
        self.secret = secret
        self.clock = clock_or_system(clock)
        self.secrets = (url, secret)
        self.sender = HttpSender(secrets=self.secrets, max_tries=max_tries, trust_env=trust_env)

    def __repr__(self) -> str:
        return f"WebhookChannel(url={mask(self.url)}, secret={mask(self.secret)})"

    __str__ = __repr__

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.sender.aclose()

    @staticmethod
    def body(delivery: Delivery) -> bytes:
        """The request body for ``delivery`` (canonical JSON, UTF-8)."""
        body = {"notification_id": delivery.notification_id, "recipient": delivery.recipient,
                "content": dict(delivery.content), "cycle": delivery.cycle, "attempt": delivery.attempt}
        if links := ordered(delivery.links):
            body["links"] = dict(links)
        return dumps(body).encode()

    def _signed(self, delivery: Delivery, body: bytes) -> Outgoing:
        stamp = int(self.clock.now())
        return Outgoing(self.url, body, {TIMESTAMP_HEADER: str(stamp), SIGNATURE_HEADER: sign(self.secret, stamp, body),
                                         IDEMPOTENCY_HEADER: f"{delivery.notification_id}:{delivery.cycle}"})

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """POST the signed body (each try signed with its own timestamp; see the module for outcomes)."""
        body = self.body(delivery)
        return await self.sender.post(guard, lambda: self._signed(delivery, body), self._verdict)

    def _verdict(self, answer: Answer) -> Observation | None:
        return status_verdict(answer, clock=self.clock, secrets=self.secrets)


class WebhookConfig(BaseModel):
    """``[notifications.webhook]``: the receiver's URL and the signing secret, both secrets."""

    model_config = ConfigDict(extra="forbid")

    url: SecretRef
    secret: SecretRef
    max_tries: int = Field(default=MAX_TRIES, ge=1, le=10)
    trust_env: bool = True
    """Take proxy settings from the environment (httpx's ``trust_env``)."""

    def build(self, *, clock: Clock | None = None) -> WebhookChannel:
        """The channel, its URL and secret revealed once."""
        return WebhookChannel(url=self.url.reveal(), secret=self.secret.reveal(), max_tries=self.max_tries,
                              trust_env=self.trust_env, clock=clock)
