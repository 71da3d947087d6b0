"""One JSON codec and one id helper for the whole package."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable
from typing import Any

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, no NaN. Equal values give equal text."""
    return _CANONICAL.encode(value)


def loads(text: str | bytes | None) -> Any:
    """Decode JSON text (``None`` stays ``None``); raises ``ValueError`` on malformed JSON."""
    return None if text is None else json.loads(text)


_TREE = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
)
dumps_tree: Callable[[Any], str] = _TREE.encode
""":func:`dumps` without the cycle check, for values that cannot hold a cycle (decoded JSON, a row's
values): the same text, a little faster for callers that encode many values."""


def new_id() -> str:
    """A 32-hex random id: 128 bits from the OS's CSPRNG (the same source as uuid4, without
    building a UUID object — ids are drawn several times per transition)."""
    return os.urandom(16).hex()


def digest(*parts: str) -> str:
    """SHA-256 (hex) of the parts, each followed by ``\\x1f``, as UTF-8."""
    text = "\x1f".join(parts)
    return hashlib.sha256((f"{text}\x1f" if parts else text).encode()).hexdigest()


def keyed_digest(key: bytes, *parts: str) -> str:
    """HMAC-SHA256 (hex) under ``key`` of the bytes :func:`digest` hashes: without the key no one can
    compute it, so a fact hashed this way cannot be forged by someone who can only write the database."""
    text = "\x1f".join(parts)
    return hmac.digest(key, (f"{text}\x1f" if parts else text).encode(), "sha256").hex()
