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


def loads_checked(text: str | bytes) -> Any:
    """JSON text from outside statebook (a file, the environment, a child process) by statebook's JSON
    rules (specs/lifecycle.md L20): integers within 64 bits, finite numbers only. Anything else raises
    ``ValueError`` naming the rule, the caller turns it into its own refusal. An integer of thousands of
    digits is refused by its length, before Python is asked to convert it.

    >>> loads_checked('{"n": 9223372036854775807}')
    {'n': 9223372036854775807}
    >>> loads_checked('[9223372036854775808]')
    Traceback (most recent call last):
    ValueError: an integer of 19 digits outside the 64-bit range JSON carries here
    """
    return json.loads(text, parse_int=_int64, parse_float=_finite, parse_constant=_no_constant)


_INT64 = (-(2**63), 2**63 - 1)


def _int64(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits <= 19:
        value = int(text)
        if _INT64[0] <= value <= _INT64[1]:
            return value
    raise ValueError(f"an integer of {digits} digits outside the 64-bit range JSON carries here")


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:
        raise ValueError(f"the number {text[:30]} is too large for a finite float")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (JSON carries finite numbers only)")


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
