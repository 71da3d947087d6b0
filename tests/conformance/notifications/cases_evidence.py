"""Notifications, what a stopped worker left on record (specs/notifications.md N5, N10, N10a, N10b): a
recorded success settles the notification at the next claim instead of a second send; the duplicate
risk stays with the cycle across reclaims; a reclaim keeps the provider retries the record holds; a
late result after another claim closed its observation is recorded nowhere."""

from __future__ import annotations

import asyncio

from statebook.lifecycle import Book, history
from statebook.outbox.notifications import (
    ProviderOutcome, get_notification, get_response, notification_attempts, send_notification,
)
from statebook.outbox.notifications import calls
from statebook.outbox.notifications.channels import Observation
from statebook.outbox.notifications.attempts import AttemptResult
from statebook.outbox.notifications.calls import attempt_channel
from statebook.outbox.notifications.delivery import claim, claim_due, deliver_due_notifications, finalize, scan_due
from statebook.outbox.notifications.scripted import ScriptedChannel

from .cases_delivery import accept, adapters, assert_consistent, attempts

SETTLED = "notification.delivered.recorded_success"
CALM = 2.0
"""The adapter deadline (real seconds) of calls that answer at once: long enough that an admission on a
loaded machine is never cut."""
HANG = 0.5
"""The adapter deadline of calls that hang after their admission."""


async def one_pass(book: Book, channels, deadline: float = CALM) -> dict[str, int]:  # noqa: ANN001
    return await deliver_due_notifications(book, channels, deadline=deadline)


async def codes(book: Book, nid: str) -> list[str]:
    return [f.reason_code for f in await history(book, "notification", nid)]


async def first_claim(book: Book, nid: str, clock):
    [candidate] = [c for c in await scan_due(book, now=clock.now()) if c.id == nid]
    lease = await claim(book, candidate, now=clock.now())
    assert lease is not None
    return lease


class Scripted(ScriptedChannel):
    """A channel whose ``send`` is the given coroutine function ``(delivery, guard) -> Observation``."""

    def __init__(self, name: str, send) -> None:  # noqa: ANN001
        super().__init__(name)
        self._send = send

    async def send(self, d, guard):  # noqa: ANN001
        self.calls += 1
        return await self._send(d, guard)


class NotificationEvidenceCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_a_success_recorded_before_a_crash_settles_the_notification_without_a_second_send(
            self, book: Book, clock):
        """N10a (N5, N10): the provider accepted, the success observation is on record, the worker died before
        finalizing; once the lease lapsed, the next claim — a pass's set claim or the single step — settles
        the notification delivered from that observation (one transition fenced by the lapsed claim's token),
        sends nothing again, and the dead worker's late finalization is a conflict."""
        for single_step in (False, True):
            nid = await accept(book, ["email"])
            chans = adapters(email=["success"])
            lease = await first_claim(book, nid, clock)
            recorded = await attempt_channel(book, lease, chans["email"], deadline=CALM)
            assert recorded.observation.outcome is ProviderOutcome.SUCCESS  # ... and then the worker died
            clock.advance(61)
            if single_step:
                [candidate] = [c for c in await scan_due(book, now=clock.now()) if c.id == nid]
                assert await claim(book, candidate, now=clock.now()) is None
            else:
                counts = await one_pass(book, chans)
                assert (counts["delivered"], counts["claimed"]) == (1, 0), counts
            assert len(chans["email"].effects) == 1, "the recorded success was sent again"
            row = await get_notification(book, nid)
            assert (row.status, row.delivered_channel, row.claim_id, row.attempts, row.cycle_attempts) \
                == ("delivered", "email", None, 1, 1)
            assert await attempts(book, nid) == [("email", "success", 1, False)]
            assert (await codes(book, nid))[-1] == SETTLED
            late = AttemptResult("delivered", delivered_channel="email")
            assert await finalize(book, lease, late, now=clock.now()) == "conflict"
            await assert_consistent(book, nid)

    async def test_a_success_recorded_after_the_lease_lapsed_settles_while_its_claim_is_still_the_row_s(
            self, book: Book, clock):
        """N10a: the claim token, not the clock, fences the evidence, as it fences a finalization: a stalled
        worker whose success was recorded after its lease lapsed, before anyone claimed the notification
        again, could still have finalized it itself — so the next claim settles from that success too."""
        nid = await accept(book, ["email"])

        async def stalled(d, guard):  # noqa: ANN001
            await guard.admit()
            clock.advance(61)  # a pause between the admission and the provider's answer, longer than the lease
            return Observation(ProviderOutcome.SUCCESS, "accepted")

        lease = await first_claim(book, nid, clock)
        recorded = await attempt_channel(book, lease, Scripted("email", stalled), deadline=CALM)
        [obs] = await notification_attempts(book, nid)
        assert recorded.observation.outcome is ProviderOutcome.SUCCESS and obs.ended_at.timestamp() > lease.lease_until
        email = ScriptedChannel("email", ["success"])
        assert (await one_pass(book, {"email": email}))["delivered"] == 1
        assert email.calls == 0
        assert (await codes(book, nid))[-1] == SETTLED
        await assert_consistent(book, nid)

    async def test_a_success_on_the_cycle_s_last_attempt_settles_instead_of_a_dead_letter(self, book: Book, clock):
        """N10a (N2): a lapsed last attempt is dead-lettered only when nothing qualifying is on record: with a
        recorded success it is delivered."""
        nid = await accept(book, ["email"])
        await one_pass(book, adapters(email=["reject"]))
        clock.advance(1)
        await one_pass(book, adapters(email=["reject"]))
        clock.advance(2)
        lease = await first_claim(book, nid, clock)
        assert lease.cycle_attempt == 3
        await attempt_channel(book, lease, ScriptedChannel("email", ["success"]), deadline=CALM)
        clock.advance(61)
        counts = await one_pass(book, adapters(email=["success"]))
        assert (counts["delivered"], counts["dead_letter"]) == (1, 0), counts
        row = await get_notification(book, nid)
        assert (row.status, row.dead_letter, row.cycle_attempts) == ("delivered", False, 3)
        await assert_consistent(book, nid)

    async def test_an_owner_settled_from_its_record_satisfies_its_followers_and_starts_its_response(
            self, book: Book, clock):
        """N10a (N18, N31): settling an owner from its recorded success is its delivery: in ONE transaction
        (claim row first) its followers are deduplicated, the claim satisfied and its response started."""
        owner = (await send_notification(book, recipient="ops", content={"t": 1}, mode="guaranteed",
                                         channels=["email"], obligation_key="disk", response_timeout=300)).id
        follower = (await send_notification(book, recipient="ops", content={"t": 2}, mode="guaranteed",
                                            channels=["email"], obligation_key="disk")).id
        lease = await first_claim(book, owner, clock)
        await attempt_channel(book, lease, ScriptedChannel("email", ["success"]), deadline=CALM)
        clock.advance(61)
        counts = await one_pass(book, adapters(email=["success"]))
        assert (counts["delivered"], counts["claimed"]) == (1, 0), counts
        assert (await get_notification(book, owner)).status == "delivered"
        assert (await get_notification(book, follower)).status == "deduplicated"
        response = await get_response(book, owner)
        assert (response.status, response.due_at.timestamp()) == ("pending", clock.now() + 300)
        await assert_consistent(book, owner)

    async def test_a_guaranteed_notification_is_not_settled_by_a_websocket_success_and_the_repeat_is_a_risk(
            self, book: Book, clock):
        """N10a, N10b: a recorded success that does not qualify (WebSocket, for a GUARANTEED notification)
        settles nothing: the next attempt sends again, and every observation it makes is a duplicate risk
        (the WebSocket send is repeated)."""
        nid = await accept(book, ["email", "websocket"])
        chans = adapters(email=["reject"], websocket=["success"])
        lease = await first_claim(book, nid, clock)
        for name in ("email", "websocket"):
            await attempt_channel(book, lease, chans[name], deadline=CALM)
        clock.advance(61)  # ... the worker died before finalizing
        chans["email"].script = ("success",)
        assert (await one_pass(book, chans))["delivered"] == 1
        assert await attempts(book, nid) == [("email", "rejected", 1, False), ("websocket", "success", 1, False),
                                             ("email", "success", 2, True), ("websocket", "success", 2, True)]
        await assert_consistent(book, nid)

    async def test_the_duplicate_risk_stays_with_the_cycle_across_chained_reclaims(self, book: Book, clock):
        """N10b (N5, N10): attempt 1 admitted and its worker killed; attempt 2's claim closes it unknown and
        carries the risk, but its worker dies before admission; attempt 3 still sends as a duplicate risk.
        A live UNKNOWN finalized as a retry makes the cycle's next attempt a risk the same way."""
        nid = await accept(book, ["email"])
        lease = await first_claim(book, nid, clock)
        await calls.LeaseGuard(book, lease, "email", deadline_end=clock.now() + 10, duplicate_risk=False).admit()
        clock.advance(61)  # killed after the admission
        second = await first_claim(book, nid, clock)
        assert second.duplicate_risk
        clock.advance(61)  # killed before its admission
        chans = adapters(email=["success"])
        leases, _ = await claim_due(book, now=clock.now(), limit=10)
        assert [(x.notification_id, x.cycle_attempt, x.duplicate_risk) for x in leases] == [(nid, 3, True)]
        clock.advance(61)  # and once more, through a pass: the last attempt's lease lapsed (dead letter)
        assert (await one_pass(book, chans))["dead_letter"] == 1
        assert await attempts(book, nid) == [("email", "unknown", 1, False)]

        live = await accept(book, ["email"])
        await one_pass(book, adapters(email=["hang_after"]), deadline=HANG)  # UNKNOWN, then a retry
        clock.advance(1)
        await one_pass(book, adapters(email=["reject"]))
        clock.advance(2)
        await one_pass(book, adapters(email=["success"]))
        assert await attempts(book, live) == [("email", "unknown", 1, False), ("email", "rejected", 2, True),
                                              ("email", "success", 3, True)]
        await assert_consistent(book, live)

    async def test_a_reclaim_keeps_the_provider_retries_on_record(self, book: Book, clock):
        """N10b (N4, N5): each guarded provider retry after the admission is recorded on the started
        observation before its effect, so a reclaim that closes the observation as unknown keeps what is
        known and a history bounds the provider's receipts (at most 1 + provider_retries per observation);
        a call the deadline cuts after retries records them too; a channel's own count wins when it reports."""
        nid = await accept(book, ["email"])
        sent: list[str] = []
        stop = asyncio.Event()

        async def retrying(d, guard):  # noqa: ANN001
            await guard.admit()
            sent.append("try 1")
            for n in (2, 3):
                await guard.guard_provider_attempt()
                sent.append(f"try {n}")
            await stop.wait()  # no answer: the worker dies here, or the deadline cuts the call
            return Observation(ProviderOutcome.SUCCESS, "accepted")

        lease = await first_claim(book, nid, clock)
        task = asyncio.ensure_future(attempt_channel(book, lease, Scripted("email", retrying), deadline=30))
        for _ in range(500):
            if len(sent) == 3:
                break
            await asyncio.sleep(0.01)
        [obs] = await notification_attempts(book, nid)
        assert (obs.status, obs.provider_retries) == ("started", 2)
        task.cancel()  # the worker died
        await asyncio.gather(task, return_exceptions=True)
        clock.advance(61)
        await one_pass(book, adapters(email=["success"]))
        closed = (await notification_attempts(book, nid))[0]
        assert (closed.status, closed.provider_retries) == ("unknown", 2)
        assert len(sent) <= 1 + closed.provider_retries
        await assert_consistent(book, nid)

        cut = await accept(book, ["email"])
        sent.clear()
        await one_pass(book, {"email": Scripted("email", retrying)}, deadline=HANG)
        [obs] = await notification_attempts(book, cut)
        assert (obs.status, obs.provider_retries, len(sent)) == ("unknown", 2, 3)
        own = await accept(book, ["email"])
        await one_pass(book, adapters(email=["retry_success"]))
        [obs] = await notification_attempts(book, own)
        assert (obs.status, obs.provider_retries) == ("success", 1)
        await assert_consistent(book, own)

    async def test_a_late_result_after_another_claim_closed_the_observation_is_recorded_nowhere(
            self, book: Book, clock):
        """N10: a stalled worker's result that arrives after another claim closed its observation as unknown
        is recorded nowhere — a late completion never rewrites an observation — and its finalization is a
        conflict; the record is the unknown observation and the new attempt's duplicate risk."""
        nid = await accept(book, ["email"])
        resume = asyncio.Event()

        async def stalled(d, guard):  # noqa: ANN001
            await guard.admit()
            await resume.wait()
            return Observation(ProviderOutcome.SUCCESS, "accepted, late")

        lease = await first_claim(book, nid, clock)
        task = asyncio.ensure_future(attempt_channel(book, lease, Scripted("email", stalled), deadline=30))
        for _ in range(500):
            if await notification_attempts(book, nid):
                break
            await asyncio.sleep(0.01)
        clock.advance(61)
        [taken], _ = await claim_due(book, now=clock.now(), limit=10)
        assert taken.duplicate_risk
        resume.set()
        recorded = await task
        assert recorded.observation.outcome is ProviderOutcome.SUCCESS  # what the stalled worker saw ...
        [obs] = await notification_attempts(book, nid)
        assert (obs.status, obs.claim_id) == ("unknown", lease.claim_id)  # ... is not on record
        assert [f.status for f in await history(book, "channel_attempt", obs.id)] == ["started", "unknown"]
        late = AttemptResult("delivered", [recorded], delivered_channel="email")
        assert await finalize(book, lease, late, now=clock.now()) == "conflict"
        assert (await get_notification(book, nid)).claim_id == taken.claim_id
        await assert_consistent(book, nid)

    async def test_a_result_written_while_the_claim_closes_the_observation_is_read_again(
            self, book: Book, clock, monkeypatch):
        """N10a, N10b: the worker was slow, not dead — its success lands between the claim's read of the
        record and its close of the started observation. The close does not apply; the claim reads the
        observation again and settles the notification from the success instead of sending again."""
        from statebook.lifecycle import Command, Reason

        from statebook.outbox.notifications import evidence

        nid = await accept(book, ["email"])
        lease = await first_claim(book, nid, clock)
        guard = calls.LeaseGuard(book, lease, "email", deadline_end=clock.now() + 10, duplicate_risk=False)
        await guard.admit()
        clock.advance(61)
        real = evidence.apply_many

        async def result_lands_first(tx, commands, **kwargs):  # noqa: ANN001
            if commands and commands[0].entity_type == "channel_attempt":
                late = Command("channel_attempt", guard.attempt_id, "success",
                               Reason("channel_attempt.success.observed", "email: success"), calls.DELIVERY_ACTOR,
                               ("started",), {}, {"detail": "accepted", "ended_at": clock.now()})
                [landed] = await real(tx, [late])
                assert landed.applied
            return await real(tx, commands, **kwargs)

        monkeypatch.setattr(evidence, "apply_many", result_lands_first)
        email = ScriptedChannel("email", ["success"])
        counts = await one_pass(book, {"email": email})
        assert (counts["delivered"], counts["claimed"], email.calls) == (1, 0, 0), counts
        assert await attempts(book, nid) == [("email", "success", 1, False)]
        assert (await codes(book, nid))[-1] == SETTLED
        monkeypatch.setattr(evidence, "apply_many", real)
        await assert_consistent(book, nid)
