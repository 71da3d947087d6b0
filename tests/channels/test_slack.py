"""Slack (webhook and chat.postMessage) against a real local server: the contract and Slack's answers."""

from __future__ import annotations


import pytest
from http_scenarios import http_scenario, running

from statebook.adapters.channels.contract import ChannelContract, RecordingGuard
from statebook.adapters.channels.secrets import SecretRef
from statebook.adapters.channels.slack import SlackChannel, SlackConfig
from statebook.lifecycle.codec import loads
from statebook.outbox.notifications import Delivery, ProviderOutcome

HOOK_TOKEN = "XXhookSECRETtoken0123456789"
BOT_TOKEN = "xoxb-111-222-botSECRETtoken"


def webhook(base: str) -> SlackChannel:
    return SlackChannel(webhook_url=f"{base}/services/T000/B000/{HOOK_TOKEN}")


def bot(base: str, **options) -> SlackChannel:
    return SlackChannel(bot_token=BOT_TOKEN, api_url=base, channel="C0", **options)


def delivery(content=None, recipient="alice") -> Delivery:
    return Delivery("n" * 26, recipient, content or {"title": "disk full", "body": "/var is at 97%"}, 1, 1, "slack")


class TestSlackWebhookContract(ChannelContract):
    deadline = 1.0

    def scenario(self, name):
        return http_scenario(name, "slack_webhook",
                             lambda base: (webhook(base), (HOOK_TOKEN, webhook(base).webhook_url)))


class TestSlackBotContract(ChannelContract):
    deadline = 1.0

    def scenario(self, name):
        return http_scenario(name, "slack_bot", lambda base: (bot(base), (BOT_TOKEN,)))


async def test_the_webhook_posts_the_notification_text():
    async with running("slack_webhook", "accept", webhook) as (server, channel):
        observed = await channel.send(delivery(), RecordingGuard(server.effects, 2.0))
    assert observed.outcome is ProviderOutcome.SUCCESS
    [got] = server.received
    assert got.path == f"/services/T000/B000/{HOOK_TOKEN}"
    assert loads(got.body) == {"text": "disk full\n/var is at 97%"}


async def test_the_bot_posts_to_the_recipients_channel_with_its_token():
    async with running("slack_bot", "accept", lambda b: bot(b, channels={"alice": "C-ALICE"})) as (server, channel):
        observed = await channel.send(delivery({"text": "hello"}), RecordingGuard(server.effects, 2.0))
        other = await channel.send(delivery({"text": "hi"}, recipient="bob"), RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, other.outcome) == (ProviderOutcome.SUCCESS, ProviderOutcome.SUCCESS)
    first, second = server.received
    assert first.path == "/chat.postMessage" and first.headers["Authorization"] == f"Bearer {BOT_TOKEN}"
    assert loads(first.body) == {"channel": "C-ALICE", "text": "hello"}
    assert loads(second.body) == {"channel": "C0", "text": "hi"}
    assert first.peer == second.peer, "one client per channel: the second call reuses the connection"


async def test_ok_false_is_rejected_with_slacks_error_code():
    async with running("slack_bot", "reject", bot) as (server, channel):
        observed = await channel.send(delivery(), RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, observed.detail) == (ProviderOutcome.REJECTED, "slack: channel_not_found")


async def test_ok_false_ratelimited_is_rate_limited():
    answer = (200, {"ok": False, "error": "ratelimited"})
    async with running("slack_bot", "accept", bot, answer=answer) as (server, channel):
        observed = await channel.send(delivery(), RecordingGuard(server.effects, 2.0))
    assert observed.outcome is ProviderOutcome.RATE_LIMITED


async def test_a_transient_slack_error_is_retried_behind_the_guard():
    fail = (200, {"ok": False, "error": "internal_error"})
    async with running("slack_bot", "fail_then_accept", bot, failures=2, fail_answer=fail) as (server, channel):
        guard = RecordingGuard(server.effects, 2.0)
        observed = await channel.send(delivery(), guard)
    assert (observed.outcome, observed.retries) == (ProviderOutcome.SUCCESS, 2)
    assert guard.events == [("admit", 0), ("guard", 1), ("guard", 2)]


async def test_a_2xx_that_is_not_slacks_json_is_unknown_not_retried():
    async with running("slack_bot", "accept", bot, answer=(200, "<html>proxy</html>")) as (server, channel):
        observed = await channel.send(delivery(), RecordingGuard(server.effects, 2.0))
    assert observed.outcome is ProviderOutcome.UNKNOWN and server.effects() == 1


async def test_a_recipient_without_a_channel_is_not_started_and_nothing_is_sent():
    async with running("slack_bot", "accept", lambda b: SlackChannel(bot_token=BOT_TOKEN, api_url=b,
                                                                     channels={"bob": "C1"})) as (server, channel):
        guard = RecordingGuard(server.effects, 2.0)
        observed = await channel.send(delivery(), guard)
    assert observed.outcome is ProviderOutcome.NOT_STARTED and not guard.admitted and server.effects() == 0


