"""Provider-side answers (adapters/web/providers.py) against locally signed requests: a Slack button and a
PagerDuty ``incident.acknowledged`` answer the notification they belong to; a bad, missing or stale signature
writes nothing; a replayed request is the original answer again (docs/console.md, "Responders")."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import sqlalchemy as sa

from statebook.adapters.channels.pagerduty import PagerDutyChannel
from statebook.adapters.channels.slack import SlackChannel
from statebook.lifecycle.facts import facts_table
from statebook.outbox.notifications import (
    Delivery, deliver_due_notifications, get_response, send_notification,
)
from statebook.outbox.notifications.scripted import ScriptedChannel

from .conftest import web_settings

SECRETS = {"RESPOND_TEST_LINK_KEY": "providers-test-LINK-key-0123456789",
           "RESPOND_TEST_SLACK": "slack-SIGNING-secret-0123456789abcdef",
           "RESPOND_TEST_PAGERDUTY": "pagerduty-SIGNING-secret-0123456789"}
SLACK = SECRETS["RESPOND_TEST_SLACK"].encode()
PAGERDUTY = SECRETS["RESPOND_TEST_PAGERDUTY"].encode()


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return web_settings(public_url="http://book.example.org", link_key={"env": "RESPOND_TEST_LINK_KEY"},
                        slack_signing_secret={"env": "RESPOND_TEST_SLACK"},
                        pagerduty_signing_secret={"env": "RESPOND_TEST_PAGERDUTY"})


async def delivered(book: Any, app: Any) -> tuple[str, dict[str, str]]:
    """A notification to alice, delivered with the console's links: its id and its links."""
    accepted = await send_notification(book, recipient="alice", content={"text": "disk full"}, mode="guaranteed",
                                       channels=["slack"], response_timeout=600)
    slack = ScriptedChannel("slack", ["success"])
    await deliver_due_notifications(book, {"slack": slack}, deadline=2.0, links=app.state.console.links.links)
    return accepted.id, dict(slack.effects[0].links)


async def facts(book: Any) -> int:
    async with book.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(facts_table))).scalar()


# -- Slack --------------------------------------------------------------------------------------------
def button(nid: str, links: dict[str, str], action_id: str) -> dict[str, Any]:
    """The button our Slack message carries for ``action_id`` (read from the message itself)."""
    message = SlackChannel.message(Delivery(nid, "alice", {"text": "disk full"}, 1, 1, "slack", links))
    [found] = [b for b in message["blocks"][1]["elements"] if b["action_id"] == action_id]
    return found


def slack_request(clock: Any, action_id: str, value: str, *, secret: bytes = SLACK, age: float = 0,
                  user: str = "U123") -> tuple[bytes, dict[str, str]]:
    payload = {"type": "block_actions", "user": {"id": user, "username": "alice"},
               "actions": [{"type": "button", "action_id": action_id, "block_id": "statebook-response",
                            "value": value}], "response_url": "https://hooks.slack.test/actions/1"}
    body = urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(clock.now() - age))
    signature = "v0=" + hmac.new(secret, f"v0:{stamp}:".encode() + body, hashlib.sha256).hexdigest()
    return body, {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature,
                  "Content-Type": "application/x-www-form-urlencoded"}


async def test_a_signed_slack_button_acknowledges_as_the_links_recipient_and_a_replay_is_the_original(
        book, app, client: httpx.AsyncClient, clock):
    nid, links = await delivered(book, app)
    pressed = button(nid, links, "ack")
    body, headers = slack_request(clock, "ack", pressed["value"])
    answered = await client.post("/hooks/slack", content=body, headers=headers)
    assert answered.status_code == 200 and answered.json()["outcome"] == "recorded"
    response = await get_response(book, nid)
    assert (response.status, response.responder, response.note) == ("acked", "recipient:alice", "via slack by U123")
    written = await facts(book)
    clock.advance(5)
    again = await client.post("/hooks/slack", content=body, headers=headers)
    assert again.status_code == 200 and again.json()["outcome"] == "repeated"
    assert await facts(book) == written


async def test_the_dismiss_button_dismisses_and_a_later_ack_is_a_conflict_with_nothing_written(book, app, client, clock):
    nid, links = await delivered(book, app)
    body, headers = slack_request(clock, "dismiss", button(nid, links, "dismiss")["value"])
    assert (await client.post("/hooks/slack", content=body, headers=headers)).json()["outcome"] == "recorded"
    written = await facts(book)
    body, headers = slack_request(clock, "ack", button(nid, links, "ack")["value"], user="U999")
    late = await client.post("/hooks/slack", content=body, headers=headers)
    assert late.status_code == 200 and late.json()["outcome"] == "conflict"
    assert await facts(book) == written and (await get_response(book, nid)).status == "dismissed"


@pytest.mark.parametrize("fault", ["bad signature", "other secret", "no signature", "no timestamp", "stale",
                                   "from the future", "body changed"])
