"""DeliveryWorker: wakes on enqueue (in-process hook; LISTEN/NOTIFY on PostgreSQL), sleeps until due.

No timed assertion: the tick is 30 s and each wait allows 10 s, so a delivery within the wait
proves the worker was woken, not that it was fast (tests/bench/outbox_figures.py measures that).
"""

from __future__ import annotations

import asyncio

import pytest

from statebook.outbox import (
    CallableTransport,
    DeliveryWorker,
    Retention,
    deliver_due_dispatches,
    enqueue_dispatch,
    get_dispatch,
)

from .support import Recorder, Signalled, failing, row

TICK = 30.0
WAIT = 10.0


async def _started(worker: DeliveryWorker) -> asyncio.Task:
    task = asyncio.ensure_future(worker.run_until_stopped())
    await asyncio.wait_for(worker.idle.wait(), WAIT)
    return task


async def _stopped(worker: DeliveryWorker, task: asyncio.Task) -> None:
    worker.stop()
    await asyncio.wait_for(task, WAIT)


class DeliveryWorkerCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_an_enqueue_wakes_an_idle_worker_before_the_tick(self, book):
        """O14 (do-better 5): an idle worker (nothing due, 30 s tick) delivers a new dispatch as soon as
        its enqueue commits through the same book; its own claims and finalizations do not wake it."""
        rec = Signalled()
        worker = DeliveryWorker(book, CallableTransport(rec), tick_seconds=TICK)
        task = await _started(worker)
        try:
            did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
            await asyncio.wait_for(rec.called.wait(), WAIT)
            for _ in range(400):
                if (await row(book, did)).status == "delivered":
                    break
                await asyncio.sleep(0.025)
            assert (await row(book, did)).status == "delivered"
            await asyncio.wait_for(worker.idle.wait(), WAIT)
            assert worker.wakeups == 1  # the enqueue; not the worker's own two transitions
            assert worker.totals["delivered"] == 1
        finally:
            await _stopped(worker, task)
        assert worker._on_commit not in book.on_commit

    async def test_an_enqueue_in_a_caller_transaction_wakes_the_worker_at_commit(self, book):
        """O14: the wake-up fires after the caller's transaction commits (not before)."""
        rec = Signalled()
        worker = DeliveryWorker(book, CallableTransport(rec), tick_seconds=TICK)
        task = await _started(worker)
        try:
            async with book.begin() as tx:
                await enqueue_dispatch(tx, kind="k", deliver_to="seat-1")
                assert worker.wakeups == 0
            assert worker.wakeups == 1
            await asyncio.wait_for(rec.called.wait(), WAIT)
        finally:
            await _stopped(worker, task)

    async def test_the_worker_sleeps_until_the_earliest_due_row_or_the_tick(self, book, clock):
        """O14: after a pass the worker sleeps until the earliest next_attempt_at, at most the tick, and
        not at all after a full batch."""
        await enqueue_dispatch(book, kind="k", deliver_to="r")
        worker = DeliveryWorker(book, Recorder(outcome=failing()).transport, tick_seconds=300)
        counts = await worker.run_once()  # fails: due again at +60
        assert await worker.next_delay(counts) == 60
        clock.advance(50)
        assert await worker.next_delay(counts) == pytest.approx(10)
        worker.tick_seconds = 5
        assert await worker.next_delay(counts) == 5
        assert await worker.next_delay({**counts, "attempted": worker.batch_size}) == 0
        assert await worker.next_delay(None) == 5

    async def test_the_worker_runs_retention_when_configured(self, book, clock):
        """O16 (do-better 6): a worker with a retention policy purges settled rows past their age."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r")
        await deliver_due_dispatches(book, transport=Recorder().transport)
        clock.advance(8 * 86400)
        worker = DeliveryWorker(book, Recorder().transport, retention=Retention(delivered_days=7))
        await worker.run_once()
        assert await get_dispatch(book, did) is None
