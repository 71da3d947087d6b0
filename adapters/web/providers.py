"""Answers that come from a provider instead of a page: a Slack button and a PagerDuty acknowledgement
become the same response transition a responder's link makes (docs/console.md, "Responders").

- ``POST /hooks/slack`` — Slack's interactive payload (form field ``payload``, JSON of a
  ``block_actions``). The request is verified with ``[web] slack_signing_secret``: ``X-Slack-Signature``
  must be ``v0=`` and the hex HMAC-SHA256 of ``v0:<X-Slack-Request-Timestamp>:<raw body>``, and the
  timestamp within ``replay_window_seconds`` of the book's clock. The button (``action_id`` ``ack`` or
  ``dismiss``, as our Slack messages carry them) holds the link's token in its ``value``; the token is
  checked like a link (tampered, expired, foreign) and must name the button's action.
- ``POST /hooks/pagerduty`` — a V3 webhook, verified with ``[web] pagerduty_signing_secret``:
  ``X-PagerDuty-Signature`` lists ``v1=<hex HMAC-SHA256 of the raw body>`` entries (several while a
  secret rotates); one must match. ``incident.acknowledged`` acknowledges the notification whose id is
  the incident's ``incident_key`` (our PagerDuty channel triggers with ``dedup_key`` = the notification
  id); other events, and incidents that are not ours, are answered 200 and ignored.

The actor is ``Actor("recipient", R)`` where R is the recipient the notification was sent to — the link's
recipient for Slack (the button carries that link), the notification's own for PagerDuty — and the
provider's person goes in the answer's note (``via slack by U123``). So one recipient answering through
any of its channels is one actor: a second press, a redelivered webhook, or the webhook PagerDuty sends
when our own follow-up acknowledges the incident, is the original answer again and writes nothing.

Verification failures are 401 (missing header, bad signature, stale timestamp), a refused link 403, an
unconfigured hook 404; nothing is written on any of them. A verified request whose answer cannot be
recorded (already answered, timed out) is 200 with a line saying so: the provider must not retry it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from statebook.adapters.channels.secrets import SecretError
from statebook.adapters.errors import ConfigError
from statebook.lifecycle.inputs import KEY_CHARS
from statebook.outbox.notifications import get_notification

from .links import LinkRefused
from .respond import Outcome, answer, linked
from .state import Console, console

MAX_BODY_BYTES = 256 * 1024
SLACK_ACTIONS = {"ack": "acked", "dismiss": "dismissed"}
SAID = {"recorded": "recorded", "repeated": "already recorded: the original answer stands",
        "conflict": "not recorded: already answered", "timed_out": "not recorded: the time to answer ran out",
        "not_waiting": "not recorded: the notification waits for no answer"}


def _secret(c: Console, name: str) -> bytes:
    """The signing secret ``[web] <name>``, read once per app (404 when it is not configured)."""
    cache = c.extras.setdefault("provider_secrets", {})
    if name not in cache:
        ref = getattr(c.web, name)
        if ref is None:
            raise HTTPException(404, f"this hook is not configured ([web] {name})")
        try:
            cache[name] = ref.reveal().encode()
        except SecretError as exc:
            raise ConfigError(f"[web] {name}: {exc}") from None
    secret: bytes = cache[name]
    return secret


async def _body(request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise HTTPException(413, "the request is too large")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise HTTPException(413, "the request is too large")
    return body


def _said(outcome: Outcome) -> JSONResponse:
    return JSONResponse({"outcome": outcome.kind, "said": SAID[outcome.kind]})


# -- Slack ------------------------------------------------------------------------------------------
def slack_signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Slack-Signature`` Slack sends for ``body`` at ``timestamp``."""
    return "v0=" + hmac.new(secret, b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()


def _slack_verified(c: Console, request: Request, body: bytes) -> None:
    secret = _secret(c, "slack_signing_secret")
    stamp = request.headers.get("x-slack-request-timestamp", "")
    given = request.headers.get("x-slack-signature", "")
    if not stamp or not given:
        raise HTTPException(401, "the request carries no Slack signature")
    if not stamp.isdigit() or abs(c.book.clock.now() - int(stamp)) > c.web.replay_window_seconds:
        raise HTTPException(401, "the request's timestamp is outside the replay window")
    if not hmac.compare_digest(slack_signature(secret, stamp, body).encode(), given.encode()):
        raise HTTPException(401, "the Slack signature does not match")


def _slack_button(body: bytes) -> tuple[str, str, str]:
    """(action_id, value, user id) of the payload's first button."""
    try:
        [raw] = parse_qs(body.decode("utf-8"), strict_parsing=True)["payload"]
        payload = json.loads(raw)
        [first, *_] = payload["actions"]
        action_id, value = first["action_id"], first["value"]
        user = payload.get("user") or {}
        user_id = user.get("id") or user.get("username") or "unknown"
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise HTTPException(400, "not a Slack block_actions payload with a button") from None
    if not all(isinstance(v, str) for v in (action_id, value, user_id)):
        raise HTTPException(400, "not a Slack block_actions payload with a button")
    return action_id, value, user_id[:KEY_CHARS]


async def slack(request: Request) -> Response:
    """``POST /hooks/slack``: a verified button press answers the notification its link names."""
    c = console(request)
    body = await _body(request)
    _slack_verified(c, request, body)
    action_id, value, user_id = _slack_button(body)
    if action_id not in SLACK_ACTIONS:
        return JSONResponse({"outcome": "ignored", "said": "not a statebook button"})
    if c.links is None:
        raise HTTPException(403, "response links are not enabled on this console")
    try:
        link = c.links.check(value)
    except LinkRefused as exc:
        raise HTTPException(403, f"the button's link is {exc.reason}") from None
    if link.action != SLACK_ACTIONS[action_id] or await linked(c.book, link) is None:
        raise HTTPException(403, "the button's link does not belong to this notification and action")
    return _said(await answer(c.book, link.notification_id, link.recipient, link.action,
                              note=f"via slack by {user_id}"))


# -- PagerDuty --------------------------------------------------------------------------------------
def pagerduty_signature(secret: bytes, body: bytes) -> str:
    """One ``X-PagerDuty-Signature`` entry for ``body``."""
    return "v1=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _pagerduty_verified(c: Console, request: Request, body: bytes) -> None:
    secret = _secret(c, "pagerduty_signing_secret")
    given = request.headers.get("x-pagerduty-signature", "")
    if not given:
        raise HTTPException(401, "the request carries no PagerDuty signature")
    expected = pagerduty_signature(secret, body).encode()
    matched = False
    for entry in given.split(","):  # every entry compared: the time does not tell which one matched
        matched |= hmac.compare_digest(expected, entry.strip().encode())
    if not matched:
        raise HTTPException(401, "no PagerDuty signature matches")


def _event(body: bytes) -> dict[str, Any]:
    try:
        event = json.loads(body)["event"]
    except (ValueError, KeyError, TypeError):
        raise HTTPException(400, "not a PagerDuty V3 webhook") from None
    if not isinstance(event, dict):
        raise HTTPException(400, "not a PagerDuty V3 webhook")
    return event


async def pagerduty(request: Request) -> Response:
    """``POST /hooks/pagerduty``: a verified ``incident.acknowledged`` acknowledges its notification."""
    c = console(request)
    body = await _body(request)
    _pagerduty_verified(c, request, body)
    event = _event(body)
    raw = event.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    key = data.get("incident_key")
    if event.get("event_type") != "incident.acknowledged" or not isinstance(key, str) or not 0 < len(key) <= KEY_CHARS:
        return JSONResponse({"outcome": "ignored", "said": "not an acknowledgement of a statebook incident"})
    notification = await get_notification(c.book, key)
    if notification is None:
        return JSONResponse({"outcome": "ignored", "said": "not a statebook incident"})
    raw = event.get("agent")
    agent: dict[str, Any] = raw if isinstance(raw, dict) else {}
    who = agent.get("id")
    by = who if isinstance(who, str) else "unknown"
    return _said(await answer(c.book, notification.id, notification.recipient, "acked",
                              note=f"via pagerduty by {by[:KEY_CHARS]}"))


routes: list[BaseRoute] = [
    Route("/hooks/slack", slack, methods=["POST"], name="hook_slack"),
    Route("/hooks/pagerduty", pagerduty, methods=["POST"], name="hook_pagerduty"),
]
