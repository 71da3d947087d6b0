"""Notifications on the shared delivery machinery (specs/notifications.md N11): set-based claims in one
transaction, bounded slots that claim only what they can start, fenced group finalizations."""

from __future__ import annotations

import asyncio

from statebook.adapters.db import connect
from statebook.lifecycle import Book
from statebook.outbox.notifications import get_notification, notification_attempts, send_notification
from statebook.outbox.notifications.channels import Delivery, Guard, Observation, ProviderOutcome
from statebook.outbox.notifications.attempts import AttemptResult
from statebook.outbox.notifications.calls import run_attempt
from statebook.outbox.notifications.delivery import (
    claim, claim_due, deliver_due_notifications, finalize_all, scan_due,
)
from statebook.outbox.notifications.scripted import ScriptedChannel

FAST = 0.05



async def accept(book: Book, channels: list[str], mode: str = "guaranteed") -> str:
    return (await send_notification(book, recipient="ops", content={"text": "disk full"}, mode=mode,
                                    channels=channels)).id


class GatedChannel:
    """An email channel whose sends wait for ``gate``; counts the sends in flight."""

    name = "email"
    persistent = True
    reports_admission = True
    guards_provider_attempts = True

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.most = 0
        self.entered = asyncio.Event()

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        await guard.admit()
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.entered.set()
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        return Observation(ProviderOutcome.SUCCESS, "accepted")


class NotificationPassCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_a_pass_claims_only_what_its_free_slots_can_start(self, book: Book):
        """N11: with one slot busy, the other due notifications stay unclaimed (no lease taken that
        could lapse while it waits); each is claimed as the slot frees; never more than one in flight."""
        ids = [await accept(book, ["email"]) for _ in range(3)]
        email = GatedChannel()
        run = asyncio.ensure_future(deliver_due_notifications(book, {"email": email}, concurrency=1, deadline=5))
        try:
            await asyncio.wait_for(email.entered.wait(), 5)
            rows = [await get_notification(book, i) for i in ids]
            assert sum(r.claim_id is not None for r in rows) == 1, [r.claim_id for r in rows]
            email.gate.set()
            counts = await asyncio.wait_for(run, 10)
        finally:
            email.gate.set()
            run.cancel()
        assert (counts["claimed"], counts["delivered"], email.most) == (3, 3, 1)
        assert [(await get_notification(book, i)).status for i in ids] == ["delivered"] * 3

    async def test_concurrent_set_claims_take_disjoint_notifications(self, book: Book, db_url, clock):
        """N11: two workers claiming sets at once (separate connections) never claim one notification
        twice; between them they claim every due one."""
        ids = {await accept(book, ["email"]) for _ in range(12)}
        rival = Book(connect(db_url), book.registry, clock)
        try:
            (mine, _), (theirs, _) = await asyncio.gather(
                claim_due(book, now=clock.now(), limit=8), claim_due(rival, now=clock.now(), limit=8))
        finally:
            await rival.engine.dispose()
        taken = [lease.notification_id for lease in mine + theirs]
        assert len(taken) == len(set(taken)) and set(taken) == ids

    async def test_a_set_claim_closes_what_a_lapsed_claim_left_started(self, book: Book, clock):
        """N5, N10, N11: the worker died after an admission; the set claim that takes the notification
        over closes the open observation as unknown, marks the new lease as a possible duplicate, and
        fails a lapsed last attempt instead of claiming it again (counted)."""
        nid = await accept(book, ["email"])
        [candidate] = await scan_due(book, now=clock.now())
        lease = await claim(book, candidate, now=clock.now())
        assert lease is not None
        task = asyncio.ensure_future(run_attempt(book, lease, {"email": ScriptedChannel("email", ["hang_after"])},
                                                 deadline=30))
        for _ in range(200):
            if await notification_attempts(book, nid):
                break
            await asyncio.sleep(0.01)
        task.cancel()  # the worker "died" after the send was admitted
        await asyncio.gather(task, return_exceptions=True)
        clock.advance(61)
        [taken], counts = await claim_due(book, now=clock.now(), limit=10)
        assert (taken.notification_id, taken.duplicate_risk, counts["claimed"]) == (nid, True, 1)
        [obs] = await notification_attempts(book, nid)
        assert obs.status == "unknown"
        # The third attempt's lease lapses too: the cycle is over, so the set claim dead-letters it.
        clock.advance(61)
        [again], _ = await claim_due(book, now=clock.now(), limit=10)
        clock.advance(61)
        leases, counts = await claim_due(book, now=clock.now(), limit=10)
        row = await get_notification(book, nid)
        assert (leases, counts["dead_letter"], row.status, row.dead_letter) == ([], 1, "failed", True)

    async def test_a_group_finalization_is_fenced_per_notification(self, book: Book, clock):
        """N5, N11: finalizations recorded together are still one fenced transition each: a lease whose
        claim was taken over gets conflict and writes nothing, the others apply."""
        ids = [await accept(book, ["email"]) for _ in range(3)]
        leases, _ = await claim_due(book, now=clock.now(), limit=10)
        by_id = {lease.notification_id: lease for lease in leases}
        clock.advance(61)  # the middle one's lease lapses and another claim takes it
        [candidate] = [c for c in await scan_due(book, now=clock.now()) if c.id == ids[1]]
        assert await claim(book, candidate, now=clock.now()) is not None
        done = [(by_id[i], AttemptResult("delivered", delivered_channel="email")) for i in ids]
        assert await finalize_all(book, done, now=clock.now()) == ["delivered", "conflict", "delivered"]
        statuses = [(await get_notification(book, i)).status for i in ids]
        assert statuses == ["delivered", "pending", "delivered"]

    async def test_a_group_that_cannot_be_written_is_recorded_one_by_one(self, book: Book, clock, caplog):
        """N7, N11: one finalization of a group that cannot be written does not lose the others: the group
        falls back to one transition each; the bad one is reported (None) and keeps its claim."""
        from statebook.lifecycle import Command
        from statebook.outbox.core.claims import record_set
        from statebook.outbox.notifications.attempts import finalize_command

        ids = [await accept(book, ["email"]) for _ in range(3)]
        claimed, _ = await claim_due(book, now=clock.now(), limit=10)
        leases = sorted(claimed, key=lambda lease: ids.index(lease.notification_id))
        planned = []
        for lease in leases:
            command = finalize_command(lease, AttemptResult("delivered", delivered_channel="email"), now=clock.now())
            if lease.notification_id == ids[1]:  # a patch the policy refuses: the whole group's engine call raises
                command = Command(**{**command.__dict__, "patch": {**command.patch, "no_such_column": 1}})
            planned.append((command, lease.head))
        applied = await record_set(book, planned)
        assert applied == [True, None, True]
        rows = [await get_notification(book, i) for i in ids]
        assert [r.status for r in rows] == ["delivered", "pending", "delivered"]
        assert rows[1].claim_id == leases[1].claim_id
