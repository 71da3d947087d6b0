"""The seed's outcome matrix (ADR-0059 D4/D5/D6), one test per row, on both backends."""

from __future__ import annotations

import sys

import pytest

from statebook.lifecycle import Actor, verify
from statebook.outbox import (
    AckRejected,
    ArgvTransport,
    ack_dispatch,
    deliver_due_dispatches,
    enqueue_dispatch,
    get_dispatch,
    purge_dispatch,
    retry_dispatch,
)
from statebook.outbox.dispatch.attempts import backoff_seconds

from .support import Recorder, facts, failing, moves, row

ZERO = {"attempted": 0, "delivered": 0, "dead_letter": 0, "expired": 0, "retried": 0}
CLAIM = ("pending", "delivering", "dispatch.delivering.attempt")


def counted(**kw: int) -> dict[str, int]:
    return {**ZERO, **kw}


class DispatchOutcomeCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_success_is_delivered(self, book):
        """O9, O11, O17: a send that succeeds moves delivering -> delivered (transport_ok) by system:delivery."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        rec = Recorder()
        assert await deliver_due_dispatches(book, transport=rec.transport) == counted(attempted=1, delivered=1)
        assert (await row(book, did)).status == "delivered"
        found = await facts(book, did)
        assert moves(found)[1:] == [CLAIM, ("delivering", "delivered", "dispatch.delivered.transport_ok")]
        assert {(f.actor_type, f.actor_id) for f in found[1:]} == {("system", "delivery")}
        assert (await verify(book, "dispatch")).ok

    async def test_failure_with_attempts_left_is_retried_after_backoff(self, book, clock):
        """O7, O9: a failure with attempts left returns to pending due at now + backoff(attempt) with
        last_error, in the same transition; the row is not sent again before that time."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        rec = Recorder(outcome=failing("disk on fire"))
        assert await deliver_due_dispatches(book, transport=rec.transport) == counted(attempted=1, retried=1)
        r = await row(book, did)
        assert (r.status, r.attempt, r.last_error) == ("pending", 1, "disk on fire")
        assert r.next_attempt_at.timestamp() == clock.now() + backoff_seconds(1) == clock.now() + 60
        clock.advance(59)
        assert await deliver_due_dispatches(book, transport=rec.transport) == ZERO
        clock.advance(1)
        assert (await deliver_due_dispatches(book, transport=rec.transport))["attempted"] == 1
        assert (await row(book, did)).next_attempt_at.timestamp() == clock.now() + 120
        assert len(rec.calls) == 2

    async def test_failure_at_the_bound_is_dead_lettered(self, book, clock):
        """O9: the failure of the last allowed attempt moves delivering -> dead_letter (max_attempts)
        with last_error; attempt never exceeds max_attempts and the row is not sent again."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=2)
        rec = Recorder(outcome=failing("nope"))
        await deliver_due_dispatches(book, transport=rec.transport)
        clock.advance(60)
        assert await deliver_due_dispatches(book, transport=rec.transport) == counted(attempted=1, dead_letter=1)
        r = await row(book, did)
        assert (r.status, r.attempt, r.last_error) == ("dead_letter", 2, "nope")
        assert moves(await facts(book, did))[-1] == ("delivering", "dead_letter", "dispatch.dead_letter.max_attempts")
        clock.advance(10_000)
        assert await deliver_due_dispatches(book, transport=rec.transport) == ZERO
        assert len(rec.calls) == 2

    async def test_a_slow_transport_is_killed_at_the_timeout_and_counts_as_a_failure(self, book, tmp_path):
        """O13, O9: a command running past the timeout is killed (it never reaches its next line), and
        the attempt is a failure whose last_error says timeout and whose fact records timed_out."""
        marker = tmp_path / "finished"
        script = tmp_path / "slow.py"
        script.write_text(f"import time, pathlib\ntime.sleep(30)\npathlib.Path({str(marker)!r}).write_text('late')\n")
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        transport = ArgvTransport([sys.executable, str(script), "{deliver_to}"], timeout=0.5)
        assert await deliver_due_dispatches(book, transport=transport) == counted(attempted=1, retried=1)
        r = await row(book, did)
        assert r.status == "pending" and r.last_error.startswith("timeout")
        assert (await facts(book, did))[-1].metadata == {"transport": {"timed_out": True}}
        assert not marker.exists()

    async def test_expiry_before_the_claim_wins(self, book, clock):
        """O6: a due row whose expires_at has passed becomes expired (deadline) and is never sent, even
        with attempts left."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", expires_at=clock.now() + 30)
        rec = Recorder(outcome=failing())
        await deliver_due_dispatches(book, transport=rec.transport)  # attempt 1 fails; due again at +60
        clock.advance(60)
        assert await deliver_due_dispatches(book, transport=rec.transport) == counted(expired=1)
        assert (await row(book, did)).status == "expired"
        assert moves(await facts(book, did))[-1] == ("pending", "expired", "dispatch.expired.deadline")
        assert len(rec.calls) == 1

    async def test_ack_required_success_waits_for_the_ack(self, book, clock):
        """O10: a successful send of an ack-required row returns it to pending (awaiting_ack) with the
        due time backed off in the same transition; it counts as delivered; unacked, it is resent."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=True)
        rec = Recorder()
        assert await deliver_due_dispatches(book, transport=rec.transport) == counted(attempted=1, delivered=1)
        r = await row(book, did)
        assert (r.status, r.attempt, r.next_attempt_at.timestamp()) == ("pending", 1, clock.now() + 60)
        last = (await facts(book, did))[-1]
        assert (last.reason_code, last.patch) == ("dispatch.pending.awaiting_ack", {"attempt": 1, "next_attempt_at": clock.now() + 60})
        clock.advance(60)
        await deliver_due_dispatches(book, transport=rec.transport)
        assert len(rec.calls) == 2

    async def test_the_right_token_acks(self, book):
        """O10: ack_dispatch with the row's token moves it to acked and it is never sent again."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=True)
        rec = Recorder()
        await deliver_due_dispatches(book, transport=rec.transport)
        token = (await row(book, did)).ack_token.get_secret_value()
        assert await ack_dispatch(book, did, token) is True
        assert (await row(book, did)).status == "acked"
        assert moves(await facts(book, did))[-1] == ("pending", "acked", "dispatch.acked.consumer")

    async def test_a_wrong_token_is_refused_and_writes_nothing(self, book):
        """O10: a wrong token raises ValueError (AckRejected) and leaves the row and its facts as they were."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=True)
        before = await facts(book, did)
        with pytest.raises(AckRejected, match="wrong acknowledgement token") as caught:
            await ack_dispatch(book, did, "0" * 32)
        assert isinstance(caught.value, ValueError)
        assert await facts(book, did) == before
        assert (await row(book, did)).status == "pending"

    async def test_no_ack_within_the_bound_dead_letters_with_ack_timeout(self, book, clock):
        """O10, O9: the last allowed send of an unacknowledged row ends in dead_letter (ack_timeout) in
        the same transition that records the send; no further sends."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=True, max_attempts=2)
        rec = Recorder()
        await deliver_due_dispatches(book, transport=rec.transport)
        clock.advance(60)
        assert await deliver_due_dispatches(book, transport=rec.transport) == counted(attempted=1, dead_letter=1)
        r = await row(book, did)
        assert (r.status, r.attempt) == ("dead_letter", 2) and "no acknowledgement" in r.last_error
        assert moves(await facts(book, did))[-1] == ("delivering", "dead_letter", "dispatch.dead_letter.ack_timeout")
        clock.advance(10_000)
        await deliver_due_dispatches(book, transport=rec.transport)
        assert len(rec.calls) == 2

    async def test_operator_retry_resets_a_dead_letter_in_one_transition(self, book, clock):
        """O15, O17: retry of a dead_letter row is one operator transition to pending with attempt 0,
        next_attempt_at now and last_error cleared; it is then delivered."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=1)
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing("bad")).transport)
        assert (await row(book, did)).status == "dead_letter"
        clock.advance(5)
        assert await retry_dispatch(book, did, actor=Actor("operator", "alice")) is True
        r = await row(book, did)
        assert (r.status, r.attempt, r.next_attempt_at.timestamp(), r.last_error) == ("pending", 0, clock.now(), None)
        last = (await facts(book, did))[-1]
        assert (last.previous_status, last.status, last.reason_code) == ("dead_letter", "pending", "dispatch.pending.operator_retry")
        assert last.patch == {"attempt": 0, "next_attempt_at": clock.now(), "last_error": None}
        assert (last.actor_type, last.actor_id) == ("operator", "alice")
        assert await deliver_due_dispatches(book, transport=Recorder().transport) == counted(attempted=1, delivered=1)

    async def test_purge_deletes_the_row_and_leaves_an_audited_tombstone(self, book):
        """O16, O17: purge removes the row and appends a tombstone fact by the operator; history stays
        and verifies; purging a missing row returns False."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        await deliver_due_dispatches(book, transport=Recorder().transport)
        assert await purge_dispatch(book, did, actor=Actor("operator", "bob")) is True
        assert await get_dispatch(book, did) is None
        found = await facts(book, did)
        assert (found[-1].previous_status, found[-1].status, found[-1].reason_code) == ("delivered", None, "dispatch.purged.operator")
        assert (found[-1].actor_type, found[-1].actor_id) == ("operator", "bob")
        assert (await verify(book, "dispatch")).ok
        assert await purge_dispatch(book, did) is False
