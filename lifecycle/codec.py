"""One JSON codec and one id helper for the whole package."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any


def dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, no NaN. Equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str | bytes | None) -> Any:
    return None if text is None else json.loads(text)


def new_id() -> str:
    """A 32-hex random id (a UUID4 without dashes)."""
    return uuid.uuid4().hex


def digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()
