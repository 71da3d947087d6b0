"""Notifications, recovery (specs/notifications.md N25-N29): the dead-letter view, replay and resolve,
and ownership under racing intakes, replays and owner failures on separate connections."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect
from statebook.lifecycle import Actor, Book, history, verify
from statebook.outbox.notifications import (
    NotificationInvalid, RecoveryRefused, get_notification, list_dead_letters, notification_attempts, replay_notification,
    resolve_notification, send_notification,
)
from statebook.outbox.notifications import recovery
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.ownership import dedup_claim_id
from statebook.outbox.notifications.schema import dedup_claims, notifications
from statebook.outbox.notifications.scripted import ScriptedChannel

FAST = 2.0
"""The adapter deadline of these passes (real seconds): their scripted channels answer at once, so it only
has to be long enough on a loaded machine."""
ALICE = Actor("operator", "alice")


async def send(book: Book, text: str = "disk full", **kwargs):
    kwargs.setdefault("mode", "guaranteed")
    kwargs.setdefault("channels", ["email"])
    return await send_notification(book, recipient="ops", content={"text": text}, **kwargs)


async def row(book: Book, nid: str) -> dict:
    found = await get_notification(book, nid)
    assert found is not None
    return found


async def claim(book: Book, key: str = "disk"):
    async with book.read() as conn:
        return (await conn.execute(sa.select(dedup_claims).where(
            dedup_claims.c.id == dedup_claim_id("ops", key, "guaranteed")))).first()


async def passes(book: Book, clock, step: str, n: int = 3) -> None:
    for _ in range(n):
        await deliver_due_notifications(book, {"email": ScriptedChannel("email", [step])}, deadline=FAST)
        clock.advance(10)


async def refused(book: Book, nid: str) -> RecoveryRefused:
    before = await row(book, nid)
    with pytest.raises(RecoveryRefused) as caught:
        await replay_notification(book, nid, actor=ALICE)
    assert (await row(book, nid)).version == before.version  # a refusal writes nothing
    return caught.value


async def clean(book: Book) -> None:
    for entity_type in ("notification", "dedup_claim", "channel_attempt"):
        report = await verify(book, entity_type)
        assert report.ok, report


class NotificationRecoveryCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_a_replay_keeps_identity_attempts_and_history_and_starts_a_new_cycle(self, book: Book, clock):
        """N25: same id, cumulative attempts kept, cycle 2 with a fresh budget, every earlier fact and
        observation kept; the next attempt is number 4, in cycle 2."""
        nid = (await send(book)).id
        await passes(book, clock, "reject")
        facts = [f.id for f in await history(book, "notification", nid)]
        done = await replay_notification(book, nid, actor=ALICE, note="pager fixed")
        assert (done.id, done.cycle, done.covered) == (nid, 2, ())
        r = await row(book, nid)
        assert (r.status, r.cycle, r.attempts, r.cycle_attempts, r.dead_letter) == ("pending", 2, 3, 0, False)
        after = await history(book, "notification", nid)
        assert [f.id for f in after][: len(facts)] == facts
        assert (after[-1].reason_code, after[-1].actor_type, after[-1].actor_id) == ("notification.pending.replayed", "operator", "alice")
        await passes(book, clock, "success", 1)
        seen = [(a.cycle, a.attempt, a.status) for a in await notification_attempts(book, nid)]
        assert seen == [(1, 1, "rejected"), (1, 2, "rejected"), (1, 3, "rejected"), (2, 4, "success")]
        assert (await row(book, nid)).status == "delivered"
        await clean(book)

    async def test_a_dead_letter_stays_in_view_until_resolved_or_replayed(self, book: Book, clock):
        """N26: reading the view changes nothing, however often and however late; resolve or replay
        takes a dead letter out of it; a best-effort failure is never in it."""
        kept, resolved, replayed = [(await send(book, str(i))).id for i in range(3)]
        await send(book, "be", mode="best_effort", channels=["email"])
        await passes(book, clock, "reject")
        versions = {nid: (await row(book, nid)).version for nid in (kept, resolved, replayed)}
        for _ in range(3):
            clock.advance(86_400 * 30)
            assert {r.id for r in await list_dead_letters(book)} == {kept, resolved, replayed}
        assert {nid: (await row(book, nid)).version for nid in versions} == versions
        await resolve_notification(book, resolved, reason="sent by hand", actor=ALICE)
        await replay_notification(book, replayed, actor=ALICE)
        assert [r.id for r in await list_dead_letters(book)] == [kept]

    async def test_a_replay_is_refused_while_a_successor_holds_the_obligation(self, book: Book, clock):
        """N27: a successor pending, then delivered, blocks the replay of the failed owner; the view and
        the refusal give the successor and the reason as data."""
        owner = (await send(book, obligation_key="disk")).id
        successor = (await send(book, "again", obligation_key="disk")).id
        await passes(book, clock, "reject")
        assert (await row(book, owner)).dedup_successor_id == successor
        caught = await refused(book, owner)
        assert (caught.reason, caught.blocked_by) == ("successor_pending", successor)
        [view] = await list_dead_letters(book)
        assert (view.id, view.replay_block_reason, view.replay_blocked_by) == (owner, "successor_pending", successor)
        await passes(book, clock, "success", 1)
        caught = await refused(book, owner)
        assert (caught.reason, caught.blocked_by) == ("successor_delivered", successor)

    async def test_a_replay_is_refused_while_another_current_owner_holds_the_obligation(self, book: Book, clock):
        """N27: the failed owner released the claim and a fresh arrival owns it: pending blocks the
        replay, delivered blocks it inside the window, and after the window the replay is accepted."""
        old = (await send(book, obligation_key="disk", obligation_window=600)).id
        await passes(book, clock, "reject")
        new = (await send(book, "new", obligation_key="disk", obligation_window=600)).id
        caught = await refused(book, old)
        assert (caught.reason, caught.blocked_by) == ("owner_pending", new)
        await passes(book, clock, "success", 1)
        caught = await refused(book, old)
        assert (caught.reason, caught.blocked_by) == ("owner_delivered_in_window", new)
        clock.advance(601)
        assert (await replay_notification(book, old, actor=ALICE)).cycle == 2

    async def test_a_rate_limited_owner_blocks_a_replay_of_the_failed_former_owner(self, book: Book, clock):
        """N27: the current owner waiting in rate_limited (its channel's bucket emptied) still holds the
        obligation: the replay of the failed former owner is refused as owner_pending naming it, in the
        refusal and in the dead-letter view, until it delivers (then owner_delivered_in_window)."""
        from statebook.outbox.notifications.buckets import draw, ensure_bucket

        old = (await send(book, obligation_key="disk", obligation_window=600)).id
        await passes(book, clock, "reject")
        new = (await send(book, "new", obligation_key="disk", obligation_window=600)).id
        await ensure_bucket(book, "email", "all", capacity=1, refill_per_second=0.01)
        async with book.begin() as tx:
            assert await draw(tx, "email", "all", now=clock.now()) == 0.0  # the bucket is empty now
        counts = await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["success"])}, deadline=FAST)
        assert (counts["rate_limited"], (await row(book, new)).status) == (1, "rate_limited")
        caught = await refused(book, old)
        assert (caught.reason, caught.blocked_by) == ("owner_pending", new)
        [view] = await list_dead_letters(book)
        assert (view.id, view.replay_block_reason, view.replay_blocked_by) == (old, "owner_pending", new)
        clock.advance(100)  # the token is back
        await passes(book, clock, "success", 1)
        assert (await row(book, new)).status == "delivered"
        assert (await refused(book, old)).reason == "owner_delivered_in_window"
        await clean(book)

    async def test_a_replay_takes_ownership_and_covers_failed_descendants_in_one_transaction(
            self, book: Book, clock, monkeypatch):
        """N28: replaying the first owner of a chain whose successor also failed: the claim names it with a
        higher generation and a new window, the successor is covered (replayed_in, out of the view) and
        can never be replayed, also after the replayed owner delivered and its window passed. When
        covering fails, nothing of the replay is written."""
        first = (await send(book, obligation_key="disk", obligation_window=60)).id
        second = (await send(book, "2", obligation_key="disk", obligation_window=60)).id
        await passes(book, clock, "reject")  # first fails; second succeeds it
        await passes(book, clock, "reject")  # second fails; no follower: the claim is released
        before = await claim(book)
        assert (before.status, before.generation) == ("released", 2)

        async def broken(*args, **kwargs):
            raise RuntimeError("disk full")

        real = recovery._cover_descendants
        monkeypatch.setattr(recovery, "_cover_descendants", broken)
        with pytest.raises(RuntimeError):
            await replay_notification(book, first, actor=ALICE)
        assert (await row(book, first)).status == "failed" and (await claim(book)).version == before.version
        monkeypatch.setattr(recovery, "_cover_descendants", real)
        done = await replay_notification(book, first, actor=ALICE)
        assert done.covered == (second,)
        now = clock.now()
        after = await claim(book)
        assert (after.status, after.owner_id, after.generation, after.window_until) == ("owned", first, 3, now + 60)
        s = await row(book, second)
        assert (s.status, s.dead_letter, s.replayed_in) == ("failed", False, first)
        assert [r.id for r in await list_dead_letters(book)] == []
        assert (await refused(book, second)).reason == "covered_by_replay"
        await passes(book, clock, "success", 1)
        clock.advance(3600)
        assert (await refused(book, second)).reason == "covered_by_replay"
        await clean(book)

    async def test_an_operator_resolves_a_failure_with_actor_and_reason(self, book: Book, clock):
        """N29: resolve is an audited operator transition (actor, time, reason), refused for anything but an
        unresolved dead letter and for a non-operator; reads never clear the flag; there is no force."""
        nid = (await send(book)).id
        await passes(book, clock, "reject")
        with pytest.raises(NotificationInvalid):
            await resolve_notification(book, nid, reason="x", actor=Actor("system", "cron"))
        with pytest.raises(NotificationInvalid):
            await resolve_notification(book, nid, reason="  ", actor=ALICE)
        resolved = await resolve_notification(book, nid, reason="called the on-call engineer", actor=ALICE)
        assert (resolved.status, resolved.dead_letter, resolved.resolved_by, resolved.resolution,
                resolved.resolved_at.timestamp()) == ("failed", False, "operator:alice", "called the on-call engineer", clock.now())
        last = (await history(book, "notification", nid))[-1]
        assert (last.reason_code, last.reason_summary, last.actor_type, last.actor_id, last.at) == (
            "notification.failed.resolved", "called the on-call engineer", "operator", "alice", clock.now())
        with pytest.raises(RecoveryRefused):
            await resolve_notification(book, nid, reason="again", actor=ALICE)
        assert (await refused(book, nid)).reason == "resolved"
        for api in (replay_notification, resolve_notification):
            assert "force" not in inspect.signature(api).parameters

    async def test_racing_replays_of_one_failure_apply_once(self, book: Book, db_url, clock):
        """N28: operators replaying one failure at once on separate connections: one replay applies, the
        others are refused; one new cycle."""
        nid = (await send(book, obligation_key="disk")).id
        await passes(book, clock, "reject")
        books = [Book(connect(db_url), book.registry, clock) for _ in range(4)]
        try:
            got = await asyncio.gather(*(replay_notification(b, nid, actor=ALICE) for b in books),
                                       return_exceptions=True)
        finally:
            for b in books:
                await b.engine.dispose()
        assert sum(not isinstance(g, BaseException) for g in got) == 1, got
        assert all(isinstance(g, RecoveryRefused) for g in got if isinstance(g, BaseException)), got
        r = await row(book, nid)
        assert (r.status, r.cycle) == ("pending", 2)
        await clean(book)

    async def test_racing_intakes_replays_and_owner_failures_keep_one_live_owner(self, book: Book, db_url, clock):
        """N15, N20, N27: intakes of one obligation, a replay of its failed first owner and the failing
        attempts of its current owner, at once on separate connections: afterwards the claim names
        exactly one live owner and every pending follower follows it."""
        first = (await send(book, obligation_key="disk", obligation_window=0)).id
        await passes(book, clock, "reject")  # first fails, no follower: released
        second = (await send(book, "2", obligation_key="disk", obligation_window=0)).id
        await passes(book, clock, "reject", 2)  # second is on its last attempt
        books = [Book(connect(db_url), book.registry, clock) for _ in range(5)]
        try:
            work = [send(b, f"late {i}", obligation_key="disk", obligation_window=0) for i, b in enumerate(books[:3])]
            work.append(replay_notification(books[3], first, actor=ALICE))
            work.append(deliver_due_notifications(books[4], {"email": ScriptedChannel("email", ["reject"])},
                                                  deadline=FAST))
            got = await asyncio.gather(*work, return_exceptions=True)
        finally:
            for b in books:
                await b.engine.dispose()
        assert all(not isinstance(g, BaseException) or isinstance(g, RecoveryRefused) for g in got), got
        c = await claim(book)
        async with book.read() as conn:
            rows = [dict(r._mapping) for r in await conn.execute(sa.select(notifications))]
        live_owners = [r for r in rows if r["status"] in ("pending", "rate_limited") and r["obligation_owner_id"] is None]
        assert len(live_owners) <= 1, live_owners
        if live_owners:
            assert (c.status, c.owner_id) == ("owned", live_owners[0]["id"])
        for r in rows:
            if r["status"] == "pending" and r["obligation_owner_id"] is not None:
                assert live_owners and r["obligation_owner_id"] == c.owner_id and r["generation"] == c.generation
        assert second in {r["id"] for r in rows}
        await clean(book)
