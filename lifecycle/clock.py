"""Time, injected. Domain code never reads the wall clock directly."""

from __future__ import annotations

import time
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

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        """The time this clock was set or advanced to."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time; raises ``ValueError`` for a negative step."""
        if seconds < 0:
            raise ValueError(f"a FakeClock only moves forward; got advance({seconds})")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        """Move to ``when``; raises ``ValueError`` when ``when`` is before the current time."""
        if when < self._now:
            raise ValueError(f"a FakeClock only moves forward; {when} is before {self._now}")
        self._now = float(when)


SYSTEM_CLOCK = SystemClock()
