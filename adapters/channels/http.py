"""The guarded HTTP send every HTTP channel (Slack, PagerDuty, signed webhook) shares, on ``httpx``.

Admission happens exactly when a request's headers are about to be written: httpx's documented
``trace`` request extension calls us with httpcore's events, and at ``http11.send_request_headers.started``
(or ``http2.``) :class:`HttpSender` awaits ``guard.admit()`` on the first request that gets that far
and ``guard.guard_provider_attempt()`` on every later one. So a connection that is refused or never
completes is ``NOT_STARTED`` with no ``started`` fact; once headers may have left, an attempt without a
definitive answer is ``UNKNOWN``. An exception of the guard (``NoToken``, ``LeaseLost``) leaves the
callback, httpcore closes the connection without writing a byte, and it propagates out of :meth:`post`.

Each try is bounded by ``guard.remaining()`` (httpx's socket timeouts and an ``asyncio.timeout``);
5xx answers, read errors and resets are retried with a short backoff while time is left. Details
are built here (status codes, exception class names, scrubbed provider codes): never ``str()`` of an
httpx exception, whose text may hold the URL — and a Slack webhook URL is a secret. httpx also logs
each request's URL at INFO: :func:`redact_logs` scrubs the registered secrets out of those records.

>>> sender = HttpSender(secrets=["https://hooks.example/T0/B0/xyz"])    # doctest: +SKIP
>>> await sender.post(guard, lambda: Outgoing(url, b"{}"), judge)        # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from statebook.lifecycle import tracing
from statebook.lifecycle.clock import SYSTEM_CLOCK, Clock
from statebook.lifecycle.codec import dumps, loads
from statebook.outbox.notifications import Guard, Observation, ProviderOutcome

from ..extras import require
from .secrets import scrub

if TYPE_CHECKING:
    import httpx as httpx  # re-exported: pagerduty takes it from here
else:
    httpx = require("httpx", extra="channels", feature="the Slack, PagerDuty and webhook channels")

MAX_TRIES = 4
"""Tries of one channel call by default (the first and three provider-local retries)."""
BACKOFF_SECONDS = 0.1
"""The pause before the first retry; it doubles for each further one, up to :data:`BACKOFF_CAP`."""
BACKOFF_CAP = 1.0
MIN_TRY_SECONDS = 0.05
"""A try is not started with less time than this left: it could not finish."""
MAX_BODY_BYTES = 64 * 1024
"""The most of an answer's body that is read (providers answer in a few hundred bytes)."""
DETAIL_TEXT = 120
"""Provider text kept in a detail, after scrubbing."""
_HEADERS_EVENT = ".send_request_headers.started"
_CODE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


# -- logs -------------------------------------------------------------------------------------------
_REDACTED: set[str] = set()