def test_the_config_reveals_its_secret_once_and_refuses_ambiguity(monkeypatch):
    monkeypatch.setenv("TEST_SLACK_HOOK", "https://hooks.slack.example/services/T/B/" + HOOK_TOKEN)
    channel = SlackConfig(webhook_url=SecretRef(env="TEST_SLACK_HOOK")).build()
    assert channel.webhook_url.endswith(HOOK_TOKEN) and HOOK_TOKEN not in repr(channel)
    with pytest.raises(ValueError, match="exactly one"):
        SlackConfig(webhook_url=SecretRef(env="A"), bot_token=SecretRef(env="B"))
    with pytest.raises(ValueError, match="needs a channel"):
        SlackConfig(bot_token=SecretRef(env="B"))
    with pytest.raises(ValueError, match="extra"):
        SlackConfig(webhook_url=SecretRef(env="A"), token="literal")


@pytest.mark.parametrize("section", [
    {"webhook_url": {"file": "hook"}},
    {"bot_token": {"file": "token"}, "channel": "C1"},
    {"bot_token": {"env": "SLACK_ADV_TOKEN"}, "channel": "C1", "api_url": "ftp://slack.example/api"},
])
def test_a_secret_that_cannot_be_sent_is_refused_when_built_without_showing_it(tmp_path, monkeypatch, section):
    """N43: a line break inside a secret file (or a URL httpx cannot send to) is an error at start, naming
    the setting and never the value; before, it passed and every send raised httpx's InvalidURL."""
    from statebook.adapters.errors import ConfigError
    from statebook.adapters.settings import load_settings

    (tmp_path / "hook").write_text(f"http://127.0.0.1:9/services/{HOOK_TOKEN}\nsecond line\n")
    (tmp_path / "token").write_text(f"{BOT_TOKEN}\n{BOT_TOKEN}\n")
    monkeypatch.setenv("SLACK_ADV_TOKEN", BOT_TOKEN)
    monkeypatch.chdir(tmp_path)
    config = SlackConfig.model_validate(section)
    with pytest.raises(ValueError, match="Slack") as caught:
        config.build()
    assert HOOK_TOKEN not in str(caught.value) and BOT_TOKEN not in str(caught.value)
    from statebook.adapters.channels.configure import build_channels

    with pytest.raises(ConfigError, match="notifications.slack"):
        build_channels(load_settings(None, notifications={"slack": section}).notifications)


def test_a_secret_file_that_never_ends_is_refused_by_its_size(tmp_path):
    """N43: a device or a huge file as the secret file: a bounded read and a one-line error (was an
    unbounded read: /dev/zero hung the daemon's start and ate memory)."""
    import os

    from statebook.adapters.channels.secrets import MAX_SECRET_BYTES, SecretError

    endless = "/dev/zero" if os.path.exists("/dev/zero") else None
    big = tmp_path / "big"
    big.write_bytes(b"x" * (10 * 1024 * 1024))
    for path in filter(None, (endless, big)):
        with pytest.raises(SecretError, match=f"larger than {MAX_SECRET_BYTES}"):
            SecretRef(file=path).reveal()


LINKS = {"acked": "https://book.example.org/r/ACKtoken0123", "dismissed": "https://book.example.org/r/DIStoken4567"}


def linked(content=None, recipient="alice") -> Delivery:
    return Delivery("n" * 26, recipient, content or {"text": "disk full"}, 1, 1, "slack", LINKS)


@pytest.mark.parametrize("kind", ["webhook", "bot"])
async def test_a_delivery_with_links_carries_url_buttons_the_interactive_endpoint_can_answer(kind):
    make = webhook if kind == "webhook" else bot
    async with running(f"slack_{kind}", "accept", make) as (server, channel):
        observed = await channel.send(linked(), RecordingGuard(server.effects, 2.0))
        plain = await channel.send(delivery({"text": "disk full"}), RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, plain.outcome) == (ProviderOutcome.SUCCESS, ProviderOutcome.SUCCESS)
    sent, unlinked = (loads(r.body) for r in server.received)
    assert sent["text"] == "disk full", "the text stays: notifications and old clients show it"
    section, actions = sent["blocks"]
    assert section["text"] == {"type": "plain_text", "text": "disk full"}
    assert [(b["action_id"], b["text"]["text"], b["url"], b["value"]) for b in actions["elements"]] == [
        ("ack", "Acknowledge", LINKS["acked"], "ACKtoken0123"), ("dismiss", "Dismiss", LINKS["dismissed"], "DIStoken4567")]
    assert "blocks" not in unlinked and "/r/" not in server.received[1].body.decode()
