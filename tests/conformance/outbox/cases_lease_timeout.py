"""O21: a send starts only while its lease has at least the transport timeout left, and the lease is
always derived from the transport timeout (issue 9, hole 2.1).

The clock is the book's FakeClock; a "slow" send is one that advances it while it runs, so a pass
sees exactly the durations the test scripts, and no assertion depends on real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections import Counter

from statebook.adapters.daemon import Delivery
from statebook.adapters.db import open_book
from statebook.adapters.settings import Settings
from statebook.lifecycle import Book, Registry, verify
from statebook.lifecycle.sweep import sweep
from statebook.outbox import (
    CallableTransport,
    DISPATCH,
    TransportResult,
    deliver_due_dispatches,
    enqueue_dispatch,
    list_dispatches,
)
from statebook.outbox.dispatch.attempts import scan
from statebook.outbox.dispatch.delivery import run_leases
from statebook.outbox.dispatch.steps import claim, execute, finalize, release
from statebook.outbox.dispatch.transport import NOTIFY_TIMEOUT_SECONDS
from statebook.outbox.dispatch.policy import DISPATCH_V1, DISPATCH_V2
from statebook.scheduler import SCHEDULE, SCHEDULE_RUN

from .support import Recorder, facts, row

SEND_SECONDS = 4.0
"""Longer than a fifth of the 15 s default lease: five queued 4 s sends outlive one lease."""


def _id(payload: str) -> str:
    return json.loads(payload)["dispatch_id"]


class LeaseTimeoutCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_a_second_worker_after_the_lease_lapses_sends_nothing_twice(self, book, clock, db_url):
        """O21, O5 (issue 9 hole 2.1): worker A runs batch 5 at concurrency 1 with 4-second sends;
        worker B, another engine on the same database, passes once the clock is past 15.5 s. Every send
        starts on a row that is ``delivering`` with at least the transport timeout left of its lease,
        and no dispatch is sent twice. On the old code A claimed all five for 15 s; its third and fourth
        sends started with 7 s and 3 s left, B re-sent the fourth (still in A's hands) and the fifth
        (queued behind A's gate), and A then sent the fifth again on a row already ``delivered``."""
        t0 = clock.now()
        ids = [await enqueue_dispatch(book, kind="k", deliver_to=f"seat-{i}") for i in range(5)]
        sends: list[tuple[str, str]] = []
        late: list[tuple[str, str, str, float]] = []
        other = await open_book(db_url, clock=clock)
        second_pass_ran = False

        async def starting(who: str, payload: str) -> None:
            did = _id(payload)
            sends.append((who, did))
            r = await row(book, did)
            left = r.next_attempt_at.timestamp() - clock.now()
            if r.status != "delivering" or left < NOTIFY_TIMEOUT_SECONDS:
                late.append((who, did, r.status, left))

        async def worker_b(_to: str, payload: str) -> None:
            await starting("B", payload)

        async def worker_a(_to: str, payload: str) -> None:
            nonlocal second_pass_ran
            await starting("A", payload)
            clock.advance(SEND_SECONDS)
            if clock.now() >= t0 + 15.5 and not second_pass_ran:
                second_pass_ran = True
                await deliver_due_dispatches(other, transport=CallableTransport(worker_b), batch_size=5, concurrency=1)

        try:
            await deliver_due_dispatches(book, transport=CallableTransport(worker_a), batch_size=5, concurrency=1)
            assert second_pass_ran
            for _ in range(3):  # whatever is left: after every lease has lapsed
                clock.advance(60)
                await deliver_due_dispatches(other, transport=CallableTransport(worker_b), batch_size=5, concurrency=1)
        finally:
            await other.engine.dispose()

        assert late == []
        assert Counter(did for _, did in sends) == Counter(ids)  # each exactly once
        assert {(await row(book, did)).status for did in ids} == {"delivered"}
        assert (await verify(book, "dispatch")).ok

    async def test_a_pass_claims_no_more_than_it_can_start(self, book, clock):
        """O21, O12: with sends seen to be slow, a pass claims no more than its free send slots, so no
        lease waits behind the concurrency gate while it runs down: whenever a send starts, every
        ``delivering`` row is one whose send has started."""
        for i in range(6):
            await enqueue_dispatch(book, kind="k", deliver_to=f"seat-{i}")
        started: set[str] = set()
        waiting: list[set[str]] = []

        async def slow(_to: str, payload: str) -> None:
            started.add(_id(payload))
            waiting.append({r.id for r in await list_dispatches(book, status="delivering")} - started)
            await asyncio.sleep(0)
            clock.advance(SEND_SECONDS)

        counts = await deliver_due_dispatches(book, transport=CallableTransport(slow), batch_size=6, concurrency=2)
        assert counts["attempted"] == counts["delivered"] == 6
        assert waiting == [set()] * 6

    async def test_a_lease_without_the_timeout_left_is_not_sent_and_is_released(self, book, clock):
        """O21, O5: a lease that waited until less than the transport timeout is left is skipped, not
        sent, and released by ONE fact ``delivering -> pending`` (``dispatch.pending.released``): the row
        is pending with its attempt given back (0, not 1) and due now. A later pass sends it once, as
        attempt 1 again. (Before the release the row stayed delivering, attempt 1, until its lease.)"""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        [candidate] = await scan(book, now=clock.now())
        lease = await claim(book, candidate, now=clock.now())
        assert lease is not None
        clock.advance(lease.lease_until - clock.now() - NOTIFY_TIMEOUT_SECONDS + 0.5)  # 9.5 s left of the lease
        assert await execute(lease, Recorder().transport, now=clock.now()) is None
        rec = Recorder()
        counts = await run_leases(book, [lease], rec.transport)
        assert rec.calls == [] and counts["delivered"] == counts["retried"] == counts["dead_letter"] == 0
        r = await row(book, did)
        assert (r.status, r.attempt, r.next_attempt_at.timestamp()) == ("pending", 0, clock.now())
        released = (await facts(book, did))[2:]
        assert [(f.previous_status, f.status, f.reason_code) for f in released] == [
            ("delivering", "pending", "dispatch.pending.released")]
        assert released[0].patch == {"attempt": 0, "next_attempt_at": clock.now()}
        assert "attempt 1 had 9.5 s left" in released[0].reason_summary and "not sent" in released[0].reason_summary
        assert (await verify(book, "dispatch")).ok

        counts = await deliver_due_dispatches(book, transport=rec.transport)  # due now: no wait for the lease
        assert counts["delivered"] == 1 and rec.ids() == [did]
        claimed, delivered = (await facts(book, did))[3:]
        assert (claimed.reason_code, claimed.patch["attempt"]) == ("dispatch.delivering.attempt", 1)
        assert (delivered.reason_code, delivered.patch["attempt"]) == ("dispatch.delivered.transport_ok", 1)
        assert (await row(book, did)).attempt == 1

    async def test_a_skipped_lease_of_the_only_attempt_is_sent_later_not_dead_lettered(self, book, clock):
        """O21, O9, O20: with ``max_attempts=1``, a lease skipped at its start check does not use up the
        one allowed attempt: a later pass (even one past the old lease) sends the dispatch, which is
        delivered. Before the release the lapsed lease was settled to dead_letter, never sent."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=1)
        lease = await claim(book, (await scan(book, now=clock.now()))[0], now=clock.now())
        assert lease is not None
        clock.advance(lease.lease_until - clock.now() - 1.0)  # 1 s left, less than the 10 s timeout
        rec = Recorder()
        await run_leases(book, [lease], rec.transport)
        assert rec.calls == []
        clock.set(lease.lease_until + 1)
        counts = await deliver_due_dispatches(book, transport=rec.transport)
        assert (counts["dead_letter"], counts["delivered"], rec.ids()) == (0, 1, [did])
        r = await row(book, did)
        assert (r.status, r.attempt) == ("delivered", 1)
        assert [f.reason_code for f in await facts(book, did)] == [
            "dispatch.pending.enqueued", "dispatch.delivering.attempt", "dispatch.pending.released",
            "dispatch.delivering.attempt", "dispatch.delivered.transport_ok"]

    async def test_a_pass_records_its_releases_with_its_outcomes(self, book, clock):
        """O21, O7: at concurrency 1 a 6 s send leaves the second lease 9 s, less than its timeout: the
        first is delivered, the second released (each its own transition), and nothing is sent twice."""
        first, second = [await enqueue_dispatch(book, kind="k", deliver_to=f"seat-{i}") for i in (1, 2)]
        leases = [await claim(book, c, now=clock.now()) for c in await scan(book, now=clock.now())]
        assert all(leases)

        sent: list[str] = []

        async def send(_to: str, payload: str) -> None:
            sent.append(_id(payload))
            clock.advance(6.0)

        counts = await run_leases(book, leases, CallableTransport(send), concurrency=1)
        sent_first = leases[0].dispatch_id
        other = second if sent_first == first else first
        assert sent == [sent_first] and counts["delivered"] == 1
        assert (await row(book, sent_first)).status == "delivered"
        r = await row(book, other)
        assert (r.status, r.attempt, r.next_attempt_at.timestamp()) == ("pending", 0, clock.now())
        assert [f.reason_code for f in await facts(book, other)][-1] == "dispatch.pending.released"
        assert (await verify(book, "dispatch")).ok

    async def test_a_stale_release_after_a_reclaim_is_a_conflict_that_writes_nothing(self, book, clock):
        """O8, O21: a lease skipped so late that its row was reclaimed by another worker meanwhile cannot
        release it: the release is guarded on the lease's attempt and claim id, gets ``conflict`` and
        writes nothing — the step and a pass alike — and the other worker's send proceeds."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        stale = await claim(book, (await scan(book, now=clock.now()))[0], now=clock.now())
        assert stale is not None
        clock.set(stale.lease_until)
        fresh = await claim(book, (await scan(book, now=clock.now()))[0], now=clock.now())
        assert fresh is not None and fresh.attempt == 2
        before = (await row(book, did), len(await facts(book, did)))
        assert await release(book, stale, now=clock.now()) == "conflict"
        rec = Recorder()
        await run_leases(book, [stale], rec.transport)
        assert rec.calls == []
        assert (await row(book, did), len(await facts(book, did))) == before
        r = before[0]
        assert (r.status, r.attempt, r.claim_id) == ("delivering", 2, fresh.claim_id)
        await run_leases(book, [fresh], rec.transport)
        assert rec.ids() == [did] and (await row(book, did)).status == "delivered"

    async def test_a_released_attempt_number_is_claimed_again_and_the_claim_id_fences_it(self, book, clock):
        """O8, O21: a release gives the attempt number back, so the next claim holds the SAME attempt as
        the released lease; only the claim id tells them apart. The released lease can then neither
        release nor finalize the new claim (``conflict``, nothing written)."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        old = await claim(book, (await scan(book, now=clock.now()))[0], now=clock.now())
        assert old is not None
        clock.set(old.lease_until - 1.0)
        assert await release(book, old, now=clock.now()) == "released"
        new = await claim(book, (await scan(book, now=clock.now()))[0], now=clock.now())
        assert new is not None and new.attempt == old.attempt == 1 and new.claim_id != old.claim_id
        before = (await row(book, did), len(await facts(book, did)))
        assert await release(book, old, now=clock.now()) == "conflict"
        assert await finalize(book, old, TransportResult.failed("late"), now=clock.now()) == "conflict"
        assert (await row(book, did), len(await facts(book, did))) == before
        assert await finalize(book, new, TransportResult(True), now=clock.now()) == "delivered"

    async def test_facts_written_under_the_previous_dispatch_policy_verify(self, book, clock):
        """L12c, O21: adding ``dispatch.pending.released`` changed the dispatch policy's fingerprint.
        Dispatches written by a registry holding the previous declaration (``DISPATCH_V1``) verify under
        today's ``DISPATCH``, which accepts it — in the fast screen too; a policy accepting nothing would
        report each of those facts as ``unknown_policy``."""
        assert DISPATCH.fingerprint != DISPATCH_V1.fingerprint
        assert DISPATCH.policy_for(DISPATCH_V1.fingerprint) is DISPATCH_V1
        assert DISPATCH_V2.reasons - DISPATCH_V1.reasons == {"dispatch.pending.released"}
        older = Book(book.engine, Registry([DISPATCH_V1, SCHEDULE, SCHEDULE_RUN]).seal(), clock)
        ok = await enqueue_dispatch(older, kind="k", deliver_to="ok")
        failed = await enqueue_dispatch(older, kind="k", deliver_to="fail")
        await deliver_due_dispatches(older, transport=Recorder(outcome=lambda to, _n: to == "ok").transport)
        written = (await facts(book, ok)) + (await facts(book, failed))
        assert len(written) == 6 and {f.policy_fingerprint for f in written} == {DISPATCH_V1.fingerprint}

        report = await verify(book, "dispatch")
        assert report.ok and report.facts == 6
        suspects: list[object] = []
        await sweep(book, [book.policy("dispatch")], lambda lc, screen, s: suspects.extend(s) or [])
        assert suspects == []
        strict = Book(book.engine, Registry([dataclasses.replace(DISPATCH, accepts=()), SCHEDULE, SCHEDULE_RUN]).seal(),
                      clock)
        assert {f.kind for f in (await verify(strict, "dispatch")).findings} == {"unknown_policy"}

    async def test_a_transport_timeout_beyond_the_default_lease_gets_a_longer_lease(self, book, clock):
        """O21: the lease is derived from the transport's timeout — a 40 s timeout (more than the 15 s
        default lease) leases the row for longer than 40 s, so the send starts with its timeout left."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        left: list[float] = []

        async def send(_to: str, payload: str) -> None:
            left.append((await row(book, _id(payload))).next_attempt_at.timestamp() - clock.now())

        await deliver_due_dispatches(book, transport=CallableTransport(send, timeout=40))
        assert len(left) == 1 and left[0] > 40
        claimed = (await facts(book, did))[1]
        assert claimed.status == "delivering" and claimed.patch["next_attempt_at"] - claimed.at > 40

    async def test_the_daemon_sizes_leases_from_the_configured_transport_timeout(self, book, clock):
        """O21: ``dispatch.transport_timeout_seconds`` reaches the daemon's delivery worker, whose claims
        lease rows for longer than that timeout (a 45 s setting, three times the old fixed lease)."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        settings = Settings.model_validate({"dispatch": {
            "notify_template": [sys.executable, "-c", "pass", "{deliver_to}"], "transport_timeout_seconds": 45,
        }, "retention": {"enabled": False}})
        counts = await Delivery(book, settings).worker.run_once()
        assert counts["delivered"] == 1
        claimed = (await facts(book, did))[1]
        assert claimed.status == "delivering" and claimed.patch["next_attempt_at"] - claimed.at > 45

    async def test_a_send_that_outlives_its_lease_is_cut(self, book, clock):
        """O21: a transport that ignores its timeout is cut when the lease would lapse under it, and the
        attempt counts as a timed-out failure instead of running on beside a reclaim."""
        await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        [candidate] = await scan(book, now=clock.now())
        lease = await claim(book, candidate, now=clock.now(), timeout=0.05)
        assert lease is not None

        async def hangs(_to: str, _payload: str) -> None:
            await asyncio.Event().wait()

        # Started with 0.1 s of the lease left (more than the 0.05 s timeout): cut after 0.1 s of real time.
        result = await execute(lease, CallableTransport(hangs), now=lease.lease_until - 0.1)
        assert result is not None and not result.ok and result.evidence.get("timed_out") is True

    async def test_a_failed_refill_keeps_the_sends_the_pass_holds(self, book, clock):
        """O21, O7: when claiming more fails mid-pass (the database went away, say), the leases the pass
        already holds are still sent and finalized; only the claiming stops."""
        for seat in ("seat-1", "seat-2"):
            await enqueue_dispatch(book, kind="k", deliver_to=seat)
        lease = await claim(book, (await scan(book, now=clock.now(), limit=1))[0], now=clock.now())
        assert lease is not None
        did = lease.dispatch_id

        async def refill(_n: int):
            raise ConnectionError("the database went away")

        rec = Recorder()
        counts = await run_leases(book, [lease], rec.transport, concurrency=2, refill=refill, budget=5)
        assert rec.ids() == [did] and counts["delivered"] == 1
        assert (await row(book, did)).status == "delivered"

    async def test_the_next_pass_claims_as_the_transports_last_pass_allows(self, book, clock):
        """O21: a pass remembers how slow its transport's sends were. With the same transport, the next
        pass claims a whole batch at once after sends that took no time, and only its free slots after
        slow ones (so a caller looping over passes does not pay a second claim per batch)."""
        delay = 0.0
        held: list[int] = []

        async def send(_to: str, _payload: str) -> None:
            held.append(len(await list_dispatches(book, status="delivering")))
            clock.advance(delay)

        transport = CallableTransport(send)
        # (send seconds, rows, rows held when the first send starts): cold, fast, slow, after slow.
        for delay, rows, expected in ((0.0, 4, 1), (0.0, 4, 4), (SEND_SECONDS, 1, 1), (0.0, 4, 1)):
            held.clear()
            for i in range(rows):
                await enqueue_dispatch(book, kind="k", deliver_to=f"seat-{i}")
            counts = await deliver_due_dispatches(book, transport=transport, batch_size=4, concurrency=1)
            assert counts["delivered"] == rows
            assert held[0] == expected, (delay, held)
