"""Micro-benchmark of the lifecycle core: sequential creates/s, transitions/s and verify facts/s.

    .venv/bin/python tests/bench/micro_lifecycle.py [--n 1000] [--backend sqlite|postgres|both]

SQLite runs on a temporary file (WAL, synchronous=NORMAL). PostgreSQL uses STATEBOOK_TEST_PG_URL
when set, otherwise a throwaway cluster from tests/pgcluster.py — which runs with fsync and
synchronous_commit off, so its figures are an upper bound for a durable server. Every operation is
its own transaction, one after the other (no concurrency): this measures per-command overhead of
the engine (policy check, compare-and-set, fact hash and insert), not a workload. Numbers are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS_DIR))

import pgcluster  # noqa: E402

from statebook.adapters.db import open_book, reset_schema  # noqa: E402
from statebook.lifecycle import Actor, Reason, create, transition, verify  # noqa: E402

ENQUEUED = Reason("dispatch.pending.enqueued", "bench")
CLAIMED = Reason("dispatch.delivering.attempt", "bench")
SYSTEM = Actor("system", "bench")


async def measure(url: str, n: int, *, reset: bool) -> dict[str, float]:
    book = await open_book(url)
    try:
        if reset:
            await reset_schema(book.engine)
        values = dict(kind="bench", deliver_to="log:", payload={"n": 0}, next_attempt_at=0.0, created_at=0.0)
        ids = [f"bench{i:06d}" for i in range(n)]

        start = time.perf_counter()
        for entity_id in ids:
            await create(book, "dispatch", values=values, entity_id=entity_id, status="pending", reason=ENQUEUED,
                         actor=SYSTEM)
        creates = n / (time.perf_counter() - start)

        start = time.perf_counter()
        for entity_id in ids:
            outcome = await transition(book, "dispatch", entity_id, "delivering", expected="pending",
                                       guards={"attempt": 0}, patch={"attempt": 1}, reason=CLAIMED, actor=SYSTEM)
            assert outcome.applied
        transitions = n / (time.perf_counter() - start)

        start = time.perf_counter()
        report = await verify(book, "dispatch")
        elapsed = time.perf_counter() - start
        assert report.ok and report.facts == 2 * n, report.to_json()
        return {"creates/s": creates, "transitions/s": transitions, "verify facts/s": report.facts / elapsed}
    finally:
        await book.engine.dispose()


@contextlib.contextmanager
def postgres_url() -> Iterator[str]:
    url = os.environ.get("STATEBOOK_TEST_PG_URL")
    if url:
        yield url
        return
    with pgcluster.throwaway_cluster() as url:
        yield url


def show(backend: str, n: int, figures: dict[str, float]) -> None:
    cells = "  ".join(f"{name} {value:>9,.0f}" for name, value in figures.items())
    print(f"{backend:<10} n={n:<6} {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="entities to create and transition (default 1000)")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, sequential, one transaction per operation")
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory(prefix="statebook-micro-") as tmp:
            show("sqlite", args.n, asyncio.run(measure(f"sqlite:///{tmp}/micro.db", args.n, reset=False)))
    if args.backend in ("postgres", "both"):
        with postgres_url() as url:
            show("postgresql", args.n, asyncio.run(measure(url, args.n, reset=True)))


if __name__ == "__main__":
    main()
