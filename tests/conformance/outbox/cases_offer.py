"""Offers: an idle worker claims a just-enqueued dispatch from what the enqueue (or a NOTIFY) told it.

An offer saves the scan; it must never change what is claimed: the same guarded transition, the
same payload bytes, a lost race when the row moved (O5, O7, O14).
"""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from statebook.lifecycle import verify
from statebook.outbox import DeliveryWorker, enqueue_dispatch
from statebook.outbox.dispatch.attempts import read_candidates, scan_heads
from statebook.outbox.dispatch.delivery import claim_offered, deliver_due_dispatches
from statebook.outbox.dispatch.offers import offered_id

from .support import Recorder, Signalled, facts, row

WAIT = 10.0


class OfferCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_an_idle_worker_claims_the_offered_row_and_sends_the_stored_bytes(self, book):
        """O14: an enqueue through the worker's book is offered to it; it claims and delivers that row, the
        payload it sends is byte for byte the stored text (but the attempt it makes, O1), and the history is the
        usual one."""
        rec = Signalled()
        worker = DeliveryWorker(book, rec.transport, tick_seconds=30.0)
        task = asyncio.ensure_future(worker.run_until_stopped())
        try:
            await asyncio.wait_for(worker.idle.wait(), WAIT)
            did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", body={"z": 1, "a": [1, 2]})
            assert worker._offered, "the enqueue offered its row to the idle worker"
            await asyncio.wait_for(rec.called.wait(), WAIT)
            await asyncio.wait_for(worker.idle.wait(), WAIT)
        finally:
            worker.stop()
            await asyncio.wait_for(task, WAIT)
        async with book.read() as conn:
            stored = (await conn.execute(sa.text("SELECT CAST(payload AS TEXT) FROM dispatch_outbox"))).scalar_one()
        assert rec.calls == [("seat-1", stored.replace('"attempt":0,', '"attempt":1,', 1))]  # O1: with its attempt
        assert [f.status for f in await facts(book, did)] == ["pending", "delivering", "delivered"]
        assert (await verify(book, "dispatch")).ok

    async def test_a_stale_offer_is_a_lost_race(self, book, clock):
        """O5: an offer for a row another claimant took since is a conflict: no lease, nothing written."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        [offer] = await read_candidates(book, [did])
        rec = Recorder()
        assert (await deliver_due_dispatches(book, transport=rec.transport))["delivered"] == 1
        before = await facts(book, did)
        leases, counts = await claim_offered(book, [offer], now=clock.now())
        assert leases == [] and counts["attempted"] == 0
        assert await facts(book, did) == before
        assert (await row(book, did)).status == "delivered"

    async def test_an_offer_and_a_scan_claim_the_attempt_once(self, book, clock):
        """O5: the offered claim and a scanning pass race for one row; exactly one attempt is claimed."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        [offer] = await read_candidates(book, [did])
        leases, _ = await claim_offered(book, [offer], now=clock.now())
        assert [lease.attempt for lease in leases] == [1]
        rec = Recorder()
        counts = await deliver_due_dispatches(book, transport=rec.transport)
        assert counts["attempted"] == 0 and rec.calls == []  # the lease holds the row
        assert [f.status for f in await facts(book, did)] == ["pending", "delivering"]

    async def test_offers_read_by_id_skip_settled_rows(self, book, clock):
        """A NOTIFY names an id; only pending or delivering rows are read as candidates."""
        done = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
        await deliver_due_dispatches(book, transport=Recorder().transport)
        live = await enqueue_dispatch(book, kind="k", deliver_to="seat-2")
        found = await read_candidates(book, [live, done, "f" * 32])
        assert [c.dispatch_id for c, _ in found] == [live]
        assert offered_id(live) == live and offered_id("") is None and offered_id("not-an-id") is None

    async def test_an_offered_row_is_the_row_a_scan_reads(self, book, clock):
        """The candidate built from an enqueue's committed row equals the one a scan reads (payload bytes
        and chain head included), so skipping the scan changes nothing."""
        captured: list = []
        from statebook.outbox.dispatch import offers

        def take(dispatch_id, hint):
            captured.append(hint)
            return True

        offers.subscribe(book, take)
        try:
            did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", body={"b": "é", "a": 1.5})
        finally:
            offers.unsubscribe(book, take)
        [(offered, head)] = captured
        [(scanned, row_read)] = await scan_heads(book, now=clock.now(), limit=10)
        assert offered == scanned and offered.dispatch_id == did
        assert head == row_read  # the same Head: status, version, chain head and the guarded columns
