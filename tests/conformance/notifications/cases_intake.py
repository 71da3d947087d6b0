"""Notifications, intake (specs/notifications.md N1, N9): modes, channel order, one creation, bad input writes nothing."""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa

from statebook.lifecycle import Book, history, replay, verify
from statebook.lifecycle.facts import facts_table
from statebook.outbox.notifications import (
    Mode, NotificationInvalid, get_notification, list_notifications, notification_attempts, notifications,
    send_notification,
)


async def written(book: Book) -> tuple[int, int]:
    """(notification rows, notification facts): what "nothing was written" compares."""
    async with book.read() as conn:
        rows = (await conn.execute(sa.select(sa.func.count()).select_from(notifications))).scalar()
        facts = (await conn.execute(sa.select(sa.func.count()).select_from(facts_table)
                                    .where(facts_table.c.entity_type == "notification"))).scalar()
    return rows, facts


class NotificationIntakeCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_a_guaranteed_notification_needs_a_persistent_channel(self, book: Book):
        """N1: GUARANTEED with WebSocket alone is refused (nothing written) and names BEST_EFFORT; the same
        selection with mode BEST_EFFORT, or GUARANTEED with a persistent channel too, is accepted."""
        with pytest.raises(NotificationInvalid, match="best_effort") as refused:
            await send_notification(book, recipient="r", content={"text": "x"}, mode="guaranteed",
                                    channels=["websocket"])
        assert (refused.value.argument, refused.value.rule) == ("mode", "mode")
        assert await written(book) == (0, 0)
        ephemeral = await send_notification(book, recipient="r", content={"text": "x"}, mode=Mode.BEST_EFFORT,
                                            channels=["websocket"])
        both = await send_notification(book, recipient="r", content={"text": "x"}, mode="GUARANTEED",
                                       channels=["websocket", "email"])
        assert (ephemeral.mode, ephemeral.channels) == ("best_effort", ("websocket",))
        assert (both.mode, both.channels) == ("guaranteed", ("email", "websocket"))
        assert await written(book) == (2, 2)

    async def test_selected_channels_run_in_slack_email_pagerduty_order(self, book: Book):
        """N1: whatever order the caller gives, an attempt runs Slack, email, PagerDuty, then WebSocket."""
        accepted = await send_notification(book, recipient="r", content={}, mode="guaranteed",
                                           channels=["pagerduty", "websocket", "slack", "email"])
        assert accepted.channels == ("slack", "email", "pagerduty", "websocket")
        row = await get_notification(book, accepted.id)
        assert row is not None and row.channels == list(accepted.channels)

    async def test_intake_is_one_creation_with_its_fact(self, book: Book, clock):
        """N9 / L6 / L7: an accepted notification is one row and one fact, pending and due now (the
        injected clock), at cycle 1 with no attempt used, no dead letter; the row is the fold of its facts."""
        accepted = await send_notification(book, recipient="ops", content={"text": "disk full", "n": 3},
                                           mode="guaranteed", channels=["email"])
        assert (accepted.status, accepted.created) == ("pending", True)
        row = await get_notification(book, accepted.id)
        assert row is not None
        assert {k: getattr(row, k) for k in ("status", "recipient", "content", "mode", "cycle", "attempts", "cycle_attempts",
                                    "max_cycle_attempts", "dead_letter", "claim_id", "lease_until")} == {
            "status": "pending", "recipient": "ops", "content": {"text": "disk full", "n": 3}, "mode": "guaranteed",
            "cycle": 1, "attempts": 0, "cycle_attempts": 0, "max_cycle_attempts": 3, "dead_letter": False,
            "claim_id": None, "lease_until": None}
        assert row.next_attempt_at.timestamp() == row.created_at.timestamp() == clock.now()
        [fact] = await history(book, "notification", accepted.id)
        assert (fact.previous_status, fact.status, fact.reason_code, fact.at) == (
            None, "pending", "notification.pending.accepted", clock.now())
        folded = await replay(book, "notification", accepted.id)
        async with book.read() as conn:
            raw = dict((await conn.execute(sa.select(notifications).where(notifications.c.id == accepted.id))).one()._mapping)
        assert folded == raw
        assert (await verify(book, "notification")).ok
        assert await notification_attempts(book, accepted.id) == []

    @pytest.mark.parametrize("change, argument", [
        ({"channels": []}, "channels"),
        ({"channels": "email"}, "channels"),
        ({"channels": ["email", "email"]}, "channels"),
        ({"channels": ["fax"]}, "channels"),
        ({"channels": [1]}, "channels"),
        ({"mode": "sometimes"}, "mode"),
        ({"mode": None}, "mode"),
        ({"content": "text"}, "content"),
        ({"content": {"x": math.nan}}, "content"),
        ({"content": {"x": "\udc80"}}, "content"),
        ({"recipient": ""}, "recipient"),
        ({"recipient": "   "}, "recipient"),
        ({"recipient": 7}, "recipient"),
        ({"recipient": "r" * 256}, "recipient"),
        ({"recipient": "a\x00b"}, "recipient"),
    ])
    async def test_bad_arguments_are_refused_and_write_nothing(self, book: Book, change, argument):
        """N1 (O22's rules): each bad argument is a NotificationInvalid naming it; nothing is written."""
        args = {"recipient": "r", "content": {"text": "x"}, "mode": "guaranteed", "channels": ["email"], **change}
        with pytest.raises(NotificationInvalid) as refused:
            await send_notification(book, **args)
        assert refused.value.argument == argument
        assert isinstance(refused.value, ValueError)
        assert await written(book) == (0, 0)

    async def test_an_intake_in_a_rolled_back_transaction_leaves_nothing(self, book: Book):
        """N1: a bound book accepts inside the caller's transaction; its rollback takes the row and fact."""
        with pytest.raises(RuntimeError):
            async with book.begin() as tx:
                await send_notification(tx, recipient="r", content={}, mode="guaranteed", channels=["slack"])
                raise RuntimeError("the caller's work failed")
        assert await written(book) == (0, 0)

    async def test_listing_is_newest_first_and_filters(self, book: Book, clock):
        """N1: list_notifications orders by acceptance time then id, newest first, filters by status and
        dead letter, and refuses an unknown status; get_notification of an unknown id is None."""
        ids = []
        for n in range(3):
            ids.append((await send_notification(book, recipient=f"r{n}", content={}, mode="guaranteed",
                                                channels=["email"])).id)
            clock.advance(1)
        assert [r.id for r in await list_notifications(book)] == ids[::-1]
        assert [r.id for r in await list_notifications(book, limit=2)] == ids[:0:-1]
        assert len(await list_notifications(book, status="pending")) == 3
        assert await list_notifications(book, status="delivered") == []
        assert await list_notifications(book, dead_letter=True) == []
        assert len(await list_notifications(book, dead_letter=False)) == 3
        with pytest.raises(NotificationInvalid, match="unknown status"):
            await list_notifications(book, status="lost")
        with pytest.raises(NotificationInvalid):
            await list_notifications(book, limit=0)
        assert await get_notification(book, "0" * 32) is None
