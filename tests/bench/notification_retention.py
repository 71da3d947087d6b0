"""Notification retention's cost (specs/notifications.md N30) against the bare purge it is built on.

Each round seeds N settled notifications (``deduplicated`` at intake, half of them followers of an owner
in the set, each with one channel attempt, `not_started`) on a fresh database, then removes them all either with
``apply_notification_retention`` (list once; per batch of 500 lock, re-check, read the links, purge the
notifications and their attempts; then the claims; the run record) or with the floor: the same ids
purged with ``purge_many`` 500 at a time (notifications and attempts, no checks, no run record).
Prints rows removed per second (medians of the rounds, the two interleaved), the ratio, and client CPU
seconds per 1000 rows.

    .venv/bin/python tests/bench/notification_retention.py [--rows 5000] [--rounds 3] [--backend sqlite,postgres]
        [--pg-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statebook.adapters.db import open_book, reset_schema  # noqa: E402
from statebook.lifecycle import Actor, FakeClock, NewEntity, Reason, create_many  # noqa: E402
from statebook.lifecycle.codec import new_id  # noqa: E402
from statebook.lifecycle.engine import purge_many  # noqa: E402
from statebook.outbox.notifications import apply_notification_retention  # noqa: E402

from common import SqliteFiles, run_with_postgres  # noqa: E402  (tests/bench, the script's directory)

ACTOR = Actor("system", "bench")
DAY = 86400.0


def _notification(i: int, owner: str | None, at: float) -> dict:
    return {"id": new_id(), "recipient": "ops", "content": {"i": i}, "mode": "guaranteed", "channels": ["email"],
            "created_at": at, "content_hash": f"{i:064x}", "next_attempt_at": None, "obligation_owner_id": owner}


def _attempt(nid: str, at: float) -> dict:
    return {"id": new_id(), "notification_id": nid, "cycle": 1, "attempt": 1, "channel": "email", "position": 1,
            "claim_id": "c", "lease_until": at + 60, "made_at": at, "started_at": None, "ended_at": at}


async def seed(book, rows: int) -> tuple[list[str], list[str]]:
    at = book.clock.now()
    values, attempts = [], []
    for i in range(0, rows, 2):
        owner = _notification(i, None, at)
        values += [owner, _notification(i + 1, owner["id"], at)]
    reason = Reason("notification.deduplicated.window", "bench")
    for start in range(0, len(values), 500):
        await create_many(book, "notification", [NewEntity(v, "deduplicated", reason, ACTOR)
                                                 for v in values[start : start + 500]], fresh_ids=True)
    attempts = [_attempt(v["id"], at) for v in values]
    reason = Reason("channel_attempt.not_started.observed", "bench")
    for start in range(0, len(attempts), 500):
        await create_many(book, "channel_attempt", [NewEntity(a, "not_started", reason, ACTOR)
                                                    for a in attempts[start : start + 500]], fresh_ids=True)
    # Followers first, as retention lists them, so the floor removes the same rows in the same order.
    followers = [v["id"] for v in values if v["obligation_owner_id"]]
    return followers + [v["id"] for v in values if not v["obligation_owner_id"]], [a["id"] for a in attempts]


async def one(url: str, rows: int, how: str) -> tuple[float, float]:
    clock = FakeClock()
    book = await open_book(url, clock=clock, create=True)
    try:
        await reset_schema(book.engine)
        ids, attempts = await seed(book, rows)
        clock.advance(30 * DAY)
        wall, cpu = time.perf_counter(), time.process_time()
        if how == "retention":
            report = await apply_notification_retention(book, before=clock.now() - 7 * DAY, horizon=7 * DAY)
            assert len(report.notifications) == rows, report.counts
        else:
            for start in range(0, rows, 500):
                await purge_many(book, "notification", ids[start : start + 500], actor=ACTOR,
                                 reason=Reason("notification.purged.retention", "floor"), expected="deduplicated")
            for start in range(0, rows, 500):
                await purge_many(book, "channel_attempt", attempts[start : start + 500], actor=ACTOR,
                                 reason=Reason("channel_attempt.purged.retention", "floor"))
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await book.engine.dispose()


async def measure(url_for, label: str, rows: int, rounds: int) -> None:
    got: dict[str, list[tuple[float, float]]] = {"retention": [], "purge_many": []}
    for r in range(rounds):
        for how in (("retention", "purge_many") if r % 2 == 0 else ("purge_many", "retention")):
            got[how].append(await one(url_for(), rows, how))
    wall = {k: statistics.median(w for w, _ in v) for k, v in got.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in got.items()}
    print(f"{label}: {rows} rows, {rounds} rounds (medians)")
    for k in got:
        print(f"  {k:10s} {rows / wall[k]:9.0f} rows/s   client CPU {1000 * cpu[k] / rows:.3f} s per 1000 rows")
    print(f"  retention / purge_many: {wall['retention'] / wall['purge_many']:.2f}x the wall time, "
          f"{cpu['retention'] / cpu['purge_many']:.2f}x the client CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="sqlite,postgres")
    parser.add_argument("--pg-url")
    args = parser.parse_args()
    backends = args.backend.split(",")
    if "sqlite" in backends:
        files = SqliteFiles()
        asyncio.run(measure(lambda: f"sqlite:///{files.fresh('retention')}", "sqlite", args.rows, args.rounds))
    if "postgres" in backends:
        async def job(url: str) -> None:
            await measure(lambda: url, "postgres", args.rows, args.rounds)

        run_with_postgres(args.pg_url, job)


if __name__ == "__main__":
    main()
