"""Notifications, delivery (specs/notifications.md N1-N7, N9): fallback order, modes, cycles, guards, evidence."""

from __future__ import annotations

import pytest

from statebook.lifecycle import Book, history, replay, verify
from statebook.outbox.notifications import Observation, get_notification, notification_attempts, send_notification
from statebook.outbox.notifications import calls
from statebook.outbox.notifications.attempts import AttemptResult
from statebook.outbox.notifications.calls import run_attempt
from statebook.outbox.notifications.delivery import claim, deliver_due_notifications, finalize, scan_due
from statebook.outbox.notifications.scripted import ScriptedChannel

FAST = 0.05
SURE = 1.0
"""A deadline for a pass whose success must not depend on the machine's load."""

"""A short adapter deadline (real seconds: the deadline is the event loop's), so hangs end quickly."""


async def accept(book: Book, channels: list[str], mode: str = "guaranteed") -> str:
    return (await send_notification(book, recipient="ops", content={"text": "disk full"}, mode=mode,
                                    channels=channels)).id


def adapters(**scripts: list) -> dict[str, ScriptedChannel]:
    return {name: ScriptedChannel(name, script) for name, script in scripts.items()}


async def attempts(book: Book, notification_id: str) -> list[tuple[str, str, int, bool]]:
    return [(a.channel, a.status, a.attempt, a.duplicate_risk)
            for a in await notification_attempts(book, notification_id)]


CALM = 5.0
"""The adapter deadline of a pass whose test is not about deadlines: FAST's 0.05 s also covers the admission's
database write, which a loaded CI machine can miss."""


async def one_pass(book: Book, channels, **kwargs) -> dict[str, int]:
    return await deliver_due_notifications(book, channels, deadline=kwargs.pop("deadline", FAST), **kwargs)


async def assert_consistent(book: Book, notification_id: str) -> None:
    """L6 / L7: rows equal the fold of their facts; verify is clean for both lifecycles."""
    row = await get_notification(book, notification_id)
    assert row is not None
    folded = await replay(book, "notification", notification_id)
    assert folded is not None and folded["status"] == row.status and folded["version"] == row.version
    for entity_type in ("notification", "channel_attempt"):
        report = await verify(book, entity_type)
        assert report.ok, report


class NotificationDeliveryCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_guaranteed_runs_persistent_channels_in_order_until_the_first_success(self, book: Book):
        """N1: Slack, then email, then PagerDuty, stopping at the first SUCCESS; later channels are not called."""
        nid = await accept(book, ["pagerduty", "email", "slack"])
        chans = adapters(slack=["reject"], email=["success"], pagerduty=["success"])
        counts = await one_pass(book, chans)
        assert counts["delivered"] == 1
        assert await attempts(book, nid) == [("slack", "rejected", 1, False), ("email", "success", 1, False)]
        assert chans["pagerduty"].calls == 0
        row = await get_notification(book, nid)
        assert (row.status, row.delivered_channel, row.claim_id, row.attempts) == ("delivered", "email", None, 1)
        await assert_consistent(book, nid)

    async def test_websocket_success_never_satisfies_a_guaranteed_notification(self, book: Book):
        """N1: a GUARANTEED attempt whose persistent channel failed is not delivered by WebSocket's success."""
        nid = await accept(book, ["websocket", "email"])
        chans = adapters(email=["reject"], websocket=["success"])
        counts = await one_pass(book, chans)
        assert (counts["delivered"], counts["retried"]) == (0, 1)
        assert await attempts(book, nid) == [("email", "rejected", 1, False), ("websocket", "success", 1, False)]
        assert (await get_notification(book, nid)).status == "pending"

    async def test_best_effort_tries_every_channel_at_once_and_fails_without_a_dead_letter(self, book: Book):
        """N1: BEST_EFFORT runs the selected channels concurrently; WebSocket's success delivers it; when
        none succeeds it ends failed, no dead letter, no second attempt."""
        delivered = await accept(book, ["email", "websocket"], mode="best_effort")
        chans = adapters(email=["hang_after"], websocket=["success"])
        # A deadline WebSocket's success meets however loaded the machine is (its admission is a database write;
        # 0.05 s was missed once under load); the email hang waits it out.
        await one_pass(book, chans, deadline=SURE)
        row = await get_notification(book, delivered)
        assert (row.status, row.delivered_channel) == ("delivered", "websocket")
        failed = await accept(book, ["slack", "email", "websocket"], mode="best_effort")
        chans = adapters(slack=["reject"], email=["reject"], websocket=["reject"])
        counts = await one_pass(book, chans)
        row = await get_notification(book, failed)
        assert (counts["failed"], row.status, row.dead_letter) == (1, "failed", False)
        assert sorted(c for c, *_ in await attempts(book, failed)) == ["email", "slack", "websocket"]
        assert all(ch.calls == 1 for ch in chans.values())
        await assert_consistent(book, failed)

    async def test_a_cycle_is_three_attempts_with_backoff_then_a_visible_dead_letter(self, book: Book, clock):
        """N2: attempts 1 and 2 fail and wait 1 s then 2 s; the third exhausts the cycle: failed with
        dead_letter set; attempts are counted per cycle and cumulatively."""
        nid = await accept(book, ["email"])
        chans = adapters(email=["reject"])
        t0 = clock.now()
        assert (await one_pass(book, chans))["retried"] == 1
        assert (await get_notification(book, nid)).next_attempt_at.timestamp() == t0 + 1
        assert (await one_pass(book, chans))["claimed"] == 0  # not due before its backoff
        clock.advance(1)
        await one_pass(book, chans)
        assert (await get_notification(book, nid)).next_attempt_at.timestamp() == t0 + 1 + 2
        clock.advance(2)
        assert (await one_pass(book, chans))["dead_letter"] == 1
        row = await get_notification(book, nid)
        assert (row.status, row.dead_letter, row.cycle_attempts, row.attempts) == ("failed", True, 3, 3)
        assert [a[2] for a in await attempts(book, nid)] == [1, 2, 3]
        clock.advance(3600)
        assert (await one_pass(book, chans))["claimed"] == 0
        assert chans["email"].calls == 3
        await assert_consistent(book, nid)

    async def test_the_adapter_deadline_must_fit_in_the_lease(self, book: Book):
        """N3: a pass whose adapter deadline is not shorter than its lease is refused before any claim."""
        nid = await accept(book, ["email"])
        with pytest.raises(ValueError, match="shorter than the lease"):
            await deliver_due_notifications(book, adapters(email=["success"]), deadline=60, lease_seconds=60)
        assert (await get_notification(book, nid)).claim_id is None

    async def test_timeouts_before_and_after_admission_are_not_started_and_unknown(self, book: Book):
        """N6: a channel cut by its deadline before admission is NOT_STARTED (nothing was sent, no started
        fact); after admission it is UNKNOWN, and the fallback goes on marking the next observation as a
        possible duplicate; one observation summarises provider retries, each recorded (not as another
        start) before its effect (N10b)."""
        nid = await accept(book, ["slack", "email", "pagerduty"])
        chans = adapters(slack=["hang_before"], email=["hang_after"], pagerduty=["retry_success"])
        await one_pass(book, chans)
        assert await attempts(book, nid) == [("slack", "not_started", 1, False), ("email", "unknown", 1, False),
                                             ("pagerduty", "success", 1, True)]
        rows = await notification_attempts(book, nid)
        assert rows[2].provider_retries == 1 and len(chans["pagerduty"].effects) == 2
        facts = {r.channel: [f.status for f in await history(book, "channel_attempt", r.id)] for r in rows}
        assert facts == {"slack": ["not_started"], "email": ["started", "unknown"],
                         "pagerduty": ["started", "started", "success"]}
        retried = [f.reason_code for f in await history(book, "channel_attempt", rows[2].id)]
        assert retried.count("channel_attempt.started.admitted") == 1 and "channel_attempt.started.retried" in retried
        assert rows[0].started_at is None and rows[1].started_at is not None

    async def test_every_provider_effect_has_a_started_fact_before_it(self, book: Book, monkeypatch):
        """N5: the admission's fact is committed before the channel makes its effect."""
        nid = await accept(book, ["email"])
        seen: list[list[str]] = []

        class Checking(ScriptedChannel):
            async def send(self, d, guard):
                await guard.admit()
                seen.append([a.status for a in await notification_attempts(book, d.notification_id)])
                return await super().send(d, guard)

        await one_pass(book, {"email": Checking("email", ["success"])})
        assert seen == [["started"]]
        assert (await get_notification(book, nid)).status == "delivered"

    async def test_a_lost_lease_stops_the_fallback_and_the_stale_outcome_is_fenced(self, book: Book, clock):
        """N4 / N5: when the lease lapses during a channel call, the observation is still recorded with
        its lease and cycle, no further channel is tried and nothing is finalized; a second claimant then
        owns it, and the first claimant's outcome (a stale claim) writes nothing."""
        nid = await accept(book, ["slack", "email"])

        class Lapsing(ScriptedChannel):
            async def send(self, d, guard):
                await guard.admit()
                clock.advance(61)  # the lease lapses while the provider answers
                return await super().send(d, guard)

        chans = {"slack": Lapsing("slack", ["reject"]), "email": ScriptedChannel("email", ["success"])}
        [candidate] = await scan_due(book, now=clock.now())
        lease = await claim(book, candidate, now=clock.now())
        assert lease is not None
        result = await run_attempt(book, lease, chans, deadline=FAST)
        assert result.outcome is None and chans["email"].calls == 0
        [obs] = await notification_attempts(book, nid)
        assert (obs.status, obs.claim_id, obs.cycle) == ("rejected", lease.claim_id, 1)
        [again] = await scan_due(book, now=clock.now())
        second = await claim(book, again, now=clock.now())
        assert second is not None and second.claim_id != lease.claim_id and second.cycle_attempt == 2
        [fact] = (await history(book, "notification", nid))[-1:]
        assert fact.reason_code == "notification.pending.reclaimed"
        stale = AttemptResult("delivered", delivered_channel="slack")
        assert await finalize(book, lease, stale, now=clock.now()) == "conflict"
        assert (await get_notification(book, nid)).claim_id == second.claim_id
        await assert_consistent(book, nid)

    async def test_a_provider_retry_is_guarded_and_a_lease_only_check_writes_nothing(self, book: Book, clock):
        """N4: ``guard_provider_attempt`` before a provider retry refuses once the claim is another's; the
        checks that pass write no notification fact (after the admission each records its retry on the
        observation, N10b)."""
        nid = await accept(book, ["email"])
        [candidate] = await scan_due(book, now=clock.now())
        lease = await claim(book, candidate, now=clock.now())
        before = len(await history(book, "notification", nid))

        class Retrying(ScriptedChannel):
            async def send(self, d, guard):
                await guard.admit()
                await guard.guard_provider_attempt()  # passes: still ours
                await guard.guard_provider_attempt()
                clock.advance(61)
                await guard.guard_provider_attempt()  # the lease lapsed: refused
                raise AssertionError("not reached")

        result = await run_attempt(book, lease, {"email": Retrying("email")}, deadline=FAST)
        assert result.outcome is None
        assert len(await history(book, "notification", nid)) == before
        [obs] = await notification_attempts(book, nid)
        assert obs.status == "unknown"  # admitted, then stopped: the effect may have happened

    async def test_evidence_that_cannot_be_stored_stops_the_attempt_and_leaves_the_claim(self, book: Book,
                                                                                          monkeypatch, clock):
        """N7: when the started fact cannot be written, the channel makes no effect, no rejection is
        recorded, the fallback does not go on and the claim is left to lapse (recoverable)."""
        nid = await accept(book, ["slack", "email"])
        real = calls.create

        async def failing(book_, entity_type, **kwargs):
            if entity_type == "channel_attempt" and kwargs.get("status") == "started":
                raise OSError("disk full")
            return await real(book_, entity_type, **kwargs)

        monkeypatch.setattr(calls, "create", failing)
        chans = adapters(slack=["success"], email=["success"])
        counts = await one_pass(book, chans)
        assert (counts["claimed"], counts["stopped"]) == (1, 1)
        assert chans["slack"].effects == [] and chans["email"].calls == 0
        assert await notification_attempts(book, nid) == []
        row = await get_notification(book, nid)
        assert row.status == "pending" and row.claim_id is not None
        monkeypatch.setattr(calls, "create", real)
        clock.advance(61)
        assert (await one_pass(book, chans))["delivered"] == 1

    async def test_a_claim_taken_over_on_a_faster_clock_is_refused_at_admission(self, book: Book, db_url, clock):
        """N4: ownership is checked before each channel attempt, not only the lease's end on this worker's
        clock: another worker whose clock runs ahead reclaimed the notification, so this worker's next
        channel is refused at admission (no effect, no started fact) and its outcome writes nothing."""
        from statebook.adapters.db import connect
        from statebook.lifecycle import FakeClock

        nid = await accept(book, ["slack", "email"])
        [candidate] = await scan_due(book, now=clock.now())
        mine = await claim(book, candidate, now=clock.now())
        ahead = FakeClock(clock.now() + 61)
        rival = Book(connect(db_url), book.registry, ahead)
        try:
            [seen] = await scan_due(rival, now=ahead.now())
            theirs = await claim(rival, seen, now=ahead.now())
            assert theirs is not None
            chans = adapters(slack=["success"], email=["success"])
            result = await run_attempt(book, mine, chans, deadline=FAST)
            assert result.outcome is None
            assert chans["slack"].effects == [] and chans["email"].calls == 0
            [obs] = await notification_attempts(book, nid)
            assert (obs.status, obs.started_at) == ("not_started", None)
            assert await finalize(book, mine, AttemptResult("delivered", delivered_channel="slack"),
                                  now=clock.now()) == "conflict"
            assert (await get_notification(book, nid)).claim_id == theirs.claim_id
        finally:
            await rival.engine.dispose()

    async def test_a_channel_without_a_token_is_skipped_to_the_next_selected_one(self, book: Book, clock):
        """N8: a channel whose bucket is empty makes no effect and leaves a RATE_LIMITED observation (no
        started fact); the attempt goes on with the next selected channel."""
        from statebook.outbox.notifications.buckets import ensure_bucket

        await ensure_bucket(book, "slack", "all", capacity=1, refill_per_second=0.001)
        first = await accept(book, ["slack", "email"])
        second = await accept(book, ["slack", "email"])
        chans = adapters(slack=["success"], email=["success"])
        assert (await one_pass(book, chans, concurrency=1))["delivered"] == 2
        assert len(chans["slack"].effects) == 1 and len(chans["email"].effects) == 1
        by_id = {nid: await attempts(book, nid) for nid in (first, second)}
        assert sorted(by_id.values()) == [[("slack", "rate_limited", 1, False), ("email", "success", 1, False)],
                                          [("slack", "success", 1, False)]]
        limited = next(nid for nid, seen in by_id.items() if len(seen) == 2)
        row = (await notification_attempts(book, limited))[0]
        assert row.started_at is None
        assert [f.status for f in await history(book, "channel_attempt", row.id)] == ["rate_limited"]

    async def test_no_token_on_any_channel_is_rate_limited_and_uses_no_attempt(self, book: Book, clock):
        """N8: when no selected channel had a token the notification is rate_limited — never counted as
        delivered — due again when the bucket refills, and that attempt did not use up the cycle's budget."""
        from statebook.outbox.notifications.buckets import ensure_bucket

        await ensure_bucket(book, "email", "all", capacity=1, refill_per_second=0.5)
        spent = await accept(book, ["email"])
        nid = await accept(book, ["email"])
        chans = adapters(email=["success"])
        counts = await one_pass(book, chans, concurrency=1, deadline=CALM)
        assert (counts["delivered"], counts["rate_limited"]) == (1, 1)
        row = await get_notification(book, nid if (await get_notification(book, spent)).status == "delivered"
                                     else spent)
        assert (row.status, row.cycle_attempts, row.claim_id) == ("rate_limited", 0, None)
        assert row.next_attempt_at.timestamp() == pytest.approx(clock.now() + 2.0)
        assert (await one_pass(book, chans, deadline=CALM))["claimed"] == 0  # not due until the token is back
        clock.advance(2.0)
        assert (await one_pass(book, chans, deadline=CALM))["delivered"] == 1
        after = await get_notification(book, row.id)
        assert (after.status, after.cycle_attempts) == ("delivered", 1)
        codes = [f.reason_code for f in await history(book, "notification", row.id)]
        assert "notification.rate_limited.no_token" in codes and "notification.pending.rate_limit_cleared" in codes
        await assert_consistent(book, row.id)

    async def test_a_crash_after_admission_can_repeat_the_effect_and_the_record_says_so(self, book: Book, clock):
        """N10 / N5: a worker that stops after the provider accepted a send and before recording its result
        leaves the observation started; once its lease lapsed, the next claim closes it as UNKNOWN (its
        effect may have happened) and the new attempt — which sends again — carries duplicate_risk."""
        nid = await accept(book, ["email"])
        chans = adapters(email=["success"])
        [candidate] = await scan_due(book, now=clock.now())
        crashed = await claim(book, candidate, now=clock.now())
        guard = calls.LeaseGuard(book, crashed, "email", deadline_end=clock.now() + 10, duplicate_risk=False)
        await guard.admit()
        chans["email"].effects.append("the provider accepted it")  # ... and then the worker died
        assert [a[1] for a in await attempts(book, nid)] == ["started"]
        clock.advance(61)
        assert (await one_pass(book, chans))["delivered"] == 1
        assert len(chans["email"].effects) == 2  # the effect was repeated: the window N10 names
        assert await attempts(book, nid) == [("email", "unknown", 1, False), ("email", "success", 2, True)]
        first = (await notification_attempts(book, nid))[0]
        assert [f.status for f in await history(book, "channel_attempt", first.id)] == ["started", "unknown"]
        await assert_consistent(book, nid)

    async def test_runtime_timestamps_come_from_the_injected_clock_and_scans_order_by_due_then_id(self, book: Book,
                                                                                                  clock):
        """N9: observation and outcome times are the book's clock; the scan orders by due time then id."""
        first = await accept(book, ["email"])
        clock.advance(5)
        later = [await accept(book, ["email"]) for _ in range(3)]
        assert [c.id for c in await scan_due(book, now=clock.now())] == [first, *sorted(later)]
        clock.advance(7)
        await one_pass(book, adapters(email=["success"]), limit=1)
        [obs] = await notification_attempts(book, first)
        assert obs.made_at.timestamp() == obs.started_at.timestamp() == obs.ended_at.timestamp() == clock.now()
        assert (await get_notification(book, first)).updated_at.timestamp() == clock.now()

    async def test_every_delivery_of_an_attempt_carries_the_hooks_links_and_no_fact_holds_them(self, book: Book,
                                                                                               clock):
        """N43: a deployment's link hook gives each channel of an attempt the same response links (due at
        the response deadline when one is expected); a provider that echoes a link back has it cut from the
        recorded detail, so no fact holds the credential; without a hook a delivery carries none."""
        asked = []

        def hook(nid, recipient, due_at):
            asked.append((nid, recipient, due_at))
            return {"acked": f"https://book.example/r/ACK-{nid}", "dismissed": f"https://book.example/r/DIS-{nid}"}

        echo = ScriptedChannel("slack", ["reject"])
        nid = (await send_notification(book, recipient="ops", content={"text": "disk full"}, mode="guaranteed",
                                       channels=["slack", "email"], response_timeout=600)).id
        email = ScriptedChannel("email", ["success"])
        original_send = echo.send

        async def echoing(delivery, guard):  # a provider whose refusal quotes the request back
            observed = await original_send(delivery, guard)
            return Observation(observed.outcome, f"bad request: {dict(delivery.links)}")

        echo.send = echoing
        await one_pass(book, {"slack": echo, "email": email}, links=hook, deadline=CALM)
        assert asked == [(nid, "ops", clock.now() + 600)]
        [sent] = email.effects
        assert dict(sent.links) == hook(nid, "ops", None) == dict(echo.effects[0].links)
        rows = await notification_attempts(book, nid)
        assert "ACK-" not in (rows[0].detail or "") and "****" in rows[0].detail
        for entity_type, entity_id in (("notification", nid), *(("channel_attempt", r.id) for r in rows)):
            assert "/r/" not in repr(await history(book, entity_type, entity_id))
        plain = await accept(book, ["email"])
        await one_pass(book, {"email": email})
        assert email.effects[-1].notification_id == plain and dict(email.effects[-1].links) == {}
