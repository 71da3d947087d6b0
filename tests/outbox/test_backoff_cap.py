"""O9: the 1,800 s backoff cap — in the helper and in what finalization writes (issue 9 section 5).

The expected values are spelled out here (``min(30 * 2**a, 1800)``), not taken from the helper, so a
change to the helper or to the finalization's use of it fails.
"""

from __future__ import annotations

import pytest

from statebook.lifecycle import verify
from statebook.outbox import backoff_seconds, deliver_due_dispatches, enqueue_dispatch

from dispatch_support import Recorder, facts, failing, row

CAP = 1800.0


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


async def test_a_failure_at_a_high_attempt_is_due_again_after_exactly_1800_seconds(book, clock):
    """O9, O7: driven through claim and finalize, the failure of attempt ``a`` writes
    ``next_attempt_at = now + min(30 * 2**a, 1800)`` in its one outcome fact — exactly now + 1800 from
    attempt 6 on (attempts 6..11 here) — and the row is not due a moment earlier."""
    did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=12)
    rec = Recorder(outcome=failing("down"))
    for attempt in range(1, 12):
        now = clock.now()
        counts = await deliver_due_dispatches(book, transport=rec.transport)
        assert counts["retried"] == 1, attempt
        r = await row(book, did)
        expected = now + min(30.0 * 2**attempt, CAP)
        assert (r["status"], r["attempt"], r["next_attempt_at"]) == ("pending", attempt, expected)
        assert (await facts(book, did))[-1].patch["next_attempt_at"] == expected
        if attempt >= 6:
            assert r["next_attempt_at"] == now + 1800
        clock.set(expected - 1)
        assert (await deliver_due_dispatches(book, transport=rec.transport))["attempted"] == 0
        clock.set(expected)
    assert len(rec.calls) == 11
    assert (await verify(book, "dispatch")).ok
