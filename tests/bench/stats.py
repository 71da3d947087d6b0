"""``statebook stats`` next to ``statebook dispatch ls --limit 100000`` on 100,000 dispatches, both backends.

Issue 17: the only way to a backlog figure was ``dispatch ls --limit 100000`` (17 s for 100,000 rows).
A database of N delivered dispatches with their facts (``seed.seed_history``) plus a few pending ones is
built on SQLite and PostgreSQL; each command runs as a user runs it (a subprocess, so import time is
included), and ``collect_stats`` is also timed in-process (the query work alone). Medians of the rounds.

    .venv/bin/python tests/bench/stats.py [--rows 100000] [--rounds 3] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statebook.adapters.db import open_book  # noqa: E402
from statebook.adapters.stats import collect_stats  # noqa: E402
from statebook.outbox import enqueue_dispatch  # noqa: E402

import seed  # noqa: E402  (tests/bench, the script's directory)
from common import drop_databases, recreate_databases  # noqa: E402
from workloads import pg_schema  # noqa: E402

EXE = str(Path(sys.executable).parent / "statebook")
DB = "bench_stats"


def timed_cli(url: str, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([EXE, "--db", url, *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


async def in_process(url: str) -> float:
    book = await open_book(url, create=False)
    try:
        started = time.perf_counter()
        await collect_stats(book)
        return time.perf_counter() - started
    finally:
        await book.engine.dispose()


async def prepare(urls: dict[str, str], path: Path, rows: int) -> None:
    await pg_schema(urls["postgresql"])
    book = await open_book(urls["sqlite"])  # the schema, then the bulk rows
    await book.engine.dispose()
    await seed.seed_history(rows, [seed.PgTarget(urls["postgresql"]), seed.SqliteTarget(str(path))])
    for url in urls.values():
        book = await open_book(url, create=False)
        try:
            for i in range(100):
                await enqueue_dispatch(book, kind="bench", deliver_to="x", body={"i": i})
        finally:
            await book.engine.dispose()


def run(pg_base: str, rows: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stats.db"
        pg_url = asyncio.run(recreate_databases(pg_base, [DB]))[DB]
        urls = {"sqlite": f"sqlite:///{path}", "postgresql": pg_url}
        try:
            print(f"seeding {rows:,} delivered dispatches (+100 pending) on both backends ...", flush=True)
            asyncio.run(prepare(urls, path, rows))
            print(f"{'backend':<11} {'statebook stats':>16} {'collect_stats':>14} {'dispatch ls --limit ' + str(rows):>27}"
                  f" {'ratio':>7}")
            for backend, url in urls.items():
                stats = [timed_cli(url, "stats", "--json") for _ in range(rounds)]
                inner = [asyncio.run(in_process(url)) for _ in range(rounds)]
                listing = [timed_cli(url, "dispatch", "ls", "--limit", str(rows), "--json") for _ in range(rounds)]
                s, i, ls = statistics.median(stats), statistics.median(inner), statistics.median(listing)
                print(f"{backend:<11} {s:>15.2f}s {i:>13.3f}s {ls:>26.2f}s {ls / s:>6.1f}x", flush=True)
        finally:
            asyncio.run(drop_databases(pg_base, [DB]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg-url", help="PostgreSQL server to use (default: a throwaway cluster)")
    args = parser.parse_args(argv)
    if args.pg_url:
        run(args.pg_url, args.rows, args.rounds)
        return 0
    import pgcluster

    with pgcluster.throwaway_cluster() as url:
        run(url, args.rows, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
