"""O9: the 1,800 s backoff cap — in the helper and in what finalization writes (issue 9 section 5).

The expected values are spelled out here (``min(30 * 2**a, 1800)``), not taken from the helper, so a
change to the helper or to the finalization's use of it fails.
"""

from __future__ import annotations

import pytest

from statebook.outbox.dispatch.attempts import backoff_seconds

from conformance.outbox.cases_backoff_cap import CAP


def test_backoff_doubles_then_stops_at_exactly_1800_seconds():
    """O9: 60, 120, 240, 480, 960 after attempts 1..5, then exactly 1800 for every later attempt;
    the sequence never decreases and never exceeds the cap."""
    assert [backoff_seconds(a) for a in range(1, 8)] == [60.0, 120.0, 240.0, 480.0, 960.0, 1800.0, 1800.0]
    delays = [backoff_seconds(a) for a in range(0, 400)]
    assert all(a <= b for a, b in zip(delays, delays[1:]))
    assert max(delays) == CAP
    for attempt in (6, 7, 10, 11, 31, 64, 100, 1000, 10**6):
        assert backoff_seconds(attempt) == CAP, attempt
    assert [backoff_seconds(a) for a in range(0, 6)] == [30.0 * 2**a for a in range(0, 6)]


@pytest.mark.parametrize("attempt", [1, 5, 6, 12])
def test_backoff_is_a_float_of_seconds(attempt):
    """O9: the delay is seconds as a float, so the due time it makes is ``now + delay`` exactly."""
    value = backoff_seconds(attempt)
    assert isinstance(value, float) and value == min(30.0 * 2**attempt, CAP)
