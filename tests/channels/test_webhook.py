"""The signed webhook against a real local server: the contract, the signature (checked by an
independent HMAC computation), the idempotency key, and verify_signature."""

from __future__ import annotations

import hashlib
import hmac

from http_scenarios import http_scenario, running

from statebook.adapters.channels.contract import ChannelContract, RecordingGuard
from statebook.adapters.channels.secrets import SecretRef
from statebook.adapters.channels.webhook import WebhookChannel, WebhookConfig, sign, verify_signature
from statebook.lifecycle import FakeClock
from statebook.lifecycle.codec import loads
from statebook.outbox.notifications import Delivery, ProviderOutcome

SECRET = "whsecSIGNINGsecret0123456789"
URL_TOKEN = "urlTOKENsecret9876543210"


def webhook(base: str, **options) -> WebhookChannel:
    return WebhookChannel(url=f"{base}/hooks/{URL_TOKEN}", secret=SECRET, **options)


class TestWebhookContract(ChannelContract):
    deadline = 1.0

    def scenario(self, name):
        return http_scenario(name, "webhook", lambda base: (webhook(base), (SECRET, URL_TOKEN)))


def independent_signature(secret: str, timestamp: str, body: bytes) -> str:
    return "v1=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


async def test_each_try_is_signed_and_carries_the_same_idempotency_key():
    clock = FakeClock(1_800_000_000.0)
    d = Delivery("n" * 26, "alice", {"title": "disk full"}, 3, 2, "webhook")
    async with running("webhook", "fail_then_accept", lambda b: webhook(b, clock=clock)) as (server, channel):
        observed = await channel.send(d, RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, observed.retries) == (ProviderOutcome.SUCCESS, 1)
    for got in server.received:
        assert got.path == f"/hooks/{URL_TOKEN}"
        assert loads(got.body) == {"notification_id": "n" * 26, "recipient": "alice", "content": {"title": "disk full"},
                                   "cycle": 3, "attempt": 2}
        assert got.headers["X-Statebook-Timestamp"] == "1800000000"
        expected = independent_signature(SECRET, got.headers["X-Statebook-Timestamp"], got.body)
        assert hmac.compare_digest(got.headers["X-Statebook-Signature"], expected)
        assert got.headers["Idempotency-Key"] == f"{'n' * 26}:3"
        assert got.headers["Content-Type"] == "application/json"
        assert verify_signature(SECRET, got.headers["X-Statebook-Timestamp"], got.body,
                                got.headers["X-Statebook-Signature"], now=clock.now())


async def test_a_4xx_is_rejected():
    d = Delivery("n" * 26, "alice", {"text": "x"}, 1, 1, "webhook")
    async with running("webhook", "reject", webhook) as (server, channel):
        observed = await channel.send(d, RecordingGuard(server.effects, 2.0))
    assert (observed.outcome, observed.detail) == (ProviderOutcome.REJECTED, "HTTP 422: unprocessable")


def test_verify_signature():
    body, stamp = b'{"a":1}', "1800000000"
    good = independent_signature(SECRET, stamp, body)
    assert sign(SECRET, stamp, body) == good
    assert verify_signature(SECRET, stamp, body, good, now=1_800_000_100.0)
    assert verify_signature(SECRET, int(stamp), body.decode(), f"v1=00, {good}", now=1_800_000_000.0)  # rotation
    assert not verify_signature(SECRET, stamp, body + b" ", good, now=1_800_000_000.0)       # body changed
    assert not verify_signature("other", stamp, body, good, now=1_800_000_000.0)             # wrong secret
    assert not verify_signature(SECRET, "1800000001", body, good, now=1_800_000_000.0)       # timestamp changed
    assert not verify_signature(SECRET, stamp, body, good, now=1_800_000_301.0)              # too old
    assert not verify_signature(SECRET, stamp, body, good, now=1_800_000_000.0 - 301)        # too far ahead
    assert verify_signature(SECRET, stamp, body, good, now=1_800_000_301.0, tolerance=400)
    assert not verify_signature(SECRET, "soon", body, good, now=1_800_000_000.0)
    assert not verify_signature(SECRET, stamp, body, good.upper(), now=1_800_000_000.0)


def test_the_config_reads_both_secrets(monkeypatch, tmp_path):
    (tmp_path / "secret").write_text(SECRET + "\n")
    monkeypatch.setenv("TEST_HOOK_URL", f"https://hooks.example/{URL_TOKEN}")
    channel = WebhookConfig(url=SecretRef(env="TEST_HOOK_URL"), secret=SecretRef(file=tmp_path / "secret")).build()
    assert (channel.secret, channel.url, channel.persistent) == (SECRET, f"https://hooks.example/{URL_TOKEN}", True)
    assert SECRET not in repr(channel) and URL_TOKEN not in repr(channel)


def test_a_url_secret_with_a_line_break_is_refused_when_built_without_showing_it(tmp_path):
    """N43: the URL is a secret; one httpx cannot send to is an error at start, never shown."""
    import pytest

    (tmp_path / "url").write_text("http://127.0.0.1:9/hook?token=urlSECRETtoken0123\nsecond\n")
    (tmp_path / "key").write_text("signingSECRET0123456789")
    config = WebhookConfig(url=SecretRef(file=tmp_path / "url"), secret=SecretRef(file=tmp_path / "key"))
    with pytest.raises(ValueError, match="webhook url") as caught:
        config.build()
    assert "urlSECRETtoken" not in str(caught.value)


async def test_a_delivery_with_links_carries_them_in_the_signed_body():
    links = {"acked": "https://book.example.org/r/ACKtoken", "dismissed": "https://book.example.org/r/DIStoken"}
    d = Delivery("n" * 26, "alice", {"text": "x"}, 1, 1, "webhook", links)
    async with running("webhook", "accept", webhook) as (server, channel):
        observed = await channel.send(d, RecordingGuard(server.effects, 2.0))
    assert observed.outcome is ProviderOutcome.SUCCESS
    [got] = server.received
    assert loads(got.body)["links"] == links
    assert verify_signature(SECRET, got.headers["X-Statebook-Timestamp"], got.body, got.headers["X-Statebook-Signature"],
                            now=float(got.headers["X-Statebook-Timestamp"]))
    assert "links" not in loads(WebhookChannel.body(Delivery("n" * 26, "alice", {"text": "x"}, 1, 1, "webhook")))