async def test_an_unverified_slack_request_is_refused_and_writes_nothing(book, app, client, clock, fault):
    nid, links = await delivered(book, app)
    value = button(nid, links, "ack")["value"]
    body, headers = slack_request(clock, "ack", value, secret=b"not-the-secret" if fault == "other secret" else SLACK,
                                  age={"stale": 301, "from the future": -301}.get(fault, 0))
    if fault == "bad signature":
        given = headers["X-Slack-Signature"]
        headers["X-Slack-Signature"] = given[:-1] + ("0" if given[-1] != "0" else "1")
    elif fault == "no signature":
        del headers["X-Slack-Signature"]
    elif fault == "no timestamp":
        del headers["X-Slack-Request-Timestamp"]
    elif fault == "body changed":
        body = body.replace(b"U123", b"U666")
    before = await facts(book)
    refused = await client.post("/hooks/slack", content=body, headers=headers)
    assert refused.status_code == 401
    assert await facts(book) == before and (await get_response(book, nid)).status == "pending"


async def test_a_signed_request_with_a_bad_link_or_the_wrong_button_is_refused(book, app, client, clock):
    nid, links = await delivered(book, app)
    ack = button(nid, links, "ack")["value"]
    before = await facts(book)
    flipped = ack[:10] + ("B" if ack[10] == "A" else "A") + ack[11:]  # a middle character: all six bits count
    for action_id, value in (("ack", flipped), ("dismiss", ack), ("ack", "not-a-token")):
        body, headers = slack_request(clock, action_id, value)
        assert (await client.post("/hooks/slack", content=body, headers=headers)).status_code == 403
    clock.advance(601)  # the link's expiry: the response deadline
    body, headers = slack_request(clock, "ack", ack)
    expired = await client.post("/hooks/slack", content=body, headers=headers)
    assert expired.status_code == 403 and "expired" in expired.text
    assert await facts(book) == before


# -- PagerDuty ----------------------------------------------------------------------------------------
def pagerduty_request(incident_key: str, *, event_type: str = "incident.acknowledged",
                      secrets: tuple[bytes, ...] = (PAGERDUTY,)) -> tuple[bytes, dict[str, str]]:
    event = {"event": {"id": "01DEN2JWQ9", "event_type": event_type, "resource_type": "incident",
                       "occurred_at": "2026-12-05T19:30:00.000Z",
                       "agent": {"id": "PLH1HKV", "type": "user_reference", "summary": "Alice On-Call"},
                       "client": {"name": "PagerDuty"},
                       "data": {"id": "PGR0VU2", "type": "incident", "number": 2, "status": "acknowledged",
                                "incident_key": incident_key, "title": "disk full"}}}
    body = json.dumps(event).encode()
    signature = ",".join("v1=" + hmac.new(s, body, hashlib.sha256).hexdigest() for s in secrets)
    return body, {"X-PagerDuty-Signature": signature, "Content-Type": "application/json"}


async def test_a_signed_pagerduty_acknowledgement_acknowledges_its_notification_once(book, app, client):
    nid, _ = await delivered(book, app)
    incident_key = PagerDutyChannel(routing_key="R" * 32).event(Delivery(nid, "alice", {"text": "x"}, 1, 1,
                                                                         "pagerduty"))["dedup_key"]
    body, headers = pagerduty_request(incident_key, secrets=(b"the-old-secret-0123456789", PAGERDUTY))
    answered = await client.post("/hooks/pagerduty", content=body, headers=headers)
    assert answered.status_code == 200 and answered.json()["outcome"] == "recorded"
    response = await get_response(book, nid)
    assert (response.status, response.responder, response.note) == ("acked", "recipient:alice",
                                                                     "via pagerduty by PLH1HKV")
    written = await facts(book)
    again = await client.post("/hooks/pagerduty", content=body, headers=headers)
    assert again.status_code == 200 and again.json()["outcome"] == "repeated" and await facts(book) == written


@pytest.mark.parametrize("fault", ["no signature", "bad signature", "other secret", "body changed", "v0 scheme"])
async def test_an_unverified_pagerduty_webhook_is_refused_and_writes_nothing(book, app, client, fault):
    nid, _ = await delivered(book, app)
    body, headers = pagerduty_request(nid, secrets=(b"another-secret-0123456789",) if fault == "other secret"
                                      else (PAGERDUTY,))
    if fault == "no signature":
        del headers["X-PagerDuty-Signature"]
    elif fault == "bad signature":
        headers["X-PagerDuty-Signature"] = "v1=" + "0" * 64
    elif fault == "body changed":
        body = body.replace(b"PLH1HKV", b"PEVIL00")
    elif fault == "v0 scheme":
        headers["X-PagerDuty-Signature"] = headers["X-PagerDuty-Signature"].replace("v1=", "v0=")
    before = await facts(book)
    assert (await client.post("/hooks/pagerduty", content=body, headers=headers)).status_code == 401
    assert await facts(book) == before and (await get_response(book, nid)).status == "pending"


async def test_other_pagerduty_events_and_foreign_incidents_are_ignored(book, app, client):
    nid, _ = await delivered(book, app)
    before = await facts(book)
    for key, event_type in ((nid, "incident.resolved"), (nid, "incident.triggered"), ("Q" * 26, "incident.acknowledged"),
                            ("", "incident.acknowledged")):
        body, headers = pagerduty_request(key, event_type=event_type)
        answer = await client.post("/hooks/pagerduty", content=body, headers=headers)
        assert answer.status_code == 200 and answer.json()["outcome"] == "ignored"
    assert await facts(book) == before


async def test_unconfigured_hooks_are_not_found(book):
    from statebook.adapters.web import create_app

    application = create_app(book, web_settings())
    transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as c:
        for path in ("/hooks/slack", "/hooks/pagerduty"):
            assert (await c.post(path, content=b"{}")).status_code == 404
