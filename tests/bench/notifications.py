"""Notifications delivered per second through in-process channels (issue 12): one channel, and a
three-channel fallback (Slack and email reject, PagerDuty accepts), on SQLite and PostgreSQL.

    .venv/bin/python tests/bench/notifications.py [--n 2000] [--rounds 3] [--pg-url URL]

Each round accepts N GUARANTEED notifications (not timed), then times passes of
``deliver_due_notifications`` (100 per pass, 10 at once) until every one is delivered. Prints the
median rate of the rounds and the client CPU per notification.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: pgcluster


async def one_round(url: str, n: int, fallback: bool) -> tuple[float, float]:
    from statebook.adapters.db import open_book, reset_schema
    from statebook.outbox.notifications import send_notification
    from statebook.outbox.notifications.delivery import deliver_due_notifications
    from statebook.outbox.notifications.scripted import ScriptedChannel

    book = await open_book(url)
    try:
        if book.dialect == "postgresql":
            await reset_schema(book.engine)
        chosen = ["slack", "email", "pagerduty"] if fallback else ["email"]
        for _ in range(n):
            await send_notification(book, recipient="ops", content={"text": "disk full"}, mode="guaranteed",
                                    channels=chosen)
        chans = {"slack": ScriptedChannel("slack", ["reject"]), "email": ScriptedChannel("email", ["reject" if fallback else "success"]),
                 "pagerduty": ScriptedChannel("pagerduty", ["success"])}
        delivered = 0
        wall, cpu = time.perf_counter(), time.process_time()
        while delivered < n:
            counts = await deliver_due_notifications(book, chans, limit=100, concurrency=10)
            if counts["claimed"] == 0:
                raise RuntimeError(f"only {delivered} of {n} delivered")
            delivered += counts["delivered"]
        return n / (time.perf_counter() - wall), (time.process_time() - cpu) / n * 1e6
    finally:
        await book.engine.dispose()


async def measure(urls: dict[str, str], n: int, rounds: int) -> None:
    print(f"| backend | channels | notifications/s (median of {rounds}) | client CPU per notification |")
    print("|---|---|---|---|")
    for backend, url in urls.items():
        for fallback in (False, True):
            figures = [await one_round(url(r) if callable(url) else url, n, fallback) for r in range(rounds)]
            rate = statistics.median(f[0] for f in figures)
            cpu = statistics.median(f[1] for f in figures)
            label = "slack reject, email reject, pagerduty accept" if fallback else "email accepts"
            print(f"| {backend} | {label} | {rate:,.0f} | {cpu:,.0f} us |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="statebook-notifications-"))
    counter = iter(range(10_000))
    sqlite = lambda _r: f"sqlite:///{tmp / f'n{next(counter)}.db'}"  # noqa: E731 - a fresh file per round
    if args.pg_url:
        asyncio.run(measure({"sqlite": sqlite, "postgresql": args.pg_url}, args.n, args.rounds))
        return
    import pgcluster

    with pgcluster.throwaway_cluster() as url:
        asyncio.run(measure({"sqlite": sqlite, "postgresql": url}, args.n, args.rounds))


if __name__ == "__main__":
    main()
