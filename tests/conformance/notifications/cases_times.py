"""L20a, N30: retention's cutoff takes an aware datetime or POSIX seconds and records the seconds; the read
models give every time back as an aware UTC datetime, on every backend."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from statebook.lifecycle import Book, verify
from statebook.outbox.notifications import (
    NotificationInvalid, apply_notification_retention, get_notification, notification_attempts,
)

from .cases_retention import DAY, HORIZON, fact_count, one_pass, runs, send

NEW_YORK = timezone(timedelta(hours=-5), "EST")


class NotificationTimeCases:
    """Mixed into NotificationConformance: each backend runs them (tests/conformance)."""

    async def test_a_retention_cutoff_as_a_datetime_acts_and_records_as_its_seconds(self, book: Book, clock):
        """L20a, N30: a dry run before an aware datetime and one before its seconds find the same notifications
        and record the same cutoff (seconds); the notification's and its attempt's times are aware UTC and equal
        to the clock's seconds they were written at."""
        accepted = await send(book)
        sent_at = clock.now()
        await one_pass(book, ["success"])
        notification = await get_notification(book, accepted.id)
        assert notification.created_at.tzinfo == timezone.utc and notification.created_at.timestamp() == sent_at
        [attempt] = await notification_attempts(book, accepted.id)
        assert attempt.made_at == notification.created_at and attempt.lease_until.tzinfo == timezone.utc
        clock.advance(30 * DAY)
        cutoff = datetime.fromtimestamp(clock.now() - HORIZON, NEW_YORK)
        by_moment = await apply_notification_retention(book, before=cutoff, horizon=HORIZON, dry_run=True)
        by_seconds = await apply_notification_retention(book, before=cutoff.timestamp(), horizon=HORIZON,
                                                        dry_run=True)
        assert by_moment.notifications == by_seconds.notifications == (accepted.id,)
        assert [r["cutoff"] for r in await runs(book)] == [cutoff.timestamp()] * 2
        assert (await verify(book)).ok

    @pytest.mark.parametrize("before,rule", [
        pytest.param(datetime(2026, 12, 5, 19, 30), "naive", id="naive"),
        pytest.param(True, "type", id="bool"),
    ])
    async def test_a_retention_cutoff_that_is_not_a_time_writes_nothing(self, book: Book, clock, before, rule):
        """L20a, N30: a naive datetime (rule ``naive``, saying to add a tzinfo) or a bool as ``before`` is one
        NotificationInvalid naming it; no run is recorded, no fact written."""
        await send(book)
        clock.advance(30 * DAY)
        facts = await fact_count(book)
        with pytest.raises(NotificationInvalid) as refused:
            await apply_notification_retention(book, before=before, horizon=HORIZON)
        assert (refused.value.argument, refused.value.rule) == ("before", rule)
        assert rule != "naive" or "tzinfo" in str(refused.value)
        assert await runs(book) == [] and await fact_count(book) == facts
