"""Atomic outcomes under crashes between steps, and fencing of stale ("zombie") leases.

The pipeline steps are called one by one; a crash is simply never calling the remaining steps (or
rolling back the transaction a step ran in). Afterwards the row must be recoverable: due at a
finite time, never a pending row left with the claim lease as its due time.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from statebook.adapters.db import connect
from statebook.lifecycle import Book, verify
from statebook.outbox import TransportResult, deliver_due_dispatches, enqueue_dispatch, retry_dispatch
from statebook.outbox.dispatch.attempts import CLAIM_LEASE_SECONDS, backoff_seconds, scan
from statebook.outbox.dispatch.steps import claim, execute, finalize

from .support import Recorder, facts, failing, moves, row


class Crash(Exception):
    """Stands for the process dying: whatever transaction is open rolls back."""


CRASH_POINTS = ["after_scan", "after_claim", "after_execute", "inside_finalize", "after_finalize"]
OUTCOMES = {
    "success": (False, TransportResult(True)),
    "failure": (False, TransportResult(False, "refused")),
    "ack_success": (True, TransportResult(True)),
}


async def _run_until(book: Book, clock, crash: str, result: TransportResult) -> None:
    now = clock.now()
    [candidate] = await scan(book, now=now)
    if crash == "after_scan":
        return
    lease = await claim(book, candidate, now=now)
    assert lease is not None
    if crash == "after_claim":
        return
    rec = Recorder(outcome=lambda _to, _n: result)
    assert await execute(lease, rec.transport) == result
    if crash == "after_execute":
        return
    if crash == "inside_finalize":
        with pytest.raises(Crash):
            async with book.begin() as tx:
                assert await finalize(tx, lease, result, now=now) != "conflict"
                raise Crash
        return
    await finalize(book, lease, result, now=now)


class DispatchAtomicityCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    @pytest.mark.parametrize("outcome", list(OUTCOMES))
    @pytest.mark.parametrize("crash", CRASH_POINTS)
    async def test_a_crash_between_any_two_steps_leaves_a_recoverable_row(self, book, clock, crash, outcome):
        """O7 (do-better 1), O5: after a crash at any point the row is either untouched and due, or
        delivering until the claim lease, or fully finalized — a live row always has a finite due
        time, and a pending row after an attempt is due at the full backoff, never at the lease. After
        the lease lapses a later pass finishes the row; the history verifies."""
        ack_required, result = OUTCOMES[outcome]
        t0 = clock.now()
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=ack_required)
        await _run_until(book, clock, crash, result)

        r = await row(book, did)
        assert math.isfinite(r.next_attempt_at.timestamp())
        if crash == "after_scan":
            assert (r.status, r.attempt, r.next_attempt_at.timestamp()) == ("pending", 0, t0)
        elif crash in ("after_claim", "after_execute", "inside_finalize"):
            assert (r.status, r.attempt, r.next_attempt_at.timestamp()) == ("delivering", 1, t0 + CLAIM_LEASE_SECONDS)
            assert r.last_error is None
        else:
            expected = {"success": "delivered", "failure": "pending", "ack_success": "pending"}[outcome]
            assert r.status == expected
            if expected == "pending":
                assert r.next_attempt_at.timestamp() == t0 + backoff_seconds(1)
                assert r.last_error == ("refused" if outcome == "failure" else None)

        clock.advance(CLAIM_LEASE_SECONDS if crash != "after_finalize" else backoff_seconds(1))
        rec = Recorder()
        await deliver_due_dispatches(book, transport=rec.transport)
        final = await row(book, did)
        if outcome == "success" and crash == "after_finalize":
            assert rec.calls == [] and final.status == "delivered"
        elif ack_required:
            assert final.status == "pending" and len(rec.calls) == 1
        else:
            assert final.status == "delivered" and len(rec.calls) == 1
        reasons = [m[2] for m in moves(await facts(book, did))]
        if crash in ("after_claim", "after_execute", "inside_finalize"):
            assert "dispatch.delivering.reclaimed" in reasons
        assert (await verify(book, "dispatch")).ok

    async def test_a_failure_is_one_fact_carrying_status_attempt_due_time_and_error(self, book, clock):
        """O7 (do-better 1): the failure outcome is a single fact delivering -> pending whose patch holds
        attempt, next_attempt_at and last_error together — no second fact updates the due time or the
        error. Same for the dead letter at the bound."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=2)
        rec = Recorder(outcome=failing("refused"))
        await deliver_due_dispatches(book, transport=rec.transport)
        found = await facts(book, did)
        assert len(found) == 3
        fail = found[-1]
        assert (fail.previous_status, fail.status) == ("delivering", "pending")
        assert fail.patch == {"attempt": 1, "next_attempt_at": clock.now() + 60, "last_error": "refused"}
        clock.advance(60)
        await deliver_due_dispatches(book, transport=rec.transport)
        found = await facts(book, did)
        assert len(found) == 5
        assert (found[-1].status, found[-1].patch) == ("dead_letter", {"attempt": 2, "last_error": "refused"})

    async def test_a_zombie_finalization_after_a_reclaim_is_a_conflict(self, book, clock):
        """O8, O5: claimant A's lease lapses and B reclaims attempt 2; A's late finalization conflicts
        and writes nothing; B's applies."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        [c] = await scan(book, now=clock.now())
        a = await claim(book, c, now=clock.now())
        clock.advance(CLAIM_LEASE_SECONDS)
        [c2] = await scan(book, now=clock.now())
        b = await claim(book, c2, now=clock.now())
        assert a is not None and b is not None and (a.attempt, b.attempt) == (1, 2)
        before = await facts(book, did)
        assert await finalize(book, a, TransportResult(False, "late"), now=clock.now()) == "conflict"
        assert await facts(book, did) == before
        assert await finalize(book, b, TransportResult(True), now=clock.now()) == "delivered"
        assert (await row(book, did)).status == "delivered"

    async def test_a_stale_lease_cannot_settle_an_attempt_of_a_later_retry(self, book, clock):
        """O8: after an operator retry restarts the attempt count, a new claim of attempt 1 at the very
        same instant is not settled by the old attempt-1 lease: the claim id fences it."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=1)
        [c] = await scan(book, now=clock.now())
        old = await claim(book, c, now=clock.now())
        assert await finalize(book, old, TransportResult(False, "x"), now=clock.now()) == "dead_letter"
        assert await retry_dispatch(book, did) is True
        [c] = await scan(book, now=clock.now())
        new = await claim(book, c, now=clock.now())
        assert (new.attempt, new.lease_until) == (old.attempt, old.lease_until)
        assert await finalize(book, old, TransportResult(False, "stale"), now=clock.now()) == "conflict"
        assert (await row(book, did)).status == "delivering"
        assert await finalize(book, new, TransportResult(True), now=clock.now()) == "delivered"

    async def test_only_one_of_two_claimants_wins_an_attempt(self, book, db_url, clock):
        """O5: two claimants (separate engines, so separate connections) claim the same scanned
        candidate: exactly one gets a lease; a stale candidate cannot be claimed afterwards."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        other = Book(connect(db_url), book.registry, clock)
        try:
            [c] = await scan(book, now=clock.now())
            got = await asyncio.gather(claim(book, c, now=clock.now()), claim(other, c, now=clock.now()))
            assert sum(lease is not None for lease in got) == 1
            assert await claim(book, c, now=clock.now()) is None
            assert [m for m in moves(await facts(book, did)) if m[1] == "delivering"] == [
                ("pending", "delivering", "dispatch.delivering.attempt")
            ]
        finally:
            await other.engine.dispose()

    async def test_a_lapsed_lease_on_the_last_attempt_is_dead_lettered_not_resent(self, book, clock):
        """O5, O9: when the lease of the last allowed attempt lapses (the claimant died), the next pass
        dead-letters the row (max_attempts) instead of exceeding the bound."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=1)
        [c] = await scan(book, now=clock.now())
        assert await claim(book, c, now=clock.now()) is not None
        clock.advance(CLAIM_LEASE_SECONDS)
        rec = Recorder()
        counts = await deliver_due_dispatches(book, transport=rec.transport)
        assert counts["dead_letter"] == 1 and counts["attempted"] == 0 and rec.calls == []
        r = await row(book, did)
        assert (r.status, r.attempt) == ("dead_letter", 1) and "lapsed" in r.last_error

    async def test_an_expired_row_with_a_lapsed_lease_expires_instead_of_being_reclaimed(self, book, clock):
        """O6: expiry wins over reclaiming a lapsed lease."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", expires_at=clock.now() + 10)
        [c] = await scan(book, now=clock.now())
        await claim(book, c, now=clock.now())
        clock.advance(CLAIM_LEASE_SECONDS)
        rec = Recorder()
        assert (await deliver_due_dispatches(book, transport=rec.transport))["expired"] == 1
        assert (await row(book, did)).status == "expired" and rec.calls == []
