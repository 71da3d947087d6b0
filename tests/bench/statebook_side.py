"""statebook's side of every workload, through its public API only.

Each function does one round and returns one figure (seconds, or a list of latencies). Seeding
that is not being measured happens before the clock starts.

Each function imports the statebook API it calls itself (after the first time a lookup): ``run.py
--baseline`` runs these drivers against an earlier revision too (child.py), and a name that
revision lacks must make only the cells that need it ``n/a``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from common import BATCH, CONCURRENCY, METER, W3_IDLE_GAP

if TYPE_CHECKING:
    from statebook.lifecycle import Book

KIND, TO = "bench.noop", "noop"


async def fresh_book(url: str) -> Book:
    """A book on an empty schema: PostgreSQL truncated, SQLite a new file (``url`` names it)."""
    from statebook.adapters.db import open_book

    book = await open_book(url)
    if book.dialect == "postgresql":
        await empty(book)
    return book


async def empty(book: Book) -> None:
    """Empty every statebook table of a PostgreSQL book with one ``TRUNCATE ... RESTART IDENTITY``.

    The bench's own statement, not ``reset_schema``: the peers are emptied by TRUNCATE too, and a
    ``--baseline`` run must empty both sides alike. ``reset_schema`` changed after 882b11b to DELETE
    the rows (cheaper for the tests' small tables), which leaves every drained row and fact behind as a
    dead tuple for the next round's scans and inserts; measured that way, the working side's drain read
    0.87x against a baseline whose reset truncated.
    """
    from statebook.adapters.db import metadata

    names = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
    async with book.engine.begin() as conn:
        await conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


async def enqueue_single(book: Book, n: int) -> float:
    from statebook.outbox import enqueue_dispatch

    METER.start()
    for i in range(n):
        await enqueue_dispatch(book, kind=KIND, deliver_to=TO, body={"n": i})
    return METER.stop()


async def enqueue_batches(book: Book, total: int, batch: int) -> float:
    from statebook.outbox import enqueue_dispatches

    METER.start()
    for base in range(0, total, batch):
        await enqueue_dispatches(book, [{"kind": KIND, "deliver_to": TO, "body": {"n": base + i}}
                                        for i in range(min(batch, total - base))])
    return METER.stop()


class Sink:
    """The no-op in-process transport: counts calls and remembers the last one's time."""

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.event = asyncio.Event()

    async def __call__(self, deliver_to: str, payload: str) -> None:
        self.count += 1
        self.last = time.perf_counter()
        self.event.set()


async def drain_due(book: Book, sink: Sink, expected: int) -> None:
    """Delivery passes until ``expected`` deliveries happened (or a pass finds nothing)."""
    from statebook.outbox import CallableTransport, deliver_due_dispatches

    transport = CallableTransport(sink)
    while sink.count < expected:
        counts = await deliver_due_dispatches(book, transport=transport, batch_size=BATCH, concurrency=CONCURRENCY)
        if counts["attempted"] == 0:
            break
    if sink.count < expected:
        raise RuntimeError(f"statebook delivered {sink.count} of {expected} dispatches")


async def drain(book: Book, n: int) -> float:
    """Seconds from the first delivery pass to the ``n``-th delivery (``n`` pending enqueued first)."""
    await enqueue_batches(book, n, 500)
    sink = Sink()
    METER.cpu = 0.0  # the seeding above is not part of the figure
    start = METER.start()
    await drain_due(book, sink, n)
    METER.stop()
    return sink.last - start


async def claim_deliver(book: Book, n: int) -> float:
    """W4: seconds to claim and deliver ``n`` due rows (enqueued first), whatever history is present."""
    return await drain(book, n)


async def latency(book: Book, samples: int, *, listen_url: str | None = None) -> list[float]:
    """Milliseconds from an enqueue call to the transport call, one at a time into an idle worker.

    Default: the worker is woken by the enqueueing book's commit hook (same process). With
    ``listen_url`` (PostgreSQL) the enqueue goes through a second engine without that hook and the
    worker is woken by LISTEN/NOTIFY, as it would be for an enqueue from another process.
    """
    from statebook.adapters.db import open_book
    from statebook.outbox import CallableTransport, DeliveryWorker, enqueue_dispatch

    sink = Sink()
    wakeups = None
    producer = book
    if listen_url is not None:
        from statebook.adapters.pgnotify import listen

        wakeups = listen(book)
        producer = await open_book(listen_url)
    worker = DeliveryWorker(book, CallableTransport(sink), batch_size=BATCH, concurrency=CONCURRENCY,
                            tick_seconds=30.0, extra_wakeups=wakeups)
    task = asyncio.create_task(worker.run_until_stopped())
    out: list[float] = []
    try:
        await asyncio.wait_for(worker.idle.wait(), 10)
        await asyncio.sleep(0.2)  # listener connected
        for i in range(samples):
            sink.event.clear()
            t0 = time.perf_counter()
            await enqueue_dispatch(producer, kind=KIND, deliver_to=TO, body={"n": i})
            await asyncio.wait_for(sink.event.wait(), 10)
            out.append((sink.last - t0) * 1000)
            await asyncio.sleep(W3_IDLE_GAP)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.idle.wait(), 1)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        if producer is not book:
            await producer.engine.dispose()
        if wakeups is not None:
            await wakeups.aclose()
    return out


async def verify_rate(book: Book) -> tuple[float, int]:
    """W5: facts per second of a full ``verify`` and how many facts it checked (must find nothing)."""
    from statebook.lifecycle import verify

    start = time.perf_counter()
    report = await verify(book)
    elapsed = time.perf_counter() - start
    if not report.ok:
        raise RuntimeError(f"verify found {len(report.findings)} problems in a seeded history: {report.findings[:3]}")
    return report.facts / elapsed, report.facts
