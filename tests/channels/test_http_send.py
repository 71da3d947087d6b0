"""The guarded HTTP send (adapters/channels/http.py) against real misbehaving servers: one test per fault,
admission at the request headers, guard exceptions, deadlines, Retry-After, no secret in a detail."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time

import pytest
from http_scenarios import running
from http_server import closed_port, serve, unreachable

from statebook.adapters.channels.contract import SLACK_SECONDS, RecordingGuard
from statebook.adapters.channels.http import parse_retry_after, text_of
from statebook.adapters.channels.slack import SlackChannel
from statebook.lifecycle import FakeClock
from statebook.outbox.notifications import Delivery, LeaseLost, NoToken, ProviderOutcome

TOKEN = "hookSECRET0123456789abcdef"
DEADLINE = 0.6


def hook(base: str, **options) -> SlackChannel:
    return SlackChannel(webhook_url=f"{base}/services/T/B/{TOKEN}", **options)


DELIVERY = Delivery("n" * 26, "alice", {"text": "disk full"}, 1, 1, "slack")


async def call(channel, guard):
    started = time.monotonic()
    observed = await channel.send(DELIVERY, guard)
    assert time.monotonic() - started <= DEADLINE + SLACK_SECONDS, "the call outlived its deadline"
    assert TOKEN not in (observed.detail or ""), observed
    return observed


async def test_n_5xx_then_accept_is_success_with_a_guard_before_each_retry():
    async with running("slack_webhook", "fail_then_accept", hook, failures=2) as (server, channel):
        guard = RecordingGuard(server.effects, 2.0)
        observed = await call(channel, guard)
    assert (observed.outcome, observed.retries, server.effects()) == (ProviderOutcome.SUCCESS, 2, 3)
    assert guard.events == [("admit", 0), ("guard", 1), ("guard", 2)]


async def test_5xx_until_the_tries_run_out_is_unknown():
    async with running("slack_webhook", "fail_then_accept", lambda b: hook(b, max_tries=3), failures=99) as (server, channel):
        observed = await call(channel, RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, observed.retries, server.effects()) == (ProviderOutcome.UNKNOWN, 2, 3)
    assert observed.detail.startswith("HTTP 500"), observed


async def test_a_503_until_the_deadline_is_unknown_within_the_deadline():
    async with running("slack_webhook", "fail_then_accept", lambda b: hook(b, max_tries=10), failures=99,
                       fail_answer=(503, "busy")) as (server, channel):
        observed = await call(channel, RecordingGuard(server.effects, DEADLINE))
    assert observed.outcome is ProviderOutcome.UNKNOWN and server.effects() >= 2


@pytest.mark.parametrize("behaviour", ["slow", "hang_after_body"])
async def test_no_answer_within_the_deadline_is_unknown(behaviour):
    async with running("slack_webhook", behaviour, hook, delay=DEADLINE * 4) as (server, channel):
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await call(channel, guard)
        assert (observed.outcome, server.effects(), guard.events) == (ProviderOutcome.UNKNOWN, 1, [("admit", 0)])
        server.release()


async def test_a_reset_after_the_body_is_retried_then_unknown():
    async with running("slack_webhook", "reset_after_body", lambda b: hook(b, max_tries=2)) as (server, channel):
        observed = await call(channel, RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, observed.retries, server.effects()) == (ProviderOutcome.UNKNOWN, 1, 2)
    assert "after the request was sent" in observed.detail


async def test_a_reset_then_an_answer_is_success_with_one_retry():
    async with running("slack_webhook", "reset_then_accept", hook) as (server, channel):
        observed = await call(channel, RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, observed.retries, server.effects()) == (ProviderOutcome.SUCCESS, 1, 2)


async def test_a_connect_that_never_completes_is_not_started_with_no_admission():
    with unreachable() as base:
        channel = hook(base)
        guard = RecordingGuard(lambda: 0, DEADLINE)
        try:
            observed = await call(channel, guard)
        finally:
            await channel.aclose()
    assert observed.outcome is ProviderOutcome.NOT_STARTED and guard.events == [], (observed, guard.events)


async def test_a_refused_connect_is_not_started_with_no_admission():
    channel = hook(closed_port(), max_tries=2)
    guard = RecordingGuard(lambda: 0, DEADLINE)
    try:
        observed = await call(channel, guard)
    finally:
        await channel.aclose()
    assert (observed.outcome, guard.events) == (ProviderOutcome.NOT_STARTED, [])
    assert observed.detail.startswith("ConnectError before the request was sent"), observed


async def test_no_token_raised_at_the_headers_propagates_and_nothing_is_sent():
    async with running("slack_webhook", "accept", hook) as (server, channel):
        with pytest.raises(NoToken):
            await channel.send(DELIVERY, RecordingGuard(server.effects, 2.0, no_token=True))
        await asyncio.sleep(0.05)
        assert server.effects() == 0
        again = await call(channel, RecordingGuard(server.effects, 2.0))  # the client is still usable
        assert again.outcome is ProviderOutcome.SUCCESS and server.effects() == 1


async def test_a_lease_lost_at_the_retry_propagates_and_the_retry_is_not_sent():
    async with running("slack_webhook", "fail_then_accept", hook, failures=1) as (server, channel):
        with pytest.raises(LeaseLost):
            await channel.send(DELIVERY, RecordingGuard(server.effects, 2.0, lose_at=2))
        await asyncio.sleep(0.05)
        assert server.effects() == 1


async def test_a_429_carries_retry_after_in_seconds_or_as_an_http_date():
    clock = FakeClock(1_800_000_000.0)
    date = email.utils.formatdate(clock.now() + 90, usegmt=True)
    for header, expected in (("7", 7.0), (date, 90.0), (None, None), ("soon", None)):
        async with running("slack_webhook", "rate_limited", lambda b: hook(b, clock=clock),
                           retry_after=header) as (server, channel):
            observed = await call(channel, RecordingGuard(server.effects, 2.0))
        assert (observed.outcome, observed.retry_after) == (ProviderOutcome.RATE_LIMITED, expected), header


def test_retry_after_parsing():
    now = 1_800_000_000.0
    assert parse_retry_after("120", now=now) == 120.0
    assert parse_retry_after(" 0 ", now=now) == 0.0
    assert parse_retry_after(email.utils.formatdate(now + 30.0, usegmt=True), now=now) == 30.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 0.0  # in the past: no wait
    for bad in (None, "", "-5", "1.5", "tomorrow", "Wed, 21 Oct 2015 07:28:00"):
        assert parse_retry_after(bad, now=now) is None, bad


def test_the_message_text():
    assert text_of({"text": "a", "title": "b"}) == "a"
    assert text_of({"title": "disk full", "body": "/var"}) == "disk full\n/var"
    assert text_of({"body": "only"}) == "only"
    assert text_of({"n": 1}) == '{"n":1}'


async def test_httpx_request_logs_never_show_the_secret_url(caplog):
    caplog.set_level(logging.DEBUG)
    async with serve("slack_webhook", "accept") as server:
        channel = hook(server.url)
        try:
            await call(channel, RecordingGuard(server.effects, 2.0))
        finally:
            await channel.aclose()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(("httpx", "httpcore"))]
    assert any("HTTP Request: POST" in line for line in lines), lines
    assert not [line for line in lines if TOKEN in line]


async def test_a_cut_inside_the_admission_is_left_to_the_runtime_to_judge():
    """The deadline ends while admit() is still writing: only the runtime knows whether its started fact
    committed, so the send raises TimeoutError (judged by the runtime) rather than guessing; nothing left."""

    class SlowAdmission(RecordingGuard):
        async def admit(self) -> None:
            await asyncio.sleep(DEADLINE * 3)

    async with running("slack_webhook", "accept", hook) as (server, channel):
        with pytest.raises(TimeoutError):
            await channel.send(DELIVERY, SlowAdmission(server.effects, DEADLINE))
        await asyncio.sleep(0.05)
        assert server.effects() == 0
