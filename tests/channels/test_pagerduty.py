"""PagerDuty Events API v2 against a real local server: the contract, the trigger event, and the
follow transport's acknowledge / resolve with the same dedup_key."""

from __future__ import annotations

import pytest
from http_scenarios import http_scenario, running
from http_server import unreachable

from statebook.adapters.channels.contract import ChannelContract, RecordingGuard
from statebook.adapters.channels.pagerduty import FOLLOW_ROUTE, PagerDutyChannel, PagerDutyConfig, PagerDutyFollowTransport
from statebook.adapters.channels.secrets import SecretRef
from statebook.lifecycle.codec import dumps, loads
from statebook.outbox.notifications import Delivery, ProviderOutcome
from statebook.outbox.dispatch.signal import dispatch_envelope

ROUTING_KEY = "R0UTINGkeySECRET0123456789abcdef"


def pagerduty(base: str, **options) -> PagerDutyChannel:
    return PagerDutyChannel(routing_key=ROUTING_KEY, url=f"{base}/v2/enqueue", **options)


def follow(base: str, **options) -> PagerDutyFollowTransport:
    return PagerDutyFollowTransport(routing_key=ROUTING_KEY, url=f"{base}/v2/enqueue", **options)


def envelope(body: dict) -> str:
    return dumps(dispatch_envelope(created_at=0.0, dispatch_id="d" * 32, kind="follow", deliver_to=FOLLOW_ROUTE,
                                   ack_token=None, body=body))


class TestPagerDutyContract(ChannelContract):
    deadline = 1.0

    def scenario(self, name):
        return http_scenario(name, "pagerduty", lambda base: (pagerduty(base), (ROUTING_KEY,)))


async def test_the_trigger_carries_the_notification_id_as_dedup_key():
    d = Delivery("n" * 26, "alice", {"title": "disk full", "body": "/var at 97%", "severity": "warning"}, 2, 1, "pagerduty")
    async with running("pagerduty", "accept", lambda b: pagerduty(b, source="db-1")) as (server, channel):
        first = await channel.send(d, RecordingGuard(server.effects, 2.0))
        again = await channel.send(d, RecordingGuard(server.effects, 2.0))  # a repeat after UNKNOWN: same incident
    assert (first.outcome, again.outcome) == (ProviderOutcome.SUCCESS, ProviderOutcome.SUCCESS)
    events = [loads(r.body) for r in server.received]
    assert events[0] == events[1] == {
        "routing_key": ROUTING_KEY, "event_action": "trigger", "dedup_key": "n" * 26,
        "payload": {"summary": "disk full\n/var at 97%", "source": "db-1", "severity": "warning",
                    "custom_details": {"recipient": "alice", "content": dict(d.content)}}}
    assert server.received[0].path == "/v2/enqueue"


async def test_a_400_is_rejected_with_pagerdutys_error():
    d = Delivery("n" * 26, "alice", {"text": "x"}, 1, 1, "pagerduty")
    async with running("pagerduty", "reject", pagerduty) as (server, channel):
        observed = await channel.send(d, RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, observed.detail) == (ProviderOutcome.REJECTED, "HTTP 400: 'routing_key' is invalid")


@pytest.mark.parametrize("action", ["acknowledge", "resolve"])
async def test_the_follow_transport_posts_the_action_with_the_same_dedup_key(action):
    body = {"notification_id": "n" * 26, "dedup_key": "n" * 26, "action": action, "responder": "user:alice"}
    async with running("pagerduty", "accept", follow) as (server, transport):
        result = await transport.send(FOLLOW_ROUTE, envelope(body))
    assert result.ok, result
    assert result.evidence == {"channel": "pagerduty", "action": action, "dedup_key": "n" * 26, "status": 202}
    [got] = server.received
    assert loads(got.body) == {"routing_key": ROUTING_KEY, "event_action": action, "dedup_key": "n" * 26}


async def test_the_follow_transport_reports_failures_without_raising_or_leaking():
    body = {"notification_id": "n" * 26, "dedup_key": "n" * 26, "action": "acknowledge", "responder": None}
    async with running("pagerduty", "reject", follow) as (server, transport):
        refused = await transport.send(FOLLOW_ROUTE, envelope(body))
        wrong_route = await transport.send("callback:x", envelope(body))
        bad_action = await transport.send(FOLLOW_ROUTE, envelope({**body, "action": "trigger"}))
        not_json = await transport.send(FOLLOW_ROUTE, "not json")
    assert not refused.ok and refused.error == "HTTP 400: 'routing_key' is invalid" and refused.evidence["status"] == 400
    assert not wrong_route.ok and not bad_action.ok and not not_json.ok
    assert server.effects() == 1
    with unreachable() as base:
        transport = follow(base, timeout=0.3)
        try:
            hung = await transport.send(FOLLOW_ROUTE, envelope(body))
        finally:
            await transport.aclose()
    assert not hung.ok and hung.evidence["timed_out"] is True
    for result in (refused, wrong_route, bad_action, not_json, hung):
        assert ROUTING_KEY not in (result.error or "") and ROUTING_KEY not in repr(result.evidence)


async def test_the_follow_transport_is_retried_by_the_outbox_after_a_5xx():
    body = {"notification_id": "n" * 26, "dedup_key": "n" * 26, "action": "resolve", "responder": "user:bob"}
    async with running("pagerduty", "fail_then_accept", follow) as (server, transport):
        first = await transport.send(FOLLOW_ROUTE, envelope(body))
        second = await transport.send(FOLLOW_ROUTE, envelope(body))
    assert (first.ok, first.error, second.ok) == (False, "HTTP 500", True)


def test_the_config_builds_the_channel_and_the_follow_transport(monkeypatch):
    monkeypatch.setenv("TEST_PD_KEY", ROUTING_KEY)
    config = PagerDutyConfig(routing_key=SecretRef(env="TEST_PD_KEY"), severity="error")
    channel, transport = config.build(), config.build_follow()
    assert (channel.routing_key, channel.severity, transport.routing_key) == (ROUTING_KEY, "error", ROUTING_KEY)
    assert ROUTING_KEY not in repr(channel) and ROUTING_KEY not in repr(transport)
    with pytest.raises(ValueError):
        PagerDutyConfig(routing_key=SecretRef(env="X"), severity="urgent")


@pytest.mark.parametrize("url", ["https://events.example/v2/enqueue\n", "ftp://events.example/v2", "not a url"])
def test_a_url_that_cannot_be_sent_to_is_refused_when_built(url, monkeypatch):
    monkeypatch.setenv("PD_ADV_KEY", ROUTING_KEY)
    config = PagerDutyConfig(routing_key=SecretRef(env="PD_ADV_KEY"), url=url)
    for build in (config.build, config.build_follow):
        with pytest.raises(ValueError, match="PagerDuty url") as caught:
            build()
        assert ROUTING_KEY not in str(caught.value)


async def test_a_delivery_with_links_carries_them_in_the_events_links_and_none_without():
    links = {"acked": "https://book.example.org/r/ACKtoken", "dismissed": "https://book.example.org/r/DIStoken"}
    channel = PagerDutyChannel(routing_key=ROUTING_KEY)
    plain = Delivery("n" * 26, "alice", {"text": "x"}, 1, 1, "pagerduty")
    event = channel.event(Delivery("n" * 26, "alice", {"text": "x"}, 1, 1, "pagerduty", links))
    assert event["links"] == [{"href": links["acked"], "text": "Acknowledge"},
                              {"href": links["dismissed"], "text": "Dismiss"}]
    assert "links" not in channel.event(plain) and {k: v for k, v in event.items() if k != "links"} == channel.event(plain)
