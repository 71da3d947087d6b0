"""Outbox figures: dispatches/s end to end and idle enqueue -> transport latency (not a test).

Usage: ``.venv/bin/python tests/bench/outbox_figures.py [--rows 2000] [--samples 200]``

Throughput: enqueue N dispatches (batches of 500 via ``enqueue_dispatches``, and one by one), then
drain them with ``deliver_due_dispatches`` and an in-process ``CallableTransport`` that returns at
once; end to end is enqueue + drain. Latency: an idle ``DeliveryWorker`` (30 s tick) and one
enqueue at a time; the time from calling ``enqueue_dispatch`` to the transport being called, and
from its return (the commit) to that call. On PostgreSQL a second variant enqueues through another
engine, so only LISTEN/NOTIFY can wake the worker. SQLite uses a temporary file; PostgreSQL a
throwaway cluster (tests/pgcluster.py). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import pgcluster  # noqa: E402

from statebook.adapters.db import connect, open_book, reset_schema  # noqa: E402
from statebook.lifecycle import Book  # noqa: E402
from statebook.outbox import (  # noqa: E402
    CallableTransport,
    DeliveryWorker,
    deliver_due_dispatches,
    enqueue_dispatch,
    enqueue_dispatches,
)


async def _noop(_to: str, _payload: str) -> bool:
    return True


async def throughput(url: str, rows: int) -> dict[str, float]:
    book = await open_book(url)
    try:
        await reset_schema(book.engine)
        items = [{"kind": "bench", "deliver_to": f"seat-{n % 16}", "body": {"n": n}} for n in range(rows)]
        t0 = time.perf_counter()
        for start in range(0, rows, 500):
            await enqueue_dispatches(book, items[start : start + 500])
        t1 = time.perf_counter()
        delivered = 0
        transport = CallableTransport(_noop)
        while True:
            counts = await deliver_due_dispatches(book, transport=transport, batch_size=100, concurrency=8)
            delivered += counts["delivered"]
            if counts["attempted"] == 0:
                break
        t2 = time.perf_counter()
        assert delivered == rows, (delivered, rows)
        await reset_schema(book.engine)
        single = min(rows, 500)
        t3 = time.perf_counter()
        for n in range(single):
            await enqueue_dispatch(book, kind="bench", deliver_to="seat", body={"n": n})
        t4 = time.perf_counter()
        return {
            "enqueue_batch_per_s": rows / (t1 - t0),
            "enqueue_single_per_s": single / (t4 - t3),
            "deliver_per_s": rows / (t2 - t1),
            "end_to_end_per_s": rows / (t2 - t0),
        }
    finally:
        await book.engine.dispose()


async def latency(url: str, samples: int, *, via_notify: bool) -> dict[str, float]:
    book = await open_book(url)
    producer = Book(connect(url), book.registry, book.clock) if via_notify else book
    called = asyncio.Event()
    seen: list[float] = []

    async def send(_to: str, _payload: str) -> bool:
        seen.append(time.perf_counter())
        called.set()
        return True

    wakeups = None
    if via_notify:
        from statebook.adapters.pgnotify import listen

        wakeups = listen(book)
    worker = DeliveryWorker(book, CallableTransport(send), tick_seconds=30, extra_wakeups=wakeups)
    try:
        await reset_schema(book.engine)
        task = asyncio.ensure_future(worker.run_until_stopped())
        await asyncio.sleep(0.5)  # connect the listener, first pass
        waits: list[float] = []
        after_commit: list[float] = []
        for n in range(samples):
            await asyncio.wait_for(worker.idle.wait(), 30)
            await asyncio.sleep(0.005)  # let the worker settle into its sleep
            called.clear()
            t0 = time.perf_counter()
            await enqueue_dispatch(producer, kind="bench", deliver_to="seat", body={"n": n})
            t1 = time.perf_counter()
            await asyncio.wait_for(called.wait(), 30)
            waits.append((seen[-1] - t0) * 1000)
            after_commit.append((seen[-1] - t1) * 1000)
        worker.stop()
        await task
    finally:
        if producer is not book:
            await producer.engine.dispose()
        await book.engine.dispose()
    return {
        "median_ms": statistics.median(waits),
        "p99_ms": _p99(waits),
        "max_ms": max(waits),
        "after_commit_median_ms": statistics.median(after_commit),
        "after_commit_p99_ms": _p99(after_commit),
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def _line(label: str, values: dict[str, float]) -> str:
    return f"{label:<34}" + "  ".join(f"{k}={v:,.1f}" for k, v in values.items())


async def main(rows: int, samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        sqlite = f"sqlite:///{tmp}/bench.db"
        print(_line("sqlite throughput", await throughput(sqlite, rows)), flush=True)
        print(_line("sqlite latency (in-process wake)", await latency(sqlite, samples, via_notify=False)), flush=True)
        bindir = pgcluster.find_pg_bin()
        if bindir is None:
            print("postgresql: no server binaries found; skipped")
            return
        pg = stack.enter_context(pgcluster.throwaway_cluster(bindir))
        await (await open_book(pg)).engine.dispose()  # create the schema
        print(_line("postgresql throughput", await throughput(pg, rows)), flush=True)
        print(_line("postgresql latency (in-process)", await latency(pg, samples, via_notify=False)), flush=True)
        print(_line("postgresql latency (NOTIFY)", await latency(pg, samples, via_notify=True)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.samples))
