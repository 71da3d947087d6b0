"""Notifications delivered per second through a real channel adapter (issue 15): the signed webhook
over HTTP to a local aiohttp receiver answering at once or after a provider latency, against the
in-process scripted channel on the same book — what the HTTP path, the signature and the guard cost.

    .venv/bin/python tests/bench/channels.py [--n 500] [--rounds 3] [--latency-ms 20] [--pg-url URL]

Each round accepts N GUARANTEED notifications (not timed) and times passes of
``deliver_due_notifications`` (100 per pass, 10 at once) until every one is delivered. The receiver
runs in the same process (its CPU is in the figures). Prints medians and the ratio to the scripted
channel.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "channels"))  # tests/channels: http_server


async def one_round(url: str, n: int, kind: str, latency: float) -> float:
    from http_server import serve

    from statebook.adapters.channels.webhook import WebhookChannel
    from statebook.adapters.db import open_book, reset_schema
    from statebook.outbox.notifications import send_notification
    from statebook.outbox.notifications.delivery import deliver_due_notifications
    from statebook.outbox.notifications.scripted import ScriptedChannel

    book = await open_book(url)
    try:
        if book.dialect == "postgresql":
            await reset_schema(book.engine)
        for _ in range(n):
            await send_notification(book, recipient="ops", content={"text": "disk full"}, mode="guaranteed",
                                    channels=["webhook"])
        async with serve("webhook", "slow" if latency else "accept", delay=latency) as server:
            channel = (ScriptedChannel("webhook", ["success"]) if kind == "scripted" else
                       WebhookChannel(url=f"{server.url}/hook", secret="bench-signing-secret-0123456789"))
            delivered = 0
            wall = time.perf_counter()
            try:
                while delivered < n:
                    counts = await deliver_due_notifications(book, {"webhook": channel}, limit=100, concurrency=10,
                                                             deadline=5.0)
                    if counts["claimed"] == 0:
                        raise RuntimeError(f"only {delivered} of {n} delivered: {counts}")
                    delivered += counts["delivered"]
                return n / (time.perf_counter() - wall)
            finally:
                if hasattr(channel, "aclose"):
                    await channel.aclose()
    finally:
        await book.engine.dispose()


async def measure(urls: dict[str, object], n: int, rounds: int, latency_ms: float) -> None:
    print(f"| backend | channel | provider latency | notifications/s (median of {rounds}) | vs scripted |")
    print("|---|---|---|---|---|")
    for backend, url in urls.items():
        base = None
        for kind, latency in (("scripted", 0.0), ("webhook", 0.0), ("webhook", latency_ms / 1000)):
            rates = [await one_round(url(r) if callable(url) else url, n, kind, latency) for r in range(rounds)]
            rate = statistics.median(rates)
            base = base or rate
            shown = "-" if kind == "scripted" else f"{latency * 1000:g} ms"
            print(f"| {backend} | {kind} | {shown} | {rate:,.0f} | {rate / base:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--pg-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        urls: dict[str, object] = {"SQLite": lambda r: f"sqlite:///{Path(folder) / f'c{r}.db'}"}
        if args.pg_url:
            urls["PostgreSQL"] = args.pg_url
            asyncio.run(measure(urls, args.n, args.rounds, args.latency_ms))
            return
        import pgcluster

        bindir = pgcluster.find_pg_bin()
        if bindir is None:
            asyncio.run(measure(urls, args.n, args.rounds, args.latency_ms))
            return
        with pgcluster.throwaway_cluster(bindir) as pg:
            urls["PostgreSQL"] = pg
            asyncio.run(measure(urls, args.n, args.rounds, args.latency_ms))


if __name__ == "__main__":
    main()
