"""Time, injected. Domain code never reads the wall clock directly.

A time is stored (and hashed) as POSIX seconds; the public API takes an aware ``datetime`` or seconds
(:func:`statebook.lifecycle.inputs.timestamp` checks and converts it) and gives an aware UTC ``datetime``
(:func:`utc`). The clock itself speaks seconds: it is the engine's port, not a value a user reads.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now()`` returning POSIX seconds (UTC) as a float."""

    def now(self) -> float:
        """The current time, in seconds since the epoch."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """The wall-clock time, ``time.time()``."""
        return time.time()


class FakeClock:
    """A clock that only moves when told to; for tests and simulations.

    >>> clock = FakeClock(1000.0)
    >>> clock.advance(5)
    1005.0
    """

    def __init__(self, start: datetime | float = 1_700_000_000.0) -> None:
        self._now = float(posix(start, "start"))

    def now(self) -> float:
        """The time this clock was set or advanced to."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time; raises ``ValueError`` for a negative step."""
        if seconds < 0:
            raise ValueError(f"a FakeClock only moves forward; got advance({seconds})")
        self._now += seconds
        return self._now

    def set(self, when: datetime | float) -> None:
        """Move to ``when`` (an aware ``datetime`` or POSIX seconds); raises ``ValueError`` when ``when`` is
        before the current time."""
        at = posix(when, "when")
        if at < self._now:
            raise ValueError(f"a FakeClock only moves forward; {when} is before {self._now}")
        self._now = float(at)


SYSTEM_CLOCK = SystemClock()


def utc(seconds: float) -> datetime:
    """Stored POSIX seconds as an aware UTC ``datetime`` (to the microsecond, as ``datetime`` holds it).

    >>> utc(0.5).isoformat()
    '1970-01-01T00:00:00.500000+00:00'
    """
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


NAIVE = "is a naive datetime (no tzinfo): local time or UTC would be a guess; add one, e.g. tzinfo=timezone.utc"
"""How a naive ``datetime`` is refused wherever a time goes in."""


def posix(moment: datetime | float, argument: str = "time") -> float:
    """POSIX seconds of an aware ``datetime``; a number is returned as given, so what a caller passing
    seconds had stored is stored still. A naive ``datetime`` is a ``ValueError`` naming ``argument``.

    >>> posix(datetime(1970, 1, 1, 0, 1, tzinfo=timezone.utc))
    60.0
    """
    if isinstance(moment, datetime):
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError(f"{argument}: {NAIVE}")
        return moment.timestamp()
    return moment
