"""O10: only the whole, exact ack token acknowledges an ack-required dispatch (issue 9 section 5).

The spy in test_dispatch_ack.py shows that ``hmac.compare_digest`` is called; these tests show what
the check decides, through the public ``ack_dispatch`` with the row's real token, so a comparison
changed to accept a prefix (or anything but equality) fails here.
"""

from __future__ import annotations

import pytest

from statebook.outbox import AckRejected, ack_dispatch, enqueue_dispatch

from .support import facts, row


def _one_char_changed(token: str, at: int) -> str:
    return token[:at] + ("0" if token[at] != "0" else "1") + token[at + 1:]


async def _ack_required(book) -> tuple[str, str]:
    did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=True)
    token = (await row(book, did)).ack_token.get_secret_value()
    assert isinstance(token, str) and len(token) == 32
    return did, token


class AckTokenCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    @pytest.mark.parametrize("presented", [
        pytest.param(lambda t: "", id="empty"),
        pytest.param(lambda t: t[:1], id="prefix-1"),
        pytest.param(lambda t: t[:16], id="prefix-16"),
        pytest.param(lambda t: t[:-1], id="prefix-31"),
        pytest.param(lambda t: t + "0", id="token-plus-one"),
        pytest.param(lambda t: t[1:], id="suffix-31"),
        pytest.param(lambda t: _one_char_changed(t, 0), id="first-char-changed"),
        pytest.param(lambda t: _one_char_changed(t, 31), id="last-char-changed"),
        pytest.param(lambda t: t.upper() if t.upper() != t else t[::-1], id="other-case"),
        pytest.param(lambda t: " " + t, id="padded"),
    ])
    async def test_only_the_exact_token_acks(self, book, presented):
        """O10: an empty string, a prefix, an extension, a suffix, a token with one character changed or
        in another case is refused (AckRejected) and writes nothing; the row's own token then acks."""
        did, token = await _ack_required(book)
        wrong = presented(token)
        assert wrong != token
        before = await facts(book, did)
        with pytest.raises(AckRejected):
            await ack_dispatch(book, did, wrong)
        assert await facts(book, did) == before
        assert (await row(book, did)).status == "pending"

        assert await ack_dispatch(book, did, token) is True
        assert (await row(book, did)).status == "acked"
        assert [f.reason_code for f in await facts(book, did)][-1] == "dispatch.acked.consumer"

    async def test_one_dispatchs_token_does_not_ack_another(self, book):
        """O10: a real token of another ack-required dispatch is refused."""
        first, first_token = await _ack_required(book)
        second, second_token = await _ack_required(book)
        assert first_token != second_token
        with pytest.raises(AckRejected):
            await ack_dispatch(book, second, first_token)
        assert (await row(book, second)).status == "pending"
        assert await ack_dispatch(book, first, first_token) is True
