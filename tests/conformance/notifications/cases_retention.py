"""Notifications, retention (specs/notifications.md N14, N30): explicit only, with a cutoff and a minimum
idempotency horizon; unsettled work, dead letters and linked obligations kept; every removal a tombstone,
every run recorded."""

from __future__ import annotations

import asyncio
import math

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect
from statebook.lifecycle import Actor, Book, Command, Reason, apply_many, history, verify
from statebook.lifecycle.facts import facts_table
from statebook.outbox.notifications import (
    NotificationInvalid, NotificationWorker, apply_notification_retention, get_notification, notification_attempts,
    send_notification,
)
from statebook.outbox.notifications import retention as retention_module
from statebook.outbox.notifications.buckets import ensure_bucket
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.schema import (
    channel_attempts, dedup_claims, notification_retention_runs, notifications,
)
from statebook.outbox.notifications.scripted import ScriptedChannel

DEADLINE = 5.0
"""The channels here answer at once; a generous adapter deadline keeps a loaded machine from turning an
answer into a retry."""
DAY = 86400.0
HORIZON = 7 * DAY


async def send(book: Book, text: str = "disk full", **kwargs):
    kwargs.setdefault("mode", "guaranteed")
    kwargs.setdefault("channels", ["email"])
    return await send_notification(book, recipient=kwargs.pop("recipient", "ops"), content={"text": text}, **kwargs)


async def one_pass(book: Book, script: list[str]) -> dict[str, int]:
    return await deliver_due_notifications(book, {"email": ScriptedChannel("email", script)}, deadline=DEADLINE)


async def count(book: Book, table: sa.Table) -> int:
    async with book.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar_one()


async def ids(book: Book, table: sa.Table) -> set[str]:
    async with book.read() as conn:
        return {r.id for r in await conn.execute(sa.select(table.c.id))}


async def fact_count(book: Book) -> int:
    return await count(book, facts_table)


async def runs(book: Book) -> list[dict]:
    t = notification_retention_runs
    async with book.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(sa.select(t).order_by(t.c.started_at, t.c.id))]


async def retain(book: Book, clock, **kwargs):
    kwargs.setdefault("before", clock.now() - HORIZON)
    return await apply_notification_retention(book, horizon=kwargs.pop("horizon", HORIZON), **kwargs)


async def everything_verifies(book: Book) -> None:
    for lc in book.registry:
        report = await verify(book, lc.entity_type)
        assert report.ok, (lc.entity_type, report)


async def relink(book: Book, notification_id: str, **patch) -> None:
    """A pending notification's link columns set through the engine (a state the ownership rules reach
    over several steps, written here in one)."""
    row = await get_notification(book, notification_id)
    guards = {"obligation_owner_id": None if row.obligation_owner_id == row.id else row.obligation_owner_id}
    [outcome] = await apply_many(book, [Command(
        "notification", notification_id, "pending", Reason("notification.pending.relinked", "test link"),
        Actor("system", "test"), ("pending",), guards, patch)])
    assert outcome.applied


class NotificationRetentionCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    # -- N30: explicit, with a cutoff and a horizon ------------------------------------------------
    async def test_a_cutoff_younger_than_the_horizon_is_refused_and_nothing_is_written(self, book: Book, clock):
        """N30: before > now - horizon is refused (rule "horizon"); so are bad arguments; nothing written."""
        await send(book)
        await one_pass(book, ["success"])
        clock.advance(30 * DAY)
        facts = await fact_count(book)
        with pytest.raises(NotificationInvalid) as refused:
            await apply_notification_retention(book, before=clock.now() - HORIZON + 1, horizon=HORIZON)
        assert (refused.value.argument, refused.value.rule) == ("before", "horizon")
        now = clock.now()
        for bad in ({"before": None}, {"before": math.nan}, {"before": "yesterday"}, {"horizon": -1.0},
                    {"horizon": 0}, {"horizon": math.inf}, {"horizon": "7d"}, {"dry_run": "yes"},
                    {"actor": "ops"}, {"progress": 5}):
            args = {"before": now - HORIZON, "horizon": HORIZON, **bad}
            with pytest.raises(NotificationInvalid):
                await apply_notification_retention(book, **args)
        with pytest.raises(NotificationInvalid):
            await apply_notification_retention(object(), before=now - HORIZON,  # type: ignore[arg-type]
                                               horizon=HORIZON)
        async with book.begin() as tx:
            with pytest.raises(NotificationInvalid, match="unbound"):
                await apply_notification_retention(tx, before=now - HORIZON, horizon=HORIZON)
        assert await fact_count(book) == facts and await runs(book) == []
        assert await count(book, notifications) == 1

    async def test_no_worker_or_pass_removes_anything(self, book: Book, clock):
        """N30: no purge happens by itself: delivery passes and a NotificationWorker over old settled
        notifications leave every row and fact in place."""
        for i in range(3):
            await send(book, f"n{i}")
        await one_pass(book, ["success", "success", "success"])
        clock.advance(365 * DAY)
        rows, facts = await ids(book, notifications), await fact_count(book)
        worker = NotificationWorker(book, {"email": ScriptedChannel("email", ["success"])}, tick_seconds=0.01,
                                    deadline=DEADLINE)
        task = asyncio.create_task(worker.run_until_stopped())
        try:
            await asyncio.wait_for(worker.idle.wait(), 5)
            worker.wake()
            await asyncio.sleep(0.05)
            await asyncio.wait_for(worker.idle.wait(), 5)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)
        assert worker.passes >= 1
        await one_pass(book, ["success"])
        assert await ids(book, notifications) == rows and await fact_count(book) == facts
        assert await runs(book) == []

    # -- N30: what stays -----------------------------------------------------------------------------
    async def test_unsettled_work_and_unresolved_dead_letters_are_kept(self, book: Book, clock):
        """N30: pending and rate_limited notifications and a dead letter (failed, dead_letter set) stay
        however old; a delivered one and a best-effort failure (no dead letter) go."""
        delivered = await send(book, "ok")
        await one_pass(book, ["success"])
        best_effort = await send(book, "be", mode="best_effort")
        await one_pass(book, ["reject"])
        dead = await send(book, "dead")
        for _ in range(3):
            await one_pass(book, ["reject"])
            clock.advance(10)
        await ensure_bucket(book, "email", "all", capacity=1, refill_per_second=1e-6)
        spent, limited = await send(book, "a"), await send(book, "b")
        await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["success"])}, deadline=DEADLINE,
                                        concurrency=1)
        statuses = {i: (await get_notification(book, i)).status for i in (spent.id, limited.id)}
        assert sorted(statuses.values()) == ["delivered", "rate_limited"]
        pending = await send(book, "later", channels=["slack"])  # no slack adapter in these passes: stays pending
        clock.advance(30 * DAY)
        report = await retain(book, clock)
        assert (await get_notification(book, dead.id)).dead_letter is True
        kept = {i for i in (dead.id, pending.id, *statuses) if statuses.get(i, "") != "delivered"}
        assert kept <= await ids(book, notifications)
        gone = {delivered.id, best_effort.id} | {i for i, s in statuses.items() if s == "delivered"}
        assert set(report.notifications) == gone and not gone & await ids(book, notifications)
        protected = report.counts["notification"]["protected_by"]
        assert (protected["unsettled"], protected["dead_letter"]) == (2, 1)
        await everything_verifies(book)

    async def test_obligations_linked_to_unsettled_ones_are_kept(self, book: Book, clock):
        """N30: a settled notification stays while an unsettled one names it as its owner or replay, while
        it names an unsettled successor, or while an ``owned`` claim names it; once the successor
        settles, the next run removes its old owner."""
        named_owner, named_replay, claimant, plain = [(await send(book, t)).id for t in ("x", "y", "c", "z")]
        await one_pass(book, ["success"] * 4)
        owner = await send(book, "owner", mode="best_effort", obligation_key="disk")
        follower = await send(book, "follower", mode="best_effort", obligation_key="disk")
        await one_pass(book, ["reject"])  # the owner fails (best effort): its follower is elected successor
        old = await get_notification(book, owner.id)
        assert (old.status, old.dead_letter, old.dedup_successor_id) == ("failed", False, follower.id)
        assert (await get_notification(book, follower.id)).status == "pending"
        clock.advance(30 * DAY)
        linker = (await send(book, "l", channels=["slack"])).id  # no slack adapter: pending, unsettled
        replayer = (await send(book, "r", channels=["slack"])).id
        await relink(book, linker, obligation_owner_id=named_owner)
        await relink(book, replayer, replayed_in=named_replay)
        async with book.read() as conn:
            claim = (await conn.execute(sa.select(dedup_claims))).one()
        [moved] = await apply_many(book, [Command(
            "dedup_claim", claim.id, "owned", Reason("dedup_claim.owned.acquired", "test owner"),
            Actor("system", "test"), ("owned",), {"owner_id": claim.owner_id, "generation": claim.generation},
            {"owner_id": claimant, "generation": claim.generation + 1})])
        assert moved.applied
        report = await retain(book, clock)
        left = await ids(book, notifications)
        assert {owner.id, named_owner, named_replay, claimant} <= left
        assert report.notifications == (plain,)
        by = report.counts["notification"]["protected_by"]
        assert {k: by.get(k) for k in ("linked", "links_unsettled", "owns_claim")} == {
            "linked": 2, "links_unsettled": 1, "owns_claim": 1}
        await one_pass(book, ["success"])  # the successor delivers
        assert (await get_notification(book, follower.id)).status == "delivered"
        clock.advance(30 * DAY)
        report = await retain(book, clock)
        assert set(report.notifications) == {owner.id, follower.id}  # the old owner, and its settled successor
        assert {named_owner, named_replay, claimant} <= await ids(book, notifications)
        await everything_verifies(book)

    async def test_a_satisfied_claim_with_an_open_window_keeps_its_owner(self, book: Book, clock):
        """N30: a delivered owner whose claim's window is still open stays (arrivals are still
        deduplicated against it), its settled follower goes; after the window, the owner and a late
        arrival deduplicated against it go, the claim stays (its id is never reused), and a fresh
        arrival owns the obligation again."""
        owner = await send(book, obligation_key="disk", obligation_window=60 * DAY)
        follower = await send(book, "again", obligation_key="disk", obligation_window=60 * DAY)
        await one_pass(book, ["success"])
        assert (await get_notification(book, follower.id)).status == "deduplicated"
        clock.advance(30 * DAY)
        report = await retain(book, clock)
        assert report.notifications == (follower.id,)  # a settled follower goes; its owner stays
        assert owner.id in await ids(book, notifications)
        assert report.counts["notification"]["protected_by"]["open_window"] == 1
        assert await count(book, dedup_claims) == 1
        late = await send(book, "late", obligation_key="disk", obligation_window=60 * DAY)
        assert (late.status, late.obligation_owner_id) == ("deduplicated", owner.id)
        clock.advance(61 * DAY)
        report = await retain(book, clock)
        assert {owner.id, late.id} == set(report.notifications)
        assert await count(book, dedup_claims) == 1
        fresh = await send(book, "fresh", obligation_key="disk", obligation_window=60 * DAY)
        assert (fresh.status, fresh.obligation_owner_id) == ("pending", fresh.id)
        await everything_verifies(book)

    # -- N14: idempotency holds while its record is retained -------------------------------------------
    async def test_the_idempotency_record_is_kept_before_the_horizon_then_a_same_key_intake_is_new(self, book: Book,
                                                                                                  clock):
        """N14: within the horizon no run can remove the record (the cutoff is refused, and a cutoff at
        the horizon leaves it): the same key returns the original. Once removed, the same key is a
        new notification."""
        first = await send(book, principal="svc", source="alerts", idempotency_key="k1")
        await one_pass(book, ["success"])
        clock.advance(HORIZON - 1)
        with pytest.raises(NotificationInvalid):
            await apply_notification_retention(book, before=clock.now(), horizon=HORIZON)
        report = await retain(book, clock)  # the cutoff at the horizon: the record is younger
        assert report.notifications == ()
        again = await send(book, principal="svc", source="alerts", idempotency_key="k1")
        assert (again.id, again.created) == (first.id, False)
        clock.advance(2)
        report = await retain(book, clock)
        assert report.notifications == (first.id,)
        fresh = await send(book, principal="svc", source="alerts", idempotency_key="k1")
        assert fresh.created and fresh.id != first.id
        await everything_verifies(book)

    # -- N30: the record ---------------------------------------------------------------------------------
    async def test_removals_leave_tombstones_and_the_run_records_its_counts(self, book: Book, clock):
        """N30: each removed notification and channel attempt ends its history with a retention
        tombstone (claims stay); the run is a notification_retention entity, running then completed, with its counts."""
        owner = await send(book, obligation_key="disk", obligation_window=60)
        await one_pass(book, ["success"])
        attempts = [a.id for a in await notification_attempts(book, owner.id)]
        clock.advance(30 * DAY)
        report = await retain(book, clock, actor=Actor("operator", "alice"))
        assert report.notifications == (owner.id,) and report.channel_attempts == tuple(attempts)
        assert not report.dry_run and await count(book, dedup_claims) == 1
        for entity_type, entity_id in (("notification", owner.id), ("channel_attempt", attempts[0])):
            last = (await history(book, entity_type, entity_id))[-1]
            assert (last.status, last.reason_code) == (None, f"{entity_type}.purged.retention")
            assert (last.actor_type, last.actor_id) == ("operator", "alice")
        [run] = await runs(book)
        assert (run["id"], run["status"], run["dry_run"], run["cutoff"], run["horizon"]) == (
            report.run_id, "completed", 0, clock.now() - HORIZON, HORIZON)
        assert run["counts"] == report.counts
        assert {k: v["removed"] for k, v in run["counts"].items()} == {
            "notification": 1, "channel_attempt": 1, "notification_response": 0}
        assert [f.status for f in await history(book, "notification_retention", run["id"])] == ["running", "completed"]
        await everything_verifies(book)

    async def test_a_failing_run_is_recorded_failed_with_its_error(self, book: Book, clock, monkeypatch):
        """N30: an error inside the run moves its record to failed with the error, and is raised."""
        await send(book)
        await one_pass(book, ["success"])
        clock.advance(30 * DAY)

        async def broken(*args, **kwargs):
            raise RuntimeError("disk full")

        monkeypatch.setattr(retention_module, "purge_many", broken)
        with pytest.raises(RuntimeError, match="disk full"):
            await retain(book, clock)
        [run] = await runs(book)
        assert (run["status"], run["error"]) == ("failed", "RuntimeError: disk full")
        assert await count(book, notifications) == 1

    async def test_a_dry_run_removes_nothing_and_is_recorded(self, book: Book, clock):
        """N30: a dry run writes only its run record (dry_run = 1); its report lists exactly what the real
        run then removes."""
        owner = await send(book, obligation_key="disk", obligation_window=60)
        follower = await send(book, "again", obligation_key="disk", obligation_window=60)
        await one_pass(book, ["success"])
        await send(book, "waiting", channels=["slack"])
        clock.advance(30 * DAY)
        rows = {t.name: await ids(book, t) for t in (notifications, channel_attempts, dedup_claims)}
        dry = await retain(book, clock, dry_run=True)
        assert {t.name: await ids(book, t) for t in (notifications, channel_attempts, dedup_claims)} == rows
        assert set(dry.notifications) == {owner.id, follower.id} and dry.dry_run
        real = await retain(book, clock)
        assert (set(real.notifications), real.channel_attempts) == (set(dry.notifications), dry.channel_attempts)
        assert sorted((r["id"] == dry.run_id, r["dry_run"], r["status"]) for r in await runs(book)) == [
            (False, 0, "completed"), (True, 1, "completed")]
        assert dry.counts["notification"] == real.counts["notification"]

    async def test_batches_report_progress_and_every_type_verifies(self, book: Book, clock, monkeypatch):
        """N30: the run lists once and removes a batch per transaction, reporting progress; afterwards
        verify() holds for every entity type."""
        monkeypatch.setattr(retention_module, "PURGE_BATCH", 2)
        made = [(await send(book, f"n{i}")).id for i in range(5)]
        await one_pass(book, ["success"] * 5)
        clock.advance(30 * DAY)
        seen: list[tuple[int, int]] = []
        report = await retain(book, clock, progress=lambda done, total: seen.append((done, total)))
        assert sorted(report.notifications) == sorted(made) and seen == [(2, 5), (4, 5), (5, 5)]
        await everything_verifies(book)

    # -- N30: a race on real connections -----------------------------------------------------------------
    async def test_retention_racing_intakes_never_removes_an_owner_a_follower_links_to(self, book: Book, clock,
                                                                                     db_url, backend):
        """N30: retention runs while arrivals of old owners' obligations commit on other connections: one
        owner's window is open (arrivals are deduplicated against it), the other's has passed (arrivals
        own the obligation anew, then follow). Afterwards every link names a notification that exists,
        every claim's owner exists, and the history verifies."""
        if backend != "postgres":
            pytest.skip("real concurrent connections: PostgreSQL")
        open_owner = await send(book, obligation_key="open", obligation_window=60 * DAY)
        closed_owner = await send(book, obligation_key="closed", obligation_window=60)
        await one_pass(book, ["success", "success"])
        clock.advance(30 * DAY)
        books = [Book(connect(db_url), book.registry, clock) for _ in range(4)]

        async def arrivals(b: Book, n: int) -> None:
            for i in range(12):
                await send(b, f"{n}-{i}", obligation_key="open" if i % 2 else "closed", obligation_window=60 * DAY)

        async def retention(b: Book) -> None:
            for _ in range(6):
                await apply_notification_retention(b, before=clock.now() - HORIZON, horizon=HORIZON)
                await asyncio.sleep(0)

        try:
            await asyncio.gather(*(arrivals(b, n) for n, b in enumerate(books[:3])), retention(books[3]))
        finally:
            for b in books:
                await b.engine.dispose()
        present = await ids(book, notifications)
        assert open_owner.id in present
        async with book.read() as conn:
            links = [r for r in await conn.execute(sa.select(notifications.c.id, notifications.c.obligation_owner_id))]
            owners = [r.owner_id for r in await conn.execute(sa.select(dedup_claims.c.owner_id))]
        assert all(r.obligation_owner_id in present for r in links if r.obligation_owner_id is not None)
        assert all(o in present for o in owners if o is not None)
        assert closed_owner.id not in present or any(r.obligation_owner_id == closed_owner.id for r in links)
        await everything_verifies(book)

    async def test_a_pending_response_keeps_its_notification_and_an_answered_one_goes_with_it(self, book: Book, clock):
        """N30 (N31): a delivered notification still waiting for a human is live work and stays; one whose
        response was answered is removed with its response (a tombstone each)."""
        from statebook.outbox.notifications import ack_notification, get_response
        from statebook.outbox.notifications.schema import notification_responses

        waiting = (await send(book, "waiting", response_timeout=30 * DAY)).id
        answered = (await send(book, "answered", response_timeout=30 * DAY)).id
        await one_pass(book, ["success"])
        await ack_notification(book, answered, actor=Actor("operator", "alice"))
        clock.advance(HORIZON + DAY)
        report = await retain(book, clock)
        assert report.notifications == (answered,) and report.notification_responses == (answered,)
        assert report.counts["notification"]["protected_by"].get("response_pending") == 1
        assert await ids(book, notification_responses) == {waiting}
        assert (await get_response(book, waiting)).status == "pending"
        assert (await history(book, "notification_response", answered))[-1].reason_code == \
            "notification_response.purged.retention"
        await everything_verifies(book)
