"""The key of a keyed chain: bytes held outside the database, shown only by their id.

>>> key = ChainKey(b"a secret of at least 16 bytes")
>>> key                      # doctest: +ELLIPSIS
ChainKey(id=...)
>>> len(key.id)
16
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from .errors import InvalidArgument

MIN_KEY_BYTES = 16


@dataclass(frozen=True)
class ChainKey:
    """An HMAC key for the fact chain. Its ``repr`` and ``str`` name only its id, so a log line,
    an error or a report that shows the book never shows the key."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) < MIN_KEY_BYTES:
            raise InvalidArgument(
                f"a chain key needs at least {MIN_KEY_BYTES} bytes (e.g. `openssl rand -hex 32`)",
                argument="chain_key", rule="length")

    @property
    def id(self) -> str:
        """16 hex digits that name the key (an HMAC of a fixed text under it): the same key always gives the
        same id, and the id gives nothing of the key away. Recorded with the switch-over, shown in reports."""
        return hmac.digest(self.secret, b"statebook chain key id", "sha256").hex()[:16]

    def __repr__(self) -> str:
        return f"ChainKey(id={self.id})"

    __str__ = __repr__
