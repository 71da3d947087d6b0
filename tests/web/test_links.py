"""Response links (adapters/web/links.py): signed, expiring, refused when any field is changed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from statebook.adapters.channels.secrets import SecretRef
from statebook.adapters.web.links import (
    DOMAIN, LINK_TTL_SECONDS, Link, LinkRefused, LinkSigner, link_hook,
)
from statebook.lifecycle.clock import FakeClock

KEY = b"link-KEY-0123456789abcdef-SECRET"
URL = "https://book.example.org/console"
NOW = 1_800_000_000.0


def signer(key: bytes = KEY, clock: FakeClock | None = None) -> LinkSigner:
    return LinkSigner(key, URL, clock or FakeClock(NOW))


def unpack(token: str) -> tuple[list, bytes]:
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    return json.loads(raw[:-32]), raw[-32:]


def pack(fields: list, mac: bytes) -> str:
    payload = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(payload + mac).rstrip(b"=").decode()


def test_a_link_round_trips_its_fields():
    s = signer()
    token = s.token("n" * 26, "alice@example.org", "acked", expires=NOW + 60)
    assert s.check(token) == Link("n" * 26, "alice@example.org", "acked", int(NOW + 60))
    assert s.url(token) == f"{URL}/r/{token}"
    assert "/" not in token and "=" not in token and "+" not in token, "one URL-safe path segment, no padding"


def test_the_expiry_is_the_deadline_else_the_ttl():
    s = signer()
    assert s.check(s.token("n1", "alice", "dismissed", due_at=NOW + 90)).expires == int(NOW + 90)
    assert s.check(s.token("n1", "alice", "dismissed")).expires == int(NOW + LINK_TTL_SECONDS)


def test_links_gives_both_actions_for_the_worker():
    s = signer()
    made = s.links("n1", "alice", None)
    assert set(made) == {"acked", "dismissed"}
    assert [s.check(u.rsplit("/", 1)[1]).action for u in (made["acked"], made["dismissed"])] == ["acked", "dismissed"]


@pytest.mark.parametrize("field, value", [(1, "n2"), (2, "mallory"), (3, "dismissed"), (4, int(NOW + 10**6))],
                         ids=["id", "recipient", "action", "expiry"])
def test_changing_any_field_is_refused_as_tampered(field, value):
    s = signer()
    fields, mac = unpack(s.token("n1", "alice", "acked", expires=NOW + 60))
    fields[field] = value
    with pytest.raises(LinkRefused) as refused:
        s.check(pack(fields, mac))
    assert refused.value.reason == "tampered"
    assert refused.value.link is not None and refused.value.link.action in ("acked", "dismissed")


def test_a_changed_signature_is_refused():
    s = signer()
    fields, mac = unpack(s.token("n1", "alice", "acked", expires=NOW + 60))
    for flipped in (bytes([mac[0] ^ 1]) + mac[1:], mac[:-1], b"", b"\0" * 32):
        with pytest.raises(LinkRefused, match="tampered"):
            s.check(pack(fields, flipped))


@pytest.mark.parametrize("token", ["", "not a token", "=", "a" * 5000, "é" * 10, "AAAA", "Zm9v", "!!!!"])
def test_garbage_is_tampered(token):
    with pytest.raises(LinkRefused) as refused:
        signer().check(token)
    assert refused.value.reason == "tampered"


def test_a_link_signed_by_another_key_is_tampered():
    token = signer(b"another-key-0123456789abcdef").token("n1", "alice", "acked", expires=NOW + 60)
    with pytest.raises(LinkRefused, match="tampered"):
        signer().check(token)


def test_a_mac_without_the_domain_prefix_is_not_a_link():
    fields = [1, "n1", "alice", "acked", int(NOW + 60)]
    payload = json.dumps(fields, separators=(",", ":")).encode()
    with pytest.raises(LinkRefused, match="tampered"):
        signer().check(pack(fields, hmac.new(KEY, payload, hashlib.sha256).digest()))
    assert DOMAIN.startswith(b"statebook-link")


def test_an_expired_link_is_refused_with_its_fields():
    clock = FakeClock(NOW)
    s = signer(clock=clock)
    token = s.token("n1", "alice", "acked", expires=NOW + 60)
    clock.advance(59.5)
    assert s.check(token).notification_id == "n1"
    clock.advance(0.5)
    with pytest.raises(LinkRefused) as refused:
        s.check(token)
    assert (refused.value.reason, refused.value.link) == ("expired", Link("n1", "alice", "acked", int(NOW + 60)))


def test_the_token_never_holds_the_key():
    s = signer()
    for action in ("acked", "dismissed"):
        token = s.token("n1", "alice", action, expires=NOW + 60)
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        assert KEY not in raw and KEY.decode() not in token and KEY.decode() not in s.url(token)
    assert KEY.decode() not in repr(s) and KEY.decode() not in str(s)


def test_a_short_key_an_unknown_action_and_a_bad_url_are_refused():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        LinkSigner(b"short", URL, FakeClock())
    with pytest.raises(ValueError, match="acked or dismissed"):
        signer().token("n1", "alice", "purged")
    with pytest.raises(ValueError, match="public_url"):
        LinkSigner(KEY, "book.example.org", FakeClock())


class Web:
    def __init__(self, **values):
        self.public_url, self.link_key, self.link_ttl_seconds = None, None, LINK_TTL_SECONDS
        self.__dict__.update(values)


def test_the_signer_comes_from_settings_only_with_a_public_url_and_a_key(monkeypatch):
    monkeypatch.setenv("TEST_LINK_KEY", KEY.decode())
    ref = SecretRef(env="TEST_LINK_KEY")
    assert LinkSigner.from_settings(None, FakeClock()) is None
    assert LinkSigner.from_settings(Web(public_url=URL), FakeClock()) is None
    assert link_hook(Web(link_key=ref), FakeClock()) is None
    made = LinkSigner.from_settings(Web(public_url=URL + "/", link_key=ref, link_ttl_seconds=60), FakeClock(NOW))
    assert made is not None and made.public_url == URL and made.ttl_seconds == 60
    hook = link_hook(Web(public_url=URL, link_key=ref), FakeClock(NOW))
    assert set(hook("n1", "alice", None)) == {"acked", "dismissed"}


def test_the_daemon_gives_its_worker_a_hook_only_when_links_are_configured(monkeypatch):
    from statebook.adapters.daemon import response_links
    from statebook.adapters.errors import ConfigError
    from statebook.adapters.settings import Settings

    class Book:
        clock = FakeClock(NOW)

    assert response_links(Settings(), Book()) is None
    monkeypatch.setenv("TEST_LINK_KEY", KEY.decode())
    settings = Settings(web={"public_url": URL, "link_key": {"env": "TEST_LINK_KEY"}})
    hook = response_links(settings, Book())
    made = hook("n1", "alice", NOW + 60)
    assert LinkSigner(KEY, URL, FakeClock(NOW)).check(made["acked"].rsplit("/", 1)[1]).expires == int(NOW + 60)
    monkeypatch.delenv("TEST_LINK_KEY")
    with pytest.raises(ConfigError, match=r"\[web\] link_key: the environment variable TEST_LINK_KEY is not set"):
        response_links(settings, Book())
    monkeypatch.setenv("TEST_LINK_KEY", "short")
    with pytest.raises(ConfigError, match="at least 16 bytes") as refused:
        response_links(settings, Book())
    assert "short" not in str(refused.value)
