"""Batched enqueues into a PostgreSQL table refilled after TRUNCATE: the rate per 10 batches as it fills.

Issue 11 reports W1 batch slowing about 4x as TRUNCATEd tables refill, until autovacuum analyses
them. This reproduces it in isolation, three ways: as is, with a dedup key on every item (one more
read per batch), and with an ``ANALYZE`` every 10 batches. When only the last stays flat, the cause
is the planner working from the statistics of an empty table, not the statement cache.

    .venv/bin/python tests/bench/refill.py [--pg-url URL] [--batches 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statebook.adapters.db import open_book, reset_schema  # noqa: E402
from statebook.outbox import enqueue_dispatches  # noqa: E402

from common import run_with_postgres  # noqa: E402  (tests/bench, the script's directory)

BATCH = 500


async def rates(url: str, batches: int, *, dedup: bool, analyze_every: int | None) -> list[float]:
    """Enqueues per second of each batch, after TRUNCATE and ANALYZE of the empty tables."""
    book = await open_book(url)
    out: list[float] = []
    try:
        await reset_schema(book.engine)
        async with book.engine.connect() as conn:
            await conn.exec_driver_sql("ANALYZE")
        for b in range(batches):
            if analyze_every and b and b % analyze_every == 0:
                async with book.engine.connect() as conn:
                    await conn.exec_driver_sql("ANALYZE")
            items = [{"kind": "k", "deliver_to": f"seat-{b}-{i}", **({"dedup_key": f"key-{b}-{i}"} if dedup else {})}
                     for i in range(BATCH)]
            started = time.perf_counter()
            await enqueue_dispatches(book, items)
            out.append(BATCH / (time.perf_counter() - started))
    finally:
        await book.engine.dispose()
    return out


async def report(url: str, batches: int) -> str:
    lines = [f"| variant | enq/s per 10 batches of {BATCH} (rows before: 0, {10 * BATCH:,}, ...) |", "|---|---|"]
    for label, dedup, every in (("as is", False, None), ("dedup keys", True, None),
                                 ("dedup keys, ANALYZE every 10 batches", True, 10)):
        r = await rates(url, batches, dedup=dedup, analyze_every=every)
        tens = [sum(r[i:i + 10]) / len(r[i:i + 10]) for i in range(0, len(r), 10)]
        lines.append(f"| {label} | " + " → ".join(f"{x:,.0f}" for x in tens) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()
    print(run_with_postgres(args.pg_url, lambda url: report(url, args.batches)))

if __name__ == "__main__":
    main()
