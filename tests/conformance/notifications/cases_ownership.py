"""Notifications, ownership (specs/notifications.md N13-N24): idempotency bound to content, owners,
followers and successors of one semantic obligation."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect
from statebook.lifecycle import Book, Command, Reason, apply_many, history, replay, verify
from statebook.outbox.notifications import IdempotencyMismatch, NotificationInvalid, get_notification, send_notification
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications import ownership
from statebook.outbox.notifications.schema import dedup_claims, notifications
from statebook.outbox.notifications.scripted import ScriptedChannel

FAST = 2.0
"""The adapter deadline of these passes (real seconds): their scripted channels answer at once, so it only
has to be long enough on a loaded machine."""


async def send(book: Book, text: str = "disk full", **kwargs):
    kwargs.setdefault("mode", "guaranteed")
    kwargs.setdefault("channels", ["email"])
    return await send_notification(book, recipient=kwargs.pop("recipient", "ops"), content={"text": text}, **kwargs)


async def status(book: Book, notification_id: str) -> str:
    return (await get_notification(book, notification_id)).status


async def count(book: Book, table: sa.Table) -> int:
    async with book.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar_one()


async def claim_row(book: Book, owner_recipient: str = "ops", key: str = "disk", mode: str = "guaranteed"):
    cid = ownership.dedup_claim_id(owner_recipient, key, mode)
    async with book.read() as conn:
        return (await conn.execute(sa.select(dedup_claims).where(dedup_claims.c.id == cid))).first()


async def one_pass(book: Book, script: list[str]) -> dict[str, int]:
    return await deliver_due_notifications(book, {"email": ScriptedChannel("email", script)}, deadline=FAST)


async def fail_cycle(book: Book, clock) -> None:
    """Three rejected attempts: the owner's cycle is exhausted (dead letter)."""
    for _ in range(3):
        await one_pass(book, ["reject"])
        clock.advance(10)


async def consistent(book: Book, *ids: str) -> None:
    for nid in ids:
        row = await get_notification(book, nid)
        folded = await replay(book, "notification", nid)
        assert folded is not None and (folded["status"], folded["version"]) == (row.status, row.version)
        assert folded["obligation_owner_id"] == (None if row.obligation_owner_id == nid else row.obligation_owner_id)
    for entity_type in ("notification", "dedup_claim"):
        report = await verify(book, entity_type)
        assert report.ok, report


class NotificationOwnershipCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    # -- N13 idempotency ---------------------------------------------------------------------------
    async def test_the_same_key_and_content_returns_the_original_acceptance(self, book: Book):
        """N13: same (principal, source, key) and content: the same id, no new row, no new fact."""
        first = await send(book, principal="svc", source="alerts", idempotency_key="k1")
        facts = len(await history(book, "notification", first.id))
        again = await send(book, principal="svc", source="alerts", idempotency_key="k1")
        assert (again.id, again.created, first.created) == (first.id, False, True)
        assert await count(book, notifications) == 1
        assert len(await history(book, "notification", first.id)) == facts
        other_scope = await send(book, principal="svc", source="other", idempotency_key="k1")
        assert other_scope.id != first.id and other_scope.created

    async def test_the_same_key_with_other_content_is_a_conflict_and_writes_nothing(self, book: Book):
        """N13: the key is bound to the request's content: other content (text, channels, mode, obligation
        key) is IdempotencyMismatch, with nothing written."""
        first = await send(book, idempotency_key="k1", obligation_key="disk")
        claims = await claim_row(book)
        for changed in ({"text": "other"}, {"channels": ["slack"]}, {"mode": "best_effort"},
                        {"obligation_key": "cpu"}, {"obligation_key": "disk", "obligation_window": 60}):
            args = {"idempotency_key": "k1", "obligation_key": "disk", **changed}
            with pytest.raises(IdempotencyMismatch, match=first.id):
                await send(book, **args)
        assert await count(book, notifications) == 1
        assert (await claim_row(book)).version == claims.version
        assert await claim_row(book, key="cpu") is None

    async def test_racing_intakes_of_one_key_make_one_row(self, book: Book, db_url, clock):
        """N13: intakes of one key on separate connections at once: one row, every caller gets it."""
        books = [Book(connect(db_url), book.registry, clock) for _ in range(6)]
        try:
            got = await asyncio.gather(*(send(b, idempotency_key="race", obligation_key="disk") for b in books))
        finally:
            for b in books:
                await b.engine.dispose()
        assert len({a.id for a in got}) == 1 and sum(a.created for a in got) == 1
        assert await count(book, notifications) == 1
        await consistent(book, got[0].id)

    async def test_a_bad_key_or_window_is_refused_before_anything_is_written(self, book: Book):
        """N13: the ownership arguments are checked like the others."""
        for bad in ({"idempotency_key": ""}, {"idempotency_key": 5}, {"obligation_key": ""},
                    {"obligation_key": "d", "obligation_window": -1}, {"obligation_window": 10}, {"principal": None}):
            with pytest.raises(NotificationInvalid):
                await send(book, **bad)
        assert await count(book, notifications) == 0

    # -- N15-N21 owners and followers -------------------------------------------------------------
    async def test_an_arrival_matching_a_live_owner_follows_it_and_is_not_work(self, book: Book, clock):
        """N15: the second arrival of one obligation is pending, linked to the owner and its generation,
        and not due (a pass never claims it); another mode or recipient is another obligation."""
        owner = await send(book, obligation_key="disk")
        follower = await send(book, "again", obligation_key="disk")
        row = await get_notification(book, follower.id)
        assert (row.status, row.obligation_owner_id, row.generation, row.next_attempt_at) == (
            "pending", owner.id, 1, None)
        assert follower.obligation_owner_id == owner.id
        assert (await send(book, mode="best_effort", obligation_key="disk")).obligation_owner_id != owner.id
        assert (await send(book, recipient="dba", obligation_key="disk")).obligation_owner_id != owner.id
        counts = await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["hang_before"])},
                                                 deadline=0.05)
        assert counts["claimed"] == 3  # the owner and the two other obligations' owners, not the follower
        await consistent(book, owner.id, follower.id)

    async def test_pending_ownership_survives_the_window(self, book: Book, clock):
        """N16: the window expired while the owner is still pending: a new arrival still follows it."""
        owner = await send(book, obligation_key="disk", obligation_window=60)
        clock.advance(3600)
        late = await send(book, "late", obligation_key="disk", obligation_window=60)
        assert late.obligation_owner_id == owner.id and late.status == "pending"

    async def test_a_follower_is_not_satisfied_while_its_owner_has_not_delivered(self, book: Book, clock):
        """N17: owner attempts fail and retry: the follower stays pending, never deduplicated."""
        owner = await send(book, obligation_key="disk")
        follower = await send(book, "again", obligation_key="disk")
        for _ in range(2):
            await one_pass(book, ["reject"])
            clock.advance(10)
            assert (await status(book, owner.id), await status(book, follower.id)) == ("pending", "pending")

    async def test_owner_success_satisfies_its_followers_in_its_own_transaction(self, book: Book, clock, monkeypatch):
        """N18: delivered owner -> followers deduplicated and the claim satisfied, in the owner's
        transaction: when satisfying the followers fails, the owner's delivery is not recorded either."""
        owner = await send(book, obligation_key="disk")
        followers = [(await send(book, f"again {i}", obligation_key="disk")).id for i in range(2)]
        real = ownership.owner_delivered

        async def broken(*args, **kwargs):
            raise RuntimeError("disk full")

        monkeypatch.setattr(ownership, "owner_delivered", broken)
        counts = await one_pass(book, ["success"])
        assert counts["delivered"] == 0
        assert [await status(book, i) for i in (owner.id, *followers)] == ["pending"] * 3
        monkeypatch.setattr(ownership, "owner_delivered", real)
        clock.advance(61)  # the stopped attempt's lease lapses; the next pass takes the owner again
        counts = await one_pass(book, ["success"])
        assert counts["delivered"] == 1
        assert [await status(book, i) for i in (owner.id, *followers)] == ["delivered", "deduplicated", "deduplicated"]
        assert (await claim_row(book)).status == "satisfied"
        await consistent(book, owner.id, *followers)

    async def test_a_failed_owner_never_suppresses_a_new_intake(self, book: Book, clock):
        """N19: an owner that failed with no follower releases the claim: the next arrival owns."""
        owner = await send(book, obligation_key="disk")
        await fail_cycle(book, clock)
        assert await status(book, owner.id) == "failed"
        assert (await claim_row(book)).status == "released"
        fresh = await send(book, "again", obligation_key="disk")
        assert (fresh.status, fresh.obligation_owner_id) == ("pending", fresh.id)
        assert (await get_notification(book, fresh.id)).generation == 2

    async def test_owner_failure_elects_the_oldest_follower_and_keeps_the_window(self, book: Book, clock):
        """N20: the oldest follower is promoted (higher generation, due now), the others follow it, the
        old owner records dedup_successor_id, and the claim's window is unchanged."""
        owner = await send(book, obligation_key="disk")
        clock.advance(1)
        oldest = await send(book, "first", obligation_key="disk")
        clock.advance(1)
        younger = await send(book, "second", obligation_key="disk")
        window = (await claim_row(book)).window_until
        await fail_cycle(book, clock)
        old = await get_notification(book, owner.id)
        new = await get_notification(book, oldest.id)
        other = await get_notification(book, younger.id)
        assert (old.status, old.dead_letter, old.dedup_successor_id) == ("failed", True, oldest.id)
        assert (new.status, new.obligation_owner_id, new.generation) == ("pending", oldest.id, 2)
        assert new.next_attempt_at is not None
        assert (other.obligation_owner_id, other.generation, other.next_attempt_at) == (oldest.id, 2, None)
        claim = await claim_row(book)
        assert (claim.owner_id, claim.generation, claim.window_until) == (oldest.id, 2, window)
        await consistent(book, owner.id, oldest.id, younger.id)

    async def test_after_a_delivered_window_expires_a_fresh_arrival_owns(self, book: Book, clock):
        """N21 (and N18 at intake): inside a delivered owner's window an arrival is deduplicated at once;
        after it, the arrival is a new owner with a higher generation and a new window."""
        owner = await send(book, obligation_key="disk", obligation_window=60)
        await one_pass(book, ["success"])
        inside = await send(book, "inside", obligation_key="disk", obligation_window=60)
        assert (inside.status, inside.obligation_owner_id) == ("deduplicated", owner.id)
        clock.advance(61)
        after = await send(book, "after", obligation_key="disk", obligation_window=60)
        assert (after.status, after.obligation_owner_id) == ("pending", after.id)
        claim = await claim_row(book)
        assert (claim.owner_id, claim.generation, claim.window_until) == (after.id, 2, clock.now() + 60)
        await consistent(book, owner.id, inside.id, after.id)

    async def test_an_old_owner_never_replaces_a_newer_claim(self, book: Book, clock):
        """N22: the claim names a newer owner (as after a replay): the old owner's failure settlement reads
        it in the same transaction and hands its followers to that owner; it elects nobody and leaves
        the claim alone."""
        old = await send(book, obligation_key="disk")
        follower = await send(book, "f", obligation_key="disk")
        newer = await send(book, "newer", channels=["slack"])  # a live notification to name as the owner
        row = await claim_row(book)
        moved = Command("dedup_claim", row.id, "owned", Reason("dedup_claim.owned.replayed", "test: a newer owner"),
                        ownership.OWNERSHIP_ACTOR, ("owned",), {"owner_id": old.id, "generation": 1},
                        {"owner_id": newer.id, "generation": 2})
        [outcome] = await apply_many(book, [moved])
        assert outcome.applied
        email = ScriptedChannel("email", ["reject"])
        for _ in range(3):  # only the old owner is attempted (no slack adapter: newer stays pending)
            await deliver_due_notifications(book, {"email": email}, deadline=FAST)
            clock.advance(10)
        assert await status(book, old.id) == "failed"
        assert (await get_notification(book, old.id)).dedup_successor_id is None
        f = await get_notification(book, follower.id)
        assert (f.status, f.obligation_owner_id, f.generation) == ("pending", newer.id, 2)
        claim = await claim_row(book)
        assert (claim.status, claim.owner_id, claim.generation) == ("owned", newer.id, 2)

    async def test_an_ownerless_claim_is_never_evidence_of_delivery(self, book: Book):
        """N23: a satisfied claim that names no owner (a lost association) does not deduplicate an
        arrival inside its window: the arrival owns the obligation."""
        owner = await send(book, obligation_key="disk")
        await one_pass(book, ["success"])
        row = await claim_row(book)
        lost = Command("dedup_claim", row.id, "owned", Reason("dedup_claim.owned.replayed", "test: owner lost"),
                       ownership.OWNERSHIP_ACTOR, ("satisfied",), {"owner_id": owner.id, "generation": 1},
                       {"owner_id": None})
        [outcome] = await apply_many(book, [lost])
        assert outcome.applied
        fresh = await send(book, "again", obligation_key="disk")
        assert (fresh.status, fresh.obligation_owner_id) == ("pending", fresh.id)

    async def test_reads_expose_the_canonical_obligation(self, book: Book):
        """N24: acceptance and reads carry obligation_owner_id (itself for an owner or a notification
        without an obligation key), effective_ack_status and ack_inherited (filled by part 3)."""
        plain = await send(book)
        owner = await send(book, obligation_key="disk")
        follower = await send(book, "again", obligation_key="disk")
        for accepted, expected in ((plain, plain.id), (owner, owner.id), (follower, owner.id)):
            row = await get_notification(book, accepted.id)
            assert accepted.obligation_owner_id == row.obligation_owner_id == expected
            assert (row.effective_ack_status, row.ack_inherited) == (None, False)

    async def test_acceptances_and_reads_agree_on_the_owner_s_response(self, book: Book, clock):
        """N24: for every owner status (pending; delivered without a response; delivered with its response
        pending, acked, dismissed or timed out) an acceptance — a new arrival, the idempotent repeat of
        that arrival, the idempotent repeat of the owner — carries the same obligation_owner_id,
        effective_ack_status and ack_inherited as get_notification of the same row."""
        from statebook.lifecycle import Actor
        from statebook.outbox.notifications import ack_notification, dismiss_notification
        from statebook.outbox.notifications.responses import expire_responses

        alice = Actor("operator", "alice")
        answers = {"pending": None, "none": None, "waiting": None, "acked": ack_notification,
                   "dismissed": dismiss_notification, "timed_out": None}
        timeouts = {"none": None, "timed_out": 30.0}
        owners = {k: await send(book, k, idempotency_key=f"{k}-owner", obligation_key=k, obligation_window=3600,
                                response_timeout=timeouts.get(k, 600.0)) for k in answers if k != "pending"}
        await one_pass(book, ["success"])  # every owner so far delivers; each with a timeout waits for an answer
        owners["pending"] = await send(book, "pending", idempotency_key="pending-owner", obligation_key="pending",
                                       obligation_window=3600, response_timeout=600.0)
        for k, answer in answers.items():
            if answer is not None:
                await answer(book, owners[k].id, actor=alice)
        clock.advance(31)
        assert (await expire_responses(book))["timed_out"] == 1
        want = {"pending": (None, "pending"), "none": (None, "deduplicated"), "waiting": ("pending", "deduplicated"),
                "acked": ("acked", "deduplicated"), "dismissed": ("dismissed", "deduplicated"),
                "timed_out": ("timed_out", "deduplicated")}
        for k, (ack, arrival_status) in want.items():
            owner = owners[k]
            arrival = await send(book, f"{k} again", idempotency_key=f"{k}-arrival", obligation_key=k, obligation_window=3600,
                                 response_timeout=600.0)
            repeat = await send(book, f"{k} again", idempotency_key=f"{k}-arrival", obligation_key=k, obligation_window=3600,
                                response_timeout=600.0)
            owner_again = await send(book, k, idempotency_key=f"{k}-owner", obligation_key=k, obligation_window=3600,
                                     response_timeout=timeouts.get(k, 600.0))
            assert (arrival.status, arrival.created, repeat.created, owner_again.id) == (arrival_status, True, False,
                                                                                        owner.id), k
            for accepted, inherited in ((arrival, True), (repeat, True), (owner_again, False)):
                row = await get_notification(book, accepted.id)
                said = (accepted.obligation_owner_id, accepted.effective_ack_status, accepted.ack_inherited)
                read = (row.obligation_owner_id, row.effective_ack_status, row.ack_inherited)
                assert said == read == (owner.id, ack, inherited and ack is not None), (k, accepted, read)

    async def test_an_intake_in_a_rolled_back_transaction_leaves_no_claim(self, book: Book):
        """N15: the claim is written in the intake's transaction: a caller's rollback takes both back."""
        with pytest.raises(RuntimeError):
            async with book.begin() as tx:
                await send(tx, obligation_key="disk")
                raise RuntimeError("the caller's own work failed")
        assert await claim_row(book) is None and await count(book, notifications) == 0
        owner = await send(book, obligation_key="disk")
        assert owner.obligation_owner_id == owner.id

    async def test_an_owner_whose_last_lease_lapsed_elects_its_successor_at_the_next_claim(self, book: Book, clock):
        """N20 (N2): the owner's worker died on its last attempt; the set claim that finds the lapsed lease
        fails it (dead letter) and elects its follower, counted as a dead letter, claim row first."""
        from statebook.outbox.notifications.delivery import claim, claim_due, scan_due

        owner = await send(book, obligation_key="disk")
        follower = await send(book, "again", obligation_key="disk")
        for _ in range(3):  # three claims whose leases all lapse (the worker never records an outcome)
            [candidate] = [c for c in await scan_due(book, now=clock.now()) if c.id == owner.id]
            assert await claim(book, candidate, now=clock.now()) is not None
            clock.advance(61)
        leases, counts = await claim_due(book, now=clock.now(), limit=10)
        assert (counts["dead_letter"], leases) == (1, [])
        leases, _ = await claim_due(book, now=clock.now(), limit=10)  # the successor is due now
        assert [lease.notification_id for lease in leases] == [follower.id]
        old = await get_notification(book, owner.id)
        assert (old.status, old.dead_letter, old.dedup_successor_id) == ("failed", True, follower.id)
        claim_now = await claim_row(book)
        assert (claim_now.owner_id, claim_now.generation) == (follower.id, 2)
        await consistent(book, owner.id, follower.id)
