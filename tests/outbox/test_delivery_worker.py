"""DeliveryWorker: wakes on enqueue (in-process hook; LISTEN/NOTIFY on PostgreSQL), sleeps until due.

No timed assertion: the tick is 30 s and each wait allows 10 s, so a delivery within the wait
proves the worker was woken, not that it was fast (tests/bench/outbox_figures.py measures that).
"""

from __future__ import annotations

import asyncio

import pytest

from statebook.adapters.db import connect
from statebook.lifecycle import Book
from statebook.outbox import (
    CallableTransport,
    DeliveryWorker,
    enqueue_dispatch,
    enqueue_dispatches,
)

from conformance.outbox.support import Signalled

from conformance.outbox.cases_delivery_worker import TICK, WAIT, _started, _stopped


@pytest.mark.postgres
async def test_postgres_notify_wakes_a_worker_in_another_process(pg_url, clock):
    """O14 (do-better 5): an enqueue through a different engine (as another process would) wakes
    the worker through LISTEN/NOTIFY on statebook_dispatch."""
    from statebook.adapters.db import open_book, reset_schema
    from statebook.adapters.pgnotify import listen

    book = await open_book(pg_url, clock=clock)
    producer = Book(connect(pg_url), book.registry, clock)
    rec = Signalled()
    worker = DeliveryWorker(book, CallableTransport(rec), tick_seconds=TICK, extra_wakeups=listen(book))
    try:
        await reset_schema(book.engine)
        task = await _started(worker)
        try:
            for _ in range(400):  # the listener announces its connection with one wake-up
                if worker.wakeups:
                    break
                await asyncio.sleep(0.025)
            assert worker.wakeups == 1
            did = await enqueue_dispatch(producer, kind="k", deliver_to="seat-1")
            await asyncio.wait_for(rec.called.wait(), WAIT)
            assert rec.ids() == [did]
            assert worker.wakeups >= 2
            # A batch (no dedup keys: its own transaction, then one NOTIFY) wakes it too.
            batch = await enqueue_dispatches(producer, [{"kind": "k", "deliver_to": f"seat-{n}"} for n in range(3)])
            for _ in range(int(WAIT / 0.025)):
                if len(rec.calls) == 4:
                    break
                await asyncio.sleep(0.025)
            assert sorted(rec.ids()[1:]) == sorted(batch)
        finally:
            await _stopped(worker, task)
    finally:
        await producer.engine.dispose()
        await book.engine.dispose()
