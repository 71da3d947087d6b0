"""W2p: W2's drain of the same N dispatches by 1, 2 and 4 worker processes on one PostgreSQL database.

The parent seeds N pending dispatches (statebook) or jobs (pgqueuer), then starts K children of this
module (``scaling.py worker SIDE URL``). Each child opens its own book or QueueManager, prints
``ready``, waits for ``go`` on stdin (the shared start barrier: the parent writes it to every child
once all are ready), drains until nothing is left for it, and prints one JSON record: when it read
``go``, the monotonic time of each delivery, the id of each delivery and its client CPU. The figure
is N over the span from the first child's ``go`` to the last delivery in any child; the ids of all
children together must be the N seeded ones, each once (no double delivery).

CLOCK_MONOTONIC is one clock for every process of the machine, so the children's times compare.
On 2 cores, 4 processes compete with each other and with the server: the curve is the result, not
the absolute rates (specs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if __name__ == "__main__":  # a child: the bench's flat modules and tests/pgcluster.py, as run.py has them
    sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

import peers  # noqa: E402
import statebook_side as sb  # noqa: E402
from common import BATCH, CONCURRENCY, Line, interleave, median, throughput_line  # noqa: E402

PROCESSES = (1, 2, 4)
SIDES = ("statebook", "pgqueuer")
IDLE_PASSES = 2
"""A statebook child stops after this many passes in a row that claimed nothing (another child may
have won a pass's rows and still be delivering them; a second empty pass, after a pause, confirms)."""


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass
class Outcome:
    """What the K children of one drain did, together."""

    n: int
    span: float
    ids: Counter[str]
    cpu: float

    @property
    def rate(self) -> float:
        return self.n / self.span

    def check(self) -> None:
        """Every one of the ``n`` seeded items delivered, none twice (the ids are unique per item)."""
        twice = [i for i, c in self.ids.items() if c > 1]
        if twice:
            raise RuntimeError(f"{len(twice)} item(s) delivered more than once, e.g. {twice[:3]}")
        if len(self.ids) != self.n:
            raise RuntimeError(f"{len(self.ids)} items delivered of {self.n} seeded")


# -- the children ------------------------------------------------------------------------------

class Record:
    """One child's deliveries: their times and ids."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.ids: list[str] = []

    def hit(self, ident: str) -> None:
        self.times.append(now())
        self.ids.append(ident)


async def _statebook_child(url: str, wait_for_go) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from statebook.adapters.db import open_book
    from statebook.outbox import CallableTransport, deliver_due_dispatches

    record = Record()

    async def sink(_deliver_to: str, payload: str) -> None:
        record.hit(payload)  # the body carries the seed's sequence number: unique per dispatch

    book = await open_book(url)
    transport = CallableTransport(sink)
    try:
        start, cpu0 = await wait_for_go()
        idle = 0
        while idle < IDLE_PASSES:
            counts = await deliver_due_dispatches(book, transport=transport, batch_size=BATCH,
                                                  concurrency=CONCURRENCY)
            idle = idle + 1 if counts["attempted"] == 0 else 0
            if idle:
                await asyncio.sleep(0.05)
        cpu = time.process_time() - cpu0
    finally:
        await book.engine.dispose()
    return {"start": start, "times": record.times, "ids": record.ids, "cpu": cpu}


async def _pgqueuer_child(url: str, wait_for_go) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    record = Record()
    conn = await asyncpg.connect(url)
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job) -> None:  # type: ignore[no-untyped-def]
            record.hit(str(job.id))

        start, cpu0 = await wait_for_go()
        await qm.run(batch_size=BATCH, mode=QueueExecutionMode.drain)  # returns once the queue is empty
        cpu = time.process_time() - cpu0
    finally:
        await conn.close()
    return {"start": start, "times": record.times, "ids": record.ids, "cpu": cpu}


def child_main(side: str, url: str) -> None:
    """``scaling.py worker SIDE URL``: print ``ready``, wait for ``go``, drain, print the JSON record."""
    import logging

    logging.getLogger("pgqueuer").setLevel(logging.WARNING)

    async def wait_for_go() -> tuple[float, float]:
        print("ready", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "go":
            raise SystemExit(f"expected 'go' on stdin, got {line!r}")
        return now(), time.process_time()

    run = _statebook_child if side == "statebook" else _pgqueuer_child
    print(json.dumps(asyncio.run(run(url, wait_for_go))), flush=True)


# -- the parent --------------------------------------------------------------------------------

def _spawn(side: str, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "worker", side, url],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=BENCH_DIR)


def _expect(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        raise RuntimeError(f"a worker process exited ({proc.returncode}) before it printed {what}")
    return line


def run_children(side: str, url: str, k: int, n: int, timeout: float = 600.0) -> Outcome:
    """Start ``k`` children of ``side`` on ``url`` (seeded with ``n`` items), release them together,
    and gather what they delivered (blocking: call it in a thread from a loop)."""
    procs = [_spawn(side, url) for _ in range(k)]
    try:
        for p in procs:
            if _expect(p, "ready").strip() != "ready":
                raise RuntimeError(f"a {side} worker process did not say ready")
        for p in procs:  # the barrier: nobody starts before everybody is connected
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        records = []
        for p in procs:
            records.append(json.loads(_expect(p, "its record")))
            p.wait(timeout)
            if p.returncode:
                raise RuntimeError(f"a {side} worker process exited {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    start = min(r["start"] for r in records)
    last = max((t for r in records for t in r["times"]), default=start)
    ids = Counter(i for r in records for i in r["ids"])
    return Outcome(n, max(last - start, 1e-9), ids, sum(r["cpu"] for r in records))


# -- the workload ------------------------------------------------------------------------------

async def seed_statebook(url: str, n: int) -> None:
    """``n`` pending dispatches (bodies ``{"n": i}``, so each payload is unique) on an emptied book."""
    book = await sb.fresh_book(url)
    try:
        await sb.enqueue_batches(book, n, 500)
    finally:
        await book.engine.dispose()


async def seed_pgqueuer(url: str, n: int) -> None:
    peer = peers.PgQueuerPeer(url)
    await peer.open()
    try:
        await peer.reset()
        await peer.enqueue_batches(n, 1000)
    finally:
        await peer.close()


async def drain(side: str, url: str, k: int, n: int) -> Outcome:
    """One round: seed ``n`` items, drain them with ``k`` processes, check each ran exactly once."""
    await (seed_statebook if side == "statebook" else seed_pgqueuer)(url, n)
    outcome = await asyncio.to_thread(run_children, side, url, k, n)
    outcome.check()
    return outcome


async def w2p(ctx: Any) -> list[Line]:
    """W2p lines: per K, statebook against pgqueuer (each on its own database of the same server)."""
    n = ctx.sizes.w2_drain
    urls = {"statebook": ctx.pg["statebook"], "pgqueuer": ctx.pg["pgqueuer"]}
    cpu: dict[str, list[float]] = {}

    def contender(side: str, k: int):  # type: ignore[no-untyped-def]
        async def run() -> float:
            outcome = await drain(side, urls[side], k, n)
            cpu.setdefault(f"{side}-{k}", []).append(outcome.cpu)
            return outcome.rate
        return run

    ctx.log(f"W2p: {n:,} dispatches drained by {', '.join(map(str, PROCESSES))} worker processes on one database")
    contenders = [(f"{side}-{k}", contender(side, k)) for k in PROCESSES for side in SIDES]
    r = await interleave(ctx.rounds, contenders, ctx.log)
    lines = []
    for k in PROCESSES:
        sb_key, pq_key = f"statebook-{k}", f"pgqueuer-{k}"
        cpu_us = (median(cpu[sb_key]) / n * 1e6, median(cpu[pq_key]) / n * 1e6)
        lines.append(throughput_line(f"W2p drain, {k} process{'es' if k > 1 else ''} ({n:,})", "postgresql",
                                     "deliv/s", r[sb_key], "pgqueuer", r[pq_key], None, cpu=cpu_us))
    return lines


def notes(lines: Sequence[Line]) -> list[str]:
    """What run.py prints under the table when W2p ran: the curve of each side against its 1-process rate."""
    ours = [ln for ln in lines if ln.workload.startswith("W2p") and ln.statebook and ln.other]
    if not ours:
        return []
    first = ours[0]
    curve = "; ".join(f"{ln.workload.split(',')[1].split('(')[0].strip()}: "
                      f"statebook x{ln.statebook / first.statebook:.2f}, pgqueuer x{ln.other / first.other:.2f}"
                      for ln in ours[1:])
    return [f"W2p against 1 process: {curve or 'no other process count ran'}.",
            f"W2p on {os.cpu_count()} cores: past that many processes the workers share the cores with each other and "
            "with the server, so the curve is the result to keep, not its absolute rates; client CPU/op is all "
            "processes' CPU over N."]


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "worker" or sys.argv[2] not in SIDES:
        raise SystemExit(f"usage: {Path(__file__).name} worker {{{','.join(SIDES)}}} URL")
    child_main(sys.argv[2], sys.argv[3])
