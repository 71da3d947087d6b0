"""Signed session cookies: who is signed in, until when, and the CSRF secret of the session.

A cookie is ``base64url(json).base64url(hmac_sha256(key, "statebook-session-v1." + json))``; nothing in
it is secret (the name, the role, the expiry, a random CSRF secret), but nothing in it can be changed
without the key. Every browser gets a session on its first page, signed in or not, so the sign-in form
itself carries a CSRF token (login CSRF); signing in or out replaces the session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, replace
from typing import Any

COOKIE = "statebook_session"
DOMAIN = b"statebook-session-v1."


@dataclass(frozen=True)
class Session:
    """What a session cookie holds: who (None: anonymous), until when, and its CSRF secret."""

    user: str | None
    role: str | None
    expires: float
    csrf: str

    @classmethod
    def anonymous(cls, now: float, seconds: float) -> Session:
        """A session nobody is signed in to, valid ``seconds`` from ``now``."""
        return cls(None, None, now + seconds, secrets.token_urlsafe(24))

    def signed_in(self, user: str, role: str, now: float, seconds: float) -> Session:
        """A new session for ``user``: new CSRF secret, new expiry (the old cookie's token stops working)."""
        return replace(self, user=user, role=role, expires=now + seconds, csrf=secrets.token_urlsafe(24))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(session: Session, key: bytes) -> str:
    """The cookie value of ``session`` signed with ``key``."""
    body = json.dumps({"u": session.user, "r": session.role, "e": session.expires, "c": session.csrf},
                      separators=(",", ":"), sort_keys=True).encode()
    return f"{_b64(body)}.{_b64(hmac.new(key, DOMAIN + body, hashlib.sha256).digest())}"


def decode(cookie: str | None, key: bytes, now: float) -> Session | None:
    """The session in ``cookie``, or None when it is absent, malformed, forged or expired."""
    if not cookie or cookie.count(".") != 1 or len(cookie) > 4096:
        return None
    body_text, mac_text = cookie.split(".")
    try:
        body, mac = _unb64(body_text), _unb64(mac_text)
    except (ValueError, TypeError):
        return None
    if not hmac.compare_digest(mac, hmac.new(key, DOMAIN + body, hashlib.sha256).digest()):
        return None
    try:
        data: Any = json.loads(body)
        session = Session(data["u"], data["r"], float(data["e"]), str(data["c"]))
    except (ValueError, KeyError, TypeError):
        return None
    return session if session.expires > now else None
