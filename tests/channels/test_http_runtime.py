"""The HTTP channels through the real runtime on a SQLite book: a GUARANTEED notification whose Slack
answers 500 (UNKNOWN after its retries) and whose PagerDuty accepts — delivered by PagerDuty, both
observations recorded in fallback order, the incident keyed by the notification id."""

from __future__ import annotations

import pytest
from http_server import serve

from statebook.adapters.channels.pagerduty import PagerDutyChannel
from statebook.adapters.channels.slack import SlackChannel
from statebook.lifecycle import verify
from statebook.lifecycle.codec import loads
from statebook.outbox.notifications import deliver_due_notifications, get_notification, notification_attempts, send_notification

HOOK_TOKEN = "runtimeHOOKsecret0123456789"
ROUTING_KEY = "runtimeROUTINGkey0123456789"


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_guaranteed_notification_falls_back_from_a_failing_slack_to_pagerduty(book):
    async with serve("slack_webhook", "fail_then_accept", failures=99) as slack_server, \
            serve("pagerduty", "accept") as pd_server:
        slack = SlackChannel(webhook_url=f"{slack_server.url}/services/T/B/{HOOK_TOKEN}", max_tries=2, clock=book.clock)
        pagerduty = PagerDutyChannel(routing_key=ROUTING_KEY, url=f"{pd_server.url}/v2/enqueue", clock=book.clock)
        try:
            accepted = await send_notification(book, recipient="ops", content={"title": "disk full"},
                                               mode="guaranteed", channels=["pagerduty", "slack"])
            counts = await deliver_due_notifications(book, {"slack": slack, "pagerduty": pagerduty}, deadline=2.0)
        finally:
            await slack.aclose()
            await pagerduty.aclose()
    assert counts["delivered"] == 1, counts
    row = await get_notification(book, accepted.id)
    assert (row.status, row.delivered_channel) == ("delivered", "pagerduty")
    rows = await notification_attempts(book, accepted.id)
    assert [(a.channel, a.status, a.provider_retries, a.position) for a in rows] == [
        ("slack", "unknown", 1, 1), ("pagerduty", "success", 0, 2)]
    assert rows[0].detail.startswith("HTTP 500") and rows[0].started_at is not None
    assert [a.duplicate_risk for a in rows] == [False, True], "after an UNKNOWN, the next channel is a duplicate risk"
    assert slack_server.effects() == 2 and pd_server.effects() == 1
    assert loads(pd_server.received[0].body)["dedup_key"] == accepted.id
    text = repr(rows) + repr(row)
    assert HOOK_TOKEN not in text and ROUTING_KEY not in text
    for entity_type in ("notification", "channel_attempt"):
        assert (await verify(book, entity_type)).ok
