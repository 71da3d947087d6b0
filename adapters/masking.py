"""Secret masking for every text statebook shows: CLI errors and log records alike.

It lives beside the edges that print, not in the CLI, so logging can mask without importing the command line.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "mask"]

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@")
_SECRET_PARAM = re.compile(r"(?P<head>[?&;\s](?:password|passwd|pwd|token|secret|api_key|ack_token)=)[^\s&;'\"]+",
                           re.IGNORECASE)
MASK = "***"


def mask(message: str) -> str:
    """``message`` with URL passwords and ``token=``-style values replaced by ``***``.

    >>> mask("cannot reach postgresql://ann:s3cret@db/x")
    'cannot reach postgresql://ann:***@db/x'
    """
    message = _URL_PASSWORD.sub(lambda m: m["head"] + MASK + "@", message)
    return _SECRET_PARAM.sub(lambda m: m["head"] + MASK, message)
