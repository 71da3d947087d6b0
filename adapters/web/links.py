"""Response links: signed, expiring URLs that let a notification's recipient answer it without an account.

A link names one notification, its recipient, one action (``acked`` or ``dismissed``) and an expiry
(POSIX seconds). Those fields and an HMAC-SHA256 over them (keyed with ``[web] link_key``, domain-separated
by :data:`DOMAIN`) are packed into ONE base64url path segment, the token::

    <public_url>/r/<token>

The token is a bearer credential for that recipient and that action: it goes to the recipient's own channel
and nowhere else (never a log line, a fact or an operator's page). :meth:`LinkSigner.check` answers a token
with its :class:`Link`, or raises :class:`LinkRefused` whose ``reason`` is ``"tampered"`` (not ours: bad
encoding or signature) or ``"expired"``. Nothing here knows the web framework: the channels' composition
root uses it to make links, the responder pages to check them.

>>> from statebook.lifecycle.clock import FakeClock
>>> signer = LinkSigner(b"k" * 32, "https://book.example.org", FakeClock(1000.0))
>>> signer.check(signer.token("n1", "alice", "acked", expires=2000)).action
'acked'
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from statebook.lifecycle.clock import Clock
from statebook.outbox.notifications import LinkHook

__all__ = ["ACTIONS", "DOMAIN", "LINK_TTL_SECONDS", "Link", "LinkRefused", "LinkSigner", "link_hook"]

ACTIONS = ("acked", "dismissed")
"""What a link may answer: the response lifecycle's two human answers."""
DOMAIN = b"statebook-link-v1"
"""Prefixed to every signed message, so a MAC made for anything else under the same key is never a link's."""
VERSION = 1
LINK_TTL_SECONDS = 7 * 86_400.0
"""A link's life when its notification has no response deadline."""
MIN_KEY_BYTES = 16
MAC_BYTES = 32
MAX_TOKEN_CHARS = 4096


@dataclass(frozen=True)
class Link:
    """What a link says: which notification, for whom, which answer, valid until when (POSIX seconds)."""

    notification_id: str
    recipient: str
    action: str
    expires: int


class LinkRefused(Exception):
    """A token that is not a valid link: ``reason`` is ``"tampered"`` or ``"expired"``; ``link`` holds its
    fields when they could be decoded (for ``"tampered"`` they are unauthenticated: show, never act on)."""

    def __init__(self, reason: str, link: Link | None = None) -> None:
        super().__init__(f"the link is {reason}")
        self.reason = reason
        self.link = link


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or len(text) > MAX_TOKEN_CHARS or not text.isascii() or "=" in text:
        raise ValueError("not a token")
    # validate=True refuses characters outside the URL-safe alphabet instead of skipping them
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _payload(link: Link) -> bytes:
    return json.dumps([VERSION, link.notification_id, link.recipient, link.action, link.expires],
                      separators=(",", ":"), ensure_ascii=False).encode()


def _decoded(payload: bytes) -> Link | None:
    """The fields of ``payload``, or None when it is not a link's payload."""
    try:
        fields = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(fields, list) or len(fields) != 5 or fields[0] != VERSION:
        return None
    _, nid, recipient, action, expires = fields
    if not (isinstance(nid, str) and isinstance(recipient, str) and isinstance(action, str)
            and isinstance(expires, int) and not isinstance(expires, bool)):
        return None
    return Link(nid, recipient, action, expires)


class LinkSigner:
    """Makes and checks response links under one key (see the module docstring). ``clock``: the book's."""

    def __init__(self, key: bytes, public_url: str, clock: Clock, *, ttl_seconds: float = LINK_TTL_SECONDS) -> None:
        if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a link key is at least {MIN_KEY_BYTES} bytes (generate one: "
                             "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        if not public_url.startswith(("http://", "https://")):
            raise ValueError("public_url is the console's address as responders reach it: http(s)://host[:port][/path]")
        if not ttl_seconds > 0:
            raise ValueError("link_ttl_seconds is positive")
        self._key = key
        self.public_url = public_url.rstrip("/")
        self.clock = clock
        self.ttl_seconds = float(ttl_seconds)

    @classmethod
    def from_settings(cls, web: Any, clock: Clock) -> LinkSigner | None:
        """The signer ``[web]`` settings call for: None unless both ``public_url`` and ``link_key`` are set.
        The key is read from its secret reference once, here (``SecretError`` when it cannot be)."""
        public_url = getattr(web, "public_url", None)
        key_ref = getattr(web, "link_key", None)
        if not public_url or key_ref is None:
            return None
        return cls(key_ref.reveal().encode(), public_url, clock,
                   ttl_seconds=getattr(web, "link_ttl_seconds", LINK_TTL_SECONDS))

    def __repr__(self) -> str:
        return f"LinkSigner(public_url={self.public_url!r}, key=****)"

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, DOMAIN + b"\0" + payload, hashlib.sha256).digest()

    def token(self, notification_id: str, recipient: str, action: str, *, expires: float | None = None,
              due_at: float | None = None) -> str:
        """The token of a link; its expiry is ``expires``, else the response deadline ``due_at``, else the TTL
        from now."""
        if action not in ACTIONS:
            raise ValueError(f"a link answers {' or '.join(ACTIONS)}, not {action!r}")
        when = expires if expires is not None else due_at if due_at is not None else self.clock.now() + self.ttl_seconds
        payload = _payload(Link(notification_id, recipient, action, int(when)))
        return _b64(payload + self._mac(payload))

    def url(self, token: str) -> str:
        """The address a responder opens for ``token``."""
        return f"{self.public_url}/r/{token}"

    def links(self, notification_id: str, recipient: str, due_at: float | None = None) -> dict[str, str]:
        """Both links of one delivery, action -> URL: the hook the notification worker calls."""
        return {a: self.url(self.token(notification_id, recipient, a, due_at=due_at)) for a in ACTIONS}

    def check(self, token: str) -> Link:
        """The link ``token`` stands for; :class:`LinkRefused` when it is tampered with or expired."""
        try:
            raw = _unb64(token)
        except (ValueError, binascii.Error):
            raise LinkRefused("tampered") from None
        payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        link = _decoded(payload) if len(raw) > MAC_BYTES else None
        if link is None or not hmac.compare_digest(mac, self._mac(payload)) or link.action not in ACTIONS:
            raise LinkRefused("tampered", link)
        if self.clock.now() >= link.expires:
            raise LinkRefused("expired", link)
        return link


def link_hook(web: Any, clock: Clock) -> LinkHook | None:
    """The notification worker's link hook for ``[web]`` settings (None when links are not configured)."""
    signer = LinkSigner.from_settings(web, clock)
    return None if signer is None else signer.links
