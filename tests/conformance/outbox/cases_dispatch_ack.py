"""The acknowledgement tier beyond the outcome matrix: idempotent acks, races, refusals."""

from __future__ import annotations

import pytest

import statebook.outbox.dispatch.ack as ack_module
from statebook.lifecycle import Actor, StatebookError, TransitionRejected
from statebook.outbox import (
    AckRejected,
    TransportResult,
    ack_dispatch,
    deliver_due_dispatches,
    enqueue_dispatch,
)
from statebook.outbox.dispatch.attempts import scan
from statebook.outbox.dispatch.steps import claim, execute, finalize

from .support import Recorder, facts, failing, moves, row


class DispatchAckCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_a_repeated_correct_ack_succeeds_without_a_second_fact(self, book):
        """O10 (do-better 7): acking an acked row with the right token returns True and writes nothing;
        a wrong token on an acked row is still refused."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", ack_required=True)
        token = (await row(book, did)).ack_token.get_secret_value()
        assert await ack_dispatch(book, did, token, actor=Actor("consumer", "seat-1")) is True
        before = await facts(book, did)
        assert await ack_dispatch(book, did, token) is True
        assert await facts(book, did) == before
        assert (before[-1].actor_type, before[-1].actor_id) == ("consumer", "seat-1")
        with pytest.raises(AckRejected):
            await ack_dispatch(book, did, token[::-1])

    async def test_tokens_are_compared_in_constant_time(self, book, monkeypatch):
        """O10 (do-better 7): the token check goes through hmac.compare_digest."""
        seen: list[tuple[bytes, bytes]] = []
        real = ack_module.hmac.compare_digest

        def spy(a, b):
            seen.append((a, b))
            return real(a, b)

        monkeypatch.setattr(ack_module.hmac, "compare_digest", spy)
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", ack_required=True)
        token = (await row(book, did)).ack_token.get_secret_value()
        with pytest.raises(AckRejected):
            await ack_dispatch(book, did, "f" * 32)
        assert await ack_dispatch(book, did, token)
        assert seen == [(token.encode(), b"f" * 32), (token.encode(), token.encode())]

    async def test_refusals_name_the_problem(self, book):
        """O10: a missing row is a LookupError; a row without an ack request and a wrong token are
        ValueErrors (and StatebookErrors); none writes a fact."""
        with pytest.raises(LookupError):
            await ack_dispatch(book, "0" * 32, "x")
        plain = await enqueue_dispatch(book, kind="k", deliver_to="r")
        with pytest.raises(AckRejected, match="did not request") as caught:
            await ack_dispatch(book, plain, "x")
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, StatebookError)
        assert len(await facts(book, plain)) == 1

    async def test_an_ack_during_a_send_wins_and_the_late_finalization_conflicts(self, book, clock):
        """O10, O8: a consumer acks while the row is delivering; the sender's finalization then
        conflicts and writes nothing — the row stays acked."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", ack_required=True)
        [c] = await scan(book, now=clock.now())
        lease = await claim(book, c, now=clock.now())
        result = await execute(lease, Recorder().transport)
        assert await ack_dispatch(book, did, (await row(book, did)).ack_token.get_secret_value()) is True
        assert await finalize(book, lease, result, now=clock.now()) == "conflict"
        assert (await row(book, did)).status == "acked"
        assert moves(await facts(book, did))[-1] == ("delivering", "acked", "dispatch.acked.consumer")

    async def test_a_dead_lettered_row_cannot_be_acked(self, book):
        """O10: after the bound the row left the ack tier: an ack is refused (TransitionRejected) and
        writes nothing; an operator retry is the way back."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", ack_required=True, max_attempts=1)
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing()).transport)
        assert (await row(book, did)).status == "dead_letter"
        with pytest.raises(TransitionRejected, match="dead_letter"):
            await ack_dispatch(book, did, (await row(book, did)).ack_token.get_secret_value())
        assert len(await facts(book, did)) == 3

    async def test_finalize_evidence_lands_in_the_fact_metadata(self, book, clock):
        """O9: what a transport observed (its evidence) is recorded on the outcome fact."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r")
        [c] = await scan(book, now=clock.now())
        lease = await claim(book, c, now=clock.now())
        result = TransportResult(True, None, {"channel": "slack", "provider_id": "abc"})
        assert await finalize(book, lease, result, now=clock.now()) == "delivered"
        assert (await facts(book, did))[-1].metadata == {"transport": {"channel": "slack", "provider_id": "abc"}}
