"""Scans: ordered, bounded, counting only won claims; bounded concurrency; SKIP LOCKED on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from statebook.adapters.db import connect
from statebook.lifecycle import Book
from statebook.outbox import DispatchInvalid, deliver_due_dispatches, enqueue_dispatch
from statebook.outbox.dispatch.attempts import next_due, scan
from statebook.outbox.dispatch.steps import claim

from .support import Recorder, failing, row


class DispatchScanCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_scans_are_ordered_by_due_time_then_id_and_bounded(self, book, clock):
        """O11 (do-better 4): candidates come in (next_attempt_at, created_at, id) order — an older row retried
        after backoff sorts after younger rows due earlier, equal due times sort by id — and a scan
        or a pass never takes more than its limit."""
        old = await enqueue_dispatch(book, kind="k", deliver_to="old")
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing()).transport)  # old: due at +60
        clock.advance(10)
        ties = [await enqueue_dispatch(book, kind="k", deliver_to=f"tie-{n}") for n in range(4)]
        clock.advance(10)
        late = await enqueue_dispatch(book, kind="k", deliver_to="late")
        clock.advance(40)
        expected = [*sorted(ties), late, old]
        assert [c.dispatch_id for c in await scan(book, now=clock.now())] == expected
        assert [c.dispatch_id for c in await scan(book, now=clock.now(), limit=3)] == expected[:3]
        assert await next_due(book) == clock.now() - 50

        rec = Recorder()
        counts = await deliver_due_dispatches(book, transport=rec.transport, batch_size=3, concurrency=1)
        assert counts["attempted"] == 3
        assert rec.ids() == expected[:3]
        assert (await row(book, old)).status == "pending"

    async def test_equal_due_times_go_by_event_time_before_id(self, book, clock):
        """O11 (N36): a retry due at the very time fresh rows arrive goes before them, whatever the ids:
        the scan orders by due time, then event time (created_at), then id."""
        olds = [await enqueue_dispatch(book, kind="k", deliver_to=f"old-{n}") for n in range(3)]
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing()).transport)
        due = (await row(book, olds[0])).next_attempt_at.timestamp()
        clock.advance(due - clock.now())
        fresh: list[str] = []
        while not any(f < max(olds) for f in fresh):  # by id alone, a fresh row would go first (ids are random)
            fresh.append(await enqueue_dispatch(book, kind="k", deliver_to=f"new-{len(fresh)}"))
        assert [c.dispatch_id for c in await scan(book, now=clock.now())] == [*sorted(olds), *sorted(fresh)]

    async def test_concurrent_passes_count_only_the_claims_they_won(self, book, db_url, clock):
        """O11, O12 (do-better 4): two passes on separate connections over the same due rows: each row
        is sent once, and the passes' ``attempted`` add up to the rows, not to the rows each one saw."""
        ids = [await enqueue_dispatch(book, kind="k", deliver_to=f"r{n}") for n in range(30)]
        other = Book(connect(db_url), book.registry, clock)
        rec = Recorder(delay=0.001)
        try:
            a, b = await asyncio.gather(
                deliver_due_dispatches(book, transport=rec.transport, batch_size=50),
                deliver_due_dispatches(other, transport=rec.transport, batch_size=50),
            )
        finally:
            await other.engine.dispose()
        assert a["attempted"] + b["attempted"] == len(ids)
        assert Counter(rec.ids()) == Counter(ids)

    async def test_a_stale_candidate_is_not_claimed(self, book, clock):
        """O5, O11: a candidate another claimant already took yields no lease (and so no attempt)."""
        await enqueue_dispatch(book, kind="k", deliver_to="r")
        [c] = await scan(book, now=clock.now())
        assert await claim(book, c, now=clock.now()) is not None
        assert await claim(book, c, now=clock.now()) is None

    async def test_transports_run_with_bounded_concurrency(self, book):
        """O12 (do-better 4): a pass runs several transports at once, never more than ``concurrency``."""
        for n in range(10):
            await enqueue_dispatch(book, kind="k", deliver_to=f"r{n}")
        rec = Recorder(delay=0.05)
        counts = await deliver_due_dispatches(book, transport=rec.transport, concurrency=3)
        assert counts["delivered"] == 10
        assert rec.in_flight_max == 3

    async def test_passes_refuse_to_run_transports_inside_a_transaction(self, book):
        """O12: delivery needs an unbound book — external effects never run inside a transaction."""
        await enqueue_dispatch(book, kind="k", deliver_to="r")
        rec = Recorder()
        with pytest.raises(DispatchInvalid, match="transaction"):
            async with book.begin() as tx:
                await deliver_due_dispatches(tx, transport=rec.transport)
        assert rec.calls == []

    async def test_the_payload_sent_is_the_stored_envelope(self, book):
        """O1: the transport gets (deliver_to, the stored JSON text with the attempt being made) for each row."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="seat-9", body={"x": [1, 2], "attempt": 0})
        rec = Recorder()
        await deliver_due_dispatches(book, transport=rec.transport)
        [(to, payload)] = rec.calls
        stored = (await row(book, did)).payload
        assert to == "seat-9" and json.loads(payload) == {**stored, "attempt": 1}
        assert json.loads(payload)["body"] == {"x": [1, 2], "attempt": 0}  # the body's own field is the body's
