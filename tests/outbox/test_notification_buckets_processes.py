"""N8 across OS processes on PostgreSQL: several workers draw from ONE rate_bucket for ~2 s of wall time.

The seed's process-local buckets let N processes send N times the limit. Here every process draws from the
bucket row in the database, so the sends of the whole fleet, in every window [a, b] of time, stay within
``capacity + refill_per_second * (b - a)``.

Run as a script, this file is the worker (the test and tests/bench/notification_buckets.py spawn it):

    python tests/outbox/test_notification_buckets_processes.py DB_URL CHANNEL SCOPE START_AT SECONDS

It waits until the wall time START_AT (0: it prints "ready" once connected and reads the start time from
stdin, as spawn() does), then draws in a loop (one transaction per draw, the system clock)
for SECONDS, sleeping briefly when the bucket is empty, and prints one JSON line: its draws, its refusals
and its CPU seconds.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Serial: processes sharing one bucket for a few seconds; the bound is the bucket's refill in real time.
pytestmark = pytest.mark.serial

WORKER = Path(__file__).resolve()
IDLE = 0.002
"""Seconds a worker sleeps at most after an empty bucket (short: the workers hammer the row)."""


async def work(url: str, channel: str, scope: str, start_at: float, seconds: float) -> dict:
    from statebook.adapters.db import open_book
    from statebook.outbox.notifications.buckets import draw

    book = await open_book(url, create=False)
    drawn = refused = 0
    try:
        if start_at <= 0:  # started by spawn(): say we are ready, then read the common start time
            async with book.read():
                pass  # connected: the first draw does not pay for the connection
            print("ready", flush=True)
            start_at = float(await asyncio.to_thread(sys.stdin.readline))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu = time.process_time()
        while time.time() < start_at + seconds:
            async with book.begin() as tx:
                wait = await draw(tx, channel, scope, now=tx.clock.now())
            if wait == 0.0:
                drawn += 1
            else:
                refused += 1
                await asyncio.sleep(min(wait, IDLE))
        return {"drawn": drawn, "refused": refused, "cpu": time.process_time() - cpu}
    finally:
        await book.engine.dispose()


def spawn(url: str, channel: str, scope: str, processes: int, seconds: float, lead: float = 0.3
          ) -> tuple[float, list[dict]]:
    """Run ``processes`` workers that start together: once every one has imported statebook and connected
    (however long a loaded machine takes), the common start is ``lead`` seconds later. (That wall time,
    their JSON lines.)"""
    procs = [subprocess.Popen([sys.executable, str(WORKER), url, channel, scope, "0", repr(seconds)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(processes)]
    for p in procs:
        line = p.stdout.readline() if p.stdout else ""
        assert line.strip() == "ready", (line, p.stderr.read() if p.poll() is not None and p.stderr else "")
    start_at = time.time() + lead
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at!r}\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120 + lead + seconds)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return start_at, out


def worst_window(times: list[float], capacity: float, refill: float) -> float:
    """max over windows [t_i, t_j] of draws in it minus the bucket's bound there (<= 0 when the limit held)."""
    times = sorted(times)
    worst = -float("inf")
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            worst = max(worst, (j - i + 1) - (capacity + refill * (times[j] - start)))
    return worst


async def drawn_at(book, entity_id: str) -> list[float]:
    """The effective time of every draw: the ``refilled_at`` its fact wrote (max of its ``now`` and the
    previous refill: a drawer whose clock reading was older than the bucket's refills nothing)."""
    from statebook.lifecycle import history

    return [f.patch["refilled_at"] for f in await history(book, "rate_bucket", entity_id)
            if f.reason_code == "rate_bucket.open.drawn"]


if __name__ == "__main__":
    url, channel, scope, start, secs = sys.argv[1:6]
    print(json.dumps(asyncio.run(work(url, channel, scope, float(start), float(secs)))))
    sys.exit(0)


# -- the test -----------------------------------------------------------------------------------------
from profiles import soak_seconds  # noqa: E402  (here: run as a worker script, this file stops above)

PROCESSES = 4
SECONDS = soak_seconds(2.0)
CAPACITY = 5
REFILL = 20.0


@pytest.fixture
async def pg_book(pg_url):
    from statebook.adapters.db import open_book, reset_schema

    book = await open_book(pg_url)
    await reset_schema(book.engine)
    try:
        yield book
    finally:
        await book.engine.dispose()


@pytest.mark.postgres
async def test_processes_sharing_one_bucket_never_exceed_it(pg_book, pg_url):
    """N8: four OS processes draw from one bucket (capacity 5, 20 tokens/s) for 2 s of wall time (20 s under the deep profile). The total
    drawn never exceeds capacity + refill * elapsed (from the common start, when the bucket holds at most
    its capacity, to the last process's end), every window of the draws' times stays within the bound, each draw is one fact, the
    row is the fold of its facts and the history verifies."""
    from statebook.lifecycle import replay, verify
    from statebook.lifecycle.replay import read_row
    from statebook.outbox.notifications.buckets import ensure_bucket

    await ensure_bucket(pg_book, "slack", "fleet", capacity=CAPACITY, refill_per_second=REFILL)
    start_at, results = await asyncio.to_thread(spawn, pg_url, "slack", "fleet", PROCESSES, SECONDS)
    elapsed = time.time() - start_at
    total = sum(r["drawn"] for r in results)
    bound = CAPACITY + REFILL * elapsed
    assert total <= bound, (total, bound, results)
    # At least two processes drew from the one bucket (sharing, not one process alone). Not all of them:
    # on a loaded machine a process can start after the window closed and draw nothing.
    assert sum(r["drawn"] > 0 for r in results) >= 2, results
    assert sum(r["refused"] for r in results) > 0, results  # the limit was reached: the test tested something
    times = await drawn_at(pg_book, "slack:fleet")
    assert len(times) == total
    assert worst_window(times, CAPACITY, REFILL) <= 1e-6
    assert await replay(pg_book, "rate_bucket", "slack:fleet") == await read_row(pg_book, "rate_bucket", "slack:fleet")
    assert (await verify(pg_book, "rate_bucket")).ok
    print(f"drawn {total} of a bound of {bound:.1f} over {elapsed:.2f} s; per process {[r['drawn'] for r in results]}")
