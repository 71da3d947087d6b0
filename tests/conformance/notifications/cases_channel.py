"""Notifications, what real channels need of the runtime (specs/notifications.md N40-N45): a configurable
fallback order, a provider's Retry-After holding the fleet's bucket, and provider incidents that follow
the human's answer through the dispatch outbox."""

from __future__ import annotations

import pytest

from statebook.lifecycle import Actor, Book, history, verify
from statebook.outbox.notifications import (
    NotificationInvalid, ack_notification, dismiss_notification, ensure_bucket, get_notification,
    notification_attempts, send_notification,
)
from statebook.outbox.notifications.buckets import hold
from statebook.outbox.notifications.responses import follow_ups
from statebook.outbox.notifications.buckets import draw
from statebook.outbox.notifications.attempts import backoff_seconds
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.scripted import ScriptedChannel

DEADLINE = 2.0
ALICE = Actor("operator", "alice")
WEBHOOK_FIRST = ("webhook", "slack", "email", "pagerduty", "apprise")


async def accept(book: Book, channels: list[str], **kwargs) -> str:
    kwargs.setdefault("mode", "guaranteed")
    return (await send_notification(book, recipient="ops", content={"text": "disk full"}, channels=channels,
                                    **kwargs)).id


def adapters(**scripts: list) -> dict[str, ScriptedChannel]:
    return {name: ScriptedChannel(name, script) for name, script in scripts.items()}


async def run(book: Book, chans, **kwargs) -> dict[str, int]:
    return await deliver_due_notifications(book, chans, deadline=DEADLINE, **kwargs)


async def draw_now(book: Book, channel: str, now: float) -> float:
    async with book.begin() as tx:
        return await draw(tx, channel, "all", now=now)


class NotificationChannelCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_the_fallback_order_is_the_deployment_s(self, book: Book):
        """N40: a webhook placed first in the order runs before Slack and email; the stored selection is
        unchanged and the history shows the observations in the order they ran."""
        nid = await accept(book, ["slack", "email", "webhook"])
        chans = adapters(slack=["success"], email=["success"], webhook=["reject"])
        assert (await run(book, chans, order=WEBHOOK_FIRST))["delivered"] == 1
        seen = [(a.channel, a.status, a.position) for a in await notification_attempts(book, nid)]
        assert [c for c, _, _ in seen] == ["webhook", "slack"], seen
        assert chans["email"].calls == 0
        assert (await get_notification(book, nid)).delivered_channel == "slack"

    async def test_an_order_that_is_not_a_permutation_of_the_persistent_channels_is_refused(self, book: Book):
        """N40: an order that leaves a persistent channel out, repeats one or names another is refused
        before anything is claimed."""
        nid = await accept(book, ["slack"])
        for order in (("slack", "email"), ("slack", "slack", "email", "pagerduty", "webhook"),
                      ("slack", "email", "pagerduty", "webhook", "websocket")):
            with pytest.raises(NotificationInvalid, match="fallback order"):
                await run(book, adapters(slack=["success"]), order=order)
        assert (await get_notification(book, nid)).status == "pending"
        assert (await get_notification(book, nid)).claim_id is None

    async def test_a_provider_retry_after_holds_the_bucket_for_every_worker(self, book: Book, clock):
        """N42: a provider's 429 with Retry-After empties the channel's bucket so that its next token
        comes exactly then — another notification finds no token (rate_limited, its budget unused) —
        and the refused notification retries no sooner than the provider asked."""
        await ensure_bucket(book, "slack", "all", capacity=10, refill_per_second=1.0)
        first = await accept(book, ["slack"])
        chans = adapters(slack=["limited"])  # admits, then 429 with Retry-After 5 s
        assert (await run(book, chans))["retried"] == 1
        t0 = clock.now()
        row = await get_notification(book, first)
        assert row.next_attempt_at.timestamp() == pytest.approx(t0 + 5.0) and 5.0 > backoff_seconds(1)
        codes = [f.reason_code for f in await history(book, "rate_bucket", "slack:all")]
        assert codes[-1] == "rate_bucket.open.held"
        second = await accept(book, ["slack"])
        assert (await run(book, adapters(slack=["success"])))["rate_limited"] == 1
        held = await get_notification(book, second)
        assert (held.status, held.next_attempt_at.timestamp()) == ("rate_limited", pytest.approx(t0 + 5.0))
        assert await draw_now(book, "slack", t0 + 4.9) == pytest.approx(0.1)
        assert await draw_now(book, "slack", t0 + 5.0) == 0.0
        assert (await verify(book, "rate_bucket")).ok

    async def test_without_a_bucket_the_retry_still_waits_what_the_provider_asked(self, book: Book, clock):
        """N42: no bucket is configured for the channel: nothing is held, the retry waits the Retry-After."""
        nid = await accept(book, ["email"])
        assert (await run(book, adapters(email=["limited"])))["retried"] == 1
        assert (await get_notification(book, nid)).next_attempt_at.timestamp() == pytest.approx(clock.now() + 5.0)
        assert await history(book, "rate_bucket", "email:all") == []

    async def test_a_shorter_hold_never_shortens_a_longer_one(self, book: Book, clock):
        """N42: holds only lengthen the wait: a 2 s Retry-After after a 10 s one writes nothing."""
        await ensure_bucket(book, "pagerduty", "all", capacity=3, refill_per_second=0.5)
        now = clock.now()
        async with book.begin() as tx:
            assert await hold(tx, "pagerduty", "all", seconds=10.0, now=now) is True
        async with book.begin() as tx:
            assert await hold(tx, "pagerduty", "all", seconds=2.0, now=now) is False
        assert await draw_now(book, "pagerduty", now) == pytest.approx(10.0)
        async with book.begin() as tx:
            assert await hold(tx, "webhook", "all", seconds=2.0, now=now) is False  # no bucket: no limit
        with pytest.raises(NotificationInvalid):
            async with book.begin() as tx:
                await hold(tx, "pagerduty", "all", seconds=-1.0, now=now)

    async def test_an_answer_makes_the_pagerduty_incident_follow_the_human(self, book: Book):
        """N45: acknowledging a notification PagerDuty was sent enqueues ONE ``follow:pagerduty``
        acknowledge dispatch keyed by the notification (PagerDuty's dedup_key); asking again adds none;
        a dismissal resolves; a notification PagerDuty never saw has no follow-up."""
        paged = await accept(book, ["slack", "pagerduty"], response_timeout=600)
        dismissed = await accept(book, ["pagerduty"], response_timeout=600)
        quiet = await accept(book, ["slack"], response_timeout=600)
        chans = adapters(slack=[lambda d: "reject" if d.notification_id != quiet else "success"],
                         pagerduty=["success"])
        assert (await run(book, chans))["delivered"] == 3
        await ack_notification(book, paged, actor=ALICE)
        await ack_notification(book, paged, actor=ALICE)  # the same answer again: nothing new
        await dismiss_notification(book, dismissed, actor=ALICE, note="false alarm")
        await ack_notification(book, quiet, actor=ALICE)
        [ack] = await follow_ups(book, paged)
        assert (ack.deliver_to, ack.dedup_key, ack.status) == ("follow:pagerduty", f"follow:pagerduty:{paged}:acknowledge", "pending")
        [resolve] = await follow_ups(book, dismissed)
        assert resolve.dedup_key == f"follow:pagerduty:{dismissed}:resolve"
        assert await follow_ups(book, quiet) == []

    async def test_a_follower_s_answer_follows_its_owner_s_incident(self, book: Book):
        """N45: followers have no incident of their own: an answer to one follows its owner's."""
        owner = await accept(book, ["pagerduty"], response_timeout=600, obligation_key="disk", obligation_window=600)
        follower = await accept(book, ["pagerduty"], response_timeout=600, obligation_key="disk", obligation_window=600)
        assert (await run(book, adapters(pagerduty=["success"])))["delivered"] == 1
        await ack_notification(book, follower, actor=ALICE)
        [ack] = await follow_ups(book, follower)
        assert ack.dedup_key == f"follow:pagerduty:{owner}:acknowledge"
        assert await follow_ups(book, owner) == [ack]
