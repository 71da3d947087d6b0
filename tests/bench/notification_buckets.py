"""Rate-limit precision with several processes (specs/notifications.md N8): sends per window vs the bucket's bound.

Each round starts P worker processes (tests/outbox/test_notification_buckets_processes.py run as a script)
that draw from ONE rate_bucket on PostgreSQL for a few seconds of wall time, one transaction per draw.
From the draws' facts it prints, per process count (medians of the rounds):

- ``drawn / bound``: the tokens taken over ``capacity + refill * seconds`` (1.00 = the fleet used the
  whole limit; above 1.00 the limit was broken);
- ``max per 1 s / bound``: the busiest 1-second window (sliding, over the draws' effective times)
  over ``capacity + refill * 1``;
- ``worst excess``: the most draws any window [a, b] had above ``capacity + refill * (b - a)`` (<= 0:
  never broken);
- draws tried per second (fleet) and client CPU seconds per process.

Process-local buckets (the seed's) would allow P times the bound; that line is arithmetic, not measured.

    .venv/bin/python tests/bench/notification_buckets.py [--pg-url URL] [--processes 1,2,4] [--seconds 2]
        [--capacity 10] [--refill 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "outbox"))

from statebook.adapters.db import open_book, reset_schema  # noqa: E402
from statebook.lifecycle import verify  # noqa: E402
from statebook.outbox.notifications.buckets import ensure_bucket  # noqa: E402

from common import run_with_postgres  # noqa: E402  (tests/bench, the script's directory)
from test_notification_buckets_processes import drawn_at, spawn, worst_window  # noqa: E402  (the worker)


def busiest(times: list[float], width: float) -> int:
    """The most draws in any window of ``width`` seconds starting at a draw."""
    times = sorted(times)
    return max((bisect.bisect_right(times, t + width) - i for i, t in enumerate(times)), default=0)


async def one_round(url: str, processes: int, seconds: float, capacity: float, refill: float, n: int) -> dict:
    book = await open_book(url)
    try:
        scope = f"bench-{processes}-{n}"
        await ensure_bucket(book, "slack", scope, capacity=capacity, refill_per_second=refill)
        _, results = await asyncio.to_thread(spawn, url, "slack", scope, processes, seconds)
        times = await drawn_at(book, f"slack:{scope}")
        drawn = sum(r["drawn"] for r in results)
        assert drawn == len(times)
        tried = drawn + sum(r["refused"] for r in results)
        return {
            "drawn_ratio": drawn / (capacity + refill * seconds),
            "window_ratio": busiest(times, 1.0) / (capacity + refill * 1.0),
            "excess": worst_window(times, capacity, refill),
            "tried_per_s": tried / seconds,
            "cpu": statistics.mean(r["cpu"] for r in results),
        }
    finally:
        await book.engine.dispose()


async def report(url: str, counts: list[int], seconds: float, capacity: float, refill: float, rounds: int) -> str:
    book = await open_book(url)
    await reset_schema(book.engine)
    await book.engine.dispose()
    lines = [
        f"bucket: capacity {capacity:g}, {refill:g} tokens/s; {seconds:g} s per round, median of {rounds} rounds",
        "| processes | drawn / bound | max per 1 s / bound | worst excess (draws) | draws tried/s | client CPU s/process "
        "| process-local bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for processes in counts:
        runs = [await one_round(url, processes, seconds, capacity, refill, n) for n in range(rounds)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lines.append(f"| {processes} | {med['drawn_ratio']:.3f} | {med['window_ratio']:.3f} | "
                     f"{max(r['excess'] for r in runs):+.2f} | {med['tried_per_s']:,.0f} | {med['cpu']:.2f} | "
                     f"{processes:.0f}x |")
    book = await open_book(url)
    try:
        lines.append(f"verify rate_bucket: {'ok' if (await verify(book, 'rate_bucket')).ok else 'FAILED'}")
    finally:
        await book.engine.dispose()
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    parser.add_argument("--processes", default="1,2,4", help="comma-separated process counts")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--capacity", type=float, default=10.0)
    parser.add_argument("--refill", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    counts = [int(p) for p in args.processes.split(",")]
    print(run_with_postgres(args.pg_url, lambda url: report(url, counts, args.seconds, args.capacity, args.refill,
                                                            args.rounds)))


if __name__ == "__main__":
    main()