class _Redact(logging.Filter):
    """Scrubs registered secrets out of httpx / httpcore records (httpx logs every request's URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _REDACTED:
            message = record.getMessage()
            cleaned = scrub(message, sorted(_REDACTED, key=len, reverse=True))
            if cleaned != message:
                record.msg, record.args = cleaned, None
        return True


_FILTER = _Redact()
_LOGGERS = ("httpx", "httpcore.connection", "httpcore.http11", "httpcore.http2", "httpcore.proxy", "httpcore.socks")


def redact_logs(secrets: Iterable[str]) -> None:
    """Register ``secrets`` (and each URL's normalised form) to be scrubbed from httpx's log records."""
    for secret in secrets:
        if not secret:
            continue
        _REDACTED.add(secret)
        try:
            _REDACTED.add(str(httpx.URL(secret)))
        except (httpx.InvalidURL, TypeError):
            pass
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


# -- what is sent ----------------------------------------------------------------------------------
def checked_url(value: str, what: str) -> str:
    """``value`` when it is an ``http(s)://`` URL with a host that httpx can send to; ValueError naming
    ``what`` but never the value (a webhook URL is a secret) — checked when the channel is built, so a
    line break in a secret file is an error at start instead of an exception out of every send."""
    try:
        url = httpx.URL(value)
    except (httpx.InvalidURL, TypeError):
        raise ValueError(f"{what} is not a URL (a stray character or line break in it?)") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"{what} is not an http:// or https:// URL with a host")
    return value


def checked_header(value: str, what: str) -> str:
    """``value`` when it can go into an HTTP header as it is (printable ASCII, no whitespace); ValueError
    naming ``what``, never the value."""
    if not value.isascii() or any(ch.isspace() or not ch.isprintable() for ch in value):
        raise ValueError(f"{what} holds whitespace, a line break or a non-ASCII character")
    return value


# -- answers ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outgoing:
    """One POST to make: the URL, the body (bytes) and its headers."""

    url: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """A provider's answer: status, headers and (the first :data:`MAX_BODY_BYTES` of) the body."""

    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return loads(self.body)
        except ValueError:
            return None

    def text(self, secrets: Iterable[str] = ()) -> str:
        """The body as text, cut to :data:`DETAIL_TEXT` characters, secrets scrubbed."""
        return scrub(self.body.decode("utf-8", "replace")[:DETAIL_TEXT].strip(), tuple(secrets))


def provider_text(value: object, secrets: Iterable[str] = ()) -> str | None:
    """A provider's free-text message for a detail: scrubbed, printable ASCII only, cut to 80 characters."""
    if value is None:
        return None
    text = scrub(str(value), tuple(secrets))
    kept = "".join(ch for ch in text if 32 <= ord(ch) < 127)[:80].strip()
    return kept or None


def code(value: object) -> str | None:
    """A provider's error code (``channel_not_found``) when it looks like one, else None: free text
    from a provider never reaches a detail unchecked."""
    return value if isinstance(value, str) and _CODE.fullmatch(value) else None


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds (``"7"``) or an HTTP date (``"Wed,
    21 Oct 2026 07:28:00 GMT"``, counted from ``now``, never negative); None when absent or unreadable.

    >>> parse_retry_after("7", now=0.0), parse_retry_after("Thu, 01 Jan 1970 00:01:00 GMT", now=30.0)
    (7.0, 30.0)
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT; a zone-less one is read as such
        return None
    return max(0.0, when.timestamp() - now)


def status_verdict(answer: Answer, *, clock: Clock, secrets: Iterable[str] = (),
                   provider_code: Callable[[Answer], str | None] | None = None) -> Observation | None:
    """The common reading of an HTTP status: 2xx SUCCESS, 429 RATE_LIMITED (with ``Retry-After``), 408
    and 5xx None (retry), any other 4xx (or 1xx/3xx) REJECTED. ``provider_code`` names the refusal."""
    status = answer.status
    if 200 <= status < 300:
        return Observation(ProviderOutcome.SUCCESS, f"HTTP {status}")
    if status == 429:
        return rate_limited(answer, clock=clock)
    if status == 408 or status >= 500:
        return None
    named = provider_code(answer) if provider_code is not None else code(answer.text(secrets))
    return Observation(ProviderOutcome.REJECTED, f"HTTP {status}" + (f": {named}" if named else ""))


def rate_limited(answer: Answer, *, clock: Clock, detail: str | None = None) -> Observation:
    """RATE_LIMITED, with the answer's ``Retry-After`` when it has one."""
    wait = parse_retry_after(answer.headers.get("retry-after"), now=clock.now())
    return Observation(ProviderOutcome.RATE_LIMITED, detail or f"HTTP {answer.status}", retry_after=wait)


# -- the guarded send -------------------------------------------------------------------------------
class _Admission:
    """One channel call's admission state, shared by its tries' trace callbacks."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.admitted = False   # guard.admit() returned: the first request may leave
        self.admitting = False  # inside guard.admit() (a cut there: only the runtime knows if it committed)
        self.sent = 0           # requests whose headers were allowed out

    def tracer(self) -> Callable[[str, Mapping[str, Any]], Any]:
        """A trace callback for one request: the guard runs when its headers are about to be written."""
        async def trace(event: str, info: Mapping[str, Any]) -> None:
            if not event.endswith(_HEADERS_EVENT):
                return
            if self.admitted:
                await self.guard.guard_provider_attempt()
            else:
                self.admitting = True
                await self.guard.admit()
                self.admitting, self.admitted = False, True
            self.sent += 1
        return trace


def backoff(retry: int) -> float:
    """The pause before provider-local retry number ``retry`` (1, 2, ...)."""
    return min(BACKOFF_CAP, BACKOFF_SECONDS * 2.0 ** (retry - 1))


class HttpSender:
    """One ``httpx.AsyncClient`` (connections reused across calls), the guarded, retried POST of a
    channel call (:meth:`post`) and an unguarded one-shot POST (:meth:`post_once`). ``aclose()`` it."""

    def __init__(self, *, secrets: Iterable[str] = (), max_tries: int = MAX_TRIES, trust_env: bool = True,
                 client: httpx.AsyncClient | None = None) -> None:
        if max_tries < 1:
            raise ValueError(f"max_tries: at least 1 try, got {max_tries}")
        self.secrets = tuple(s for s in secrets if s)
        self.max_tries = max_tries
        self.client = client or httpx.AsyncClient(follow_redirects=False, trust_env=trust_env)
        redact_logs(self.secrets)

    async def aclose(self) -> None:
        """Close the client and its pooled connections."""
        await self.client.aclose()

    async def _exchange(self, outgoing: Outgoing, budget: float, trace: Callable[..., Any] | None) -> Answer:
        headers = {"content-type": "application/json", **outgoing.headers}
        extensions = {"trace": trace} if trace is not None else None
        request = self.client.build_request("POST", outgoing.url, content=outgoing.body, headers=headers,
                                            timeout=httpx.Timeout(budget), extensions=extensions)
        async with asyncio.timeout(budget):
            response = await self.client.send(request, stream=True)
            try:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) >= MAX_BODY_BYTES:
                        break
            finally:
                await response.aclose()
        return Answer(response.status_code, response.headers, bytes(body[:MAX_BODY_BYTES]))

    async def post_once(self, outgoing: Outgoing, *, timeout: float) -> Answer:
        """One unguarded POST within ``timeout`` seconds (for dispatch transports: the outbox retries).
        Raises ``TimeoutError`` or an ``httpx.HTTPError`` — describe it with :func:`failure`, never ``str()``."""
        tracer = tracing.active()
        if tracer is None:
            return await self._exchange(outgoing, timeout, None)
        with tracer.span("POST", "client", client_attributes(outgoing.url)) as span:
            answer = await self._exchange(outgoing, timeout, None)
            span.set("http.response.status_code", answer.status)
            if answer.status >= 400:
                span.fail(str(answer.status))
            return answer

    async def post(self, guard: Guard, make: Callable[[], Outgoing], judge: Callable[[Answer], Observation | None]) -> Observation:
        """POST ``make()`` behind the guard, retrying while ``judge`` answers None (retry) or the
        connection failed, while tries and time are left; one :class:`Observation` (see the module)."""
        admission = _Admission(guard)
        last = "no try: no time was left"
        tries = 0
        while True:
            budget = guard.remaining()
            if budget < MIN_TRY_SECONDS:
                break
            tries += 1
            before = admission.sent
            try:
                answer = await self._exchange(make(), budget, admission.tracer())
            except TimeoutError:
                if admission.admitting:
                    raise  # cut inside the admission: the runtime knows whether its started fact committed
                last = failure(TimeoutError(), sent=admission.sent > before)
                break  # the try had the whole remaining budget
            except httpx.HTTPError as exc:
                last = failure(exc, sent=admission.sent > before)
                if isinstance(exc, httpx.TimeoutException):
                    break
            else:
                verdict = judge(answer)
                if verdict is not None:
                    return replace(verdict, retries=max(0, admission.sent - 1))
                last = f"HTTP {answer.status}"
            if tries >= self.max_tries:
                break
            pause = backoff(tries)
            if guard.remaining() - pause < MIN_TRY_SECONDS:
                break
            await asyncio.sleep(pause)
        counted = f"{tries} {'try' if tries == 1 else 'tries'}"
        if admission.sent:
            return Observation(ProviderOutcome.UNKNOWN, f"{last}; no definitive answer ({counted})",
                               retries=admission.sent - 1)
        return Observation(ProviderOutcome.NOT_STARTED, f"{last}; nothing was sent ({counted})")


def client_attributes(url: str) -> dict[str, str | int]:
    """An HTTP client span's attributes: the method, host and port only — a webhook URL's path (and a
    query) may be the secret, so ``url.full`` is never set."""
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return {"http.request.method": "POST", "server.address": parsed.host, "server.port": port}


def failure(exc: BaseException, *, sent: bool) -> str:
    """A failed try as a detail: the exception's class and whether the request had left — never its
    message (httpx messages hold the URL)."""
    kind = type(exc).__name__
    if isinstance(exc, TimeoutError):
        kind = "no answer in time" if sent else "no connection in time"
    return f"{kind} after the request was sent" if sent else f"{kind} before the request was sent"


def clock_or_system(clock: Clock | None) -> Clock:
    """The injected clock, else the system's (for ``Retry-After`` dates and signature timestamps)."""
    return clock if clock is not None else SYSTEM_CLOCK


def text_of(content: Mapping[str, Any]) -> str:
    """A notification's message text: its ``text`` when it has one, else its ``title`` and ``body`` on
    two lines, else its JSON.

    >>> text_of({"text": "disk full"}), text_of({"title": "disk full", "body": "/var at 97%"})
    ('disk full', 'disk full\\n/var at 97%')
    """
    text = content.get("text")
    if isinstance(text, str) and text:
        return text
    parts = [content.get(k) for k in ("title", "body")]
    lines = [str(p) for p in parts if p not in (None, "")]
    if lines:
        return "\n".join(lines)
    return dumps(dict(content))
