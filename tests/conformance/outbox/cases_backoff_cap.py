"""O9: the 1,800 s backoff cap — in the helper and in what finalization writes (issue 9 section 5).

The expected values are spelled out here (``min(30 * 2**a, 1800)``), not taken from the helper, so a
change to the helper or to the finalization's use of it fails.
"""

from __future__ import annotations


from statebook.lifecycle import verify
from statebook.outbox import deliver_due_dispatches, enqueue_dispatch

from .support import Recorder, facts, failing, row

CAP = 1800.0


class BackoffCapCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_a_failure_at_a_high_attempt_is_due_again_after_exactly_1800_seconds(self, book, clock):
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
            assert (r.status, r.attempt, r.next_attempt_at.timestamp()) == ("pending", attempt, expected)
            assert (await facts(book, did))[-1].patch["next_attempt_at"] == expected
            if attempt >= 6:
                assert r.next_attempt_at.timestamp() == now + 1800
            clock.set(expected - 1)
            assert (await deliver_due_dispatches(book, transport=rec.transport))["attempted"] == 0
            clock.set(expected)
        assert len(rec.calls) == 11
        assert (await verify(book, "dispatch")).ok
