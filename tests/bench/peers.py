"""The peers: pgqueuer and procrastinate, driven through their public APIs (read from their source).

pgqueuer 1.x: ``Queries(AsyncpgDriver(conn)).enqueue(entrypoint, payload, priority)`` (lists for a
batch), ``QueueManager(queries).entrypoint(name)`` and ``qm.run(batch_size=, mode=drain)``; jobs
wake the worker with LISTEN/NOTIFY. procrastinate 3.x: ``App(connector=PsycopgConnector(...))``,
``task.defer_async`` / ``task.batch_defer_async``, ``app.run_worker_async(concurrency=, wait=False)``.

Drains are timed to the last job's execution, recorded inside the job (pgqueuer's drain mode lingers
after its last job; procrastinate's worker polls before exiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg

from common import BATCH, CONCURRENCY, METER, W3_IDLE_GAP

PAYLOAD = b'{"kind":"bench.noop"}'


class Drain:
    """Counts deliveries; remembers when the last one happened; fires ``done`` at ``expected``."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.last = 0.0
        self.done = asyncio.Event()

    def hit(self) -> None:
        self.count += 1
        self.last = time.perf_counter()
        if self.count >= self.expected:
            self.done.set()


# -- pgqueuer ----------------------------------------------------------------------------------

class PgQueuerPeer:
    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: asyncpg.Connection | None = None

    async def open(self) -> None:
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        logging.getLogger("pgqueuer").setLevel(logging.WARNING)
        self.conn = await asyncpg.connect(self.url)
        self.queries = Queries(AsyncpgDriver(self.conn))
        if not await self.queries.schema_is_installed():
            await self.queries.install()

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def reset(self) -> None:
        await self.queries.clear_queue()
        await self.queries.clear_queue_log()
        await self.queries.clear_statistics_log()

    async def enqueue_single(self, n: int) -> float:
        METER.start()
        for _ in range(n):
            await self.queries.enqueue("noop", PAYLOAD, 0)
        return METER.stop()

    async def enqueue_batches(self, total: int, batch: int) -> float:
        METER.start()
        for base in range(0, total, batch):
            k = min(batch, total - base)
            await self.queries.enqueue(["noop"] * k, [PAYLOAD] * k, [0] * k)
        return METER.stop()

    def _manager(self, conn: asyncpg.Connection, drain: Drain):  # type: ignore[no-untyped-def]
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries

        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job) -> None:  # type: ignore[no-untyped-def]
            drain.hit()

        return qm

    async def drain(self, n: int) -> float:
        """Seconds from worker start to the ``n``-th job's execution (``n`` jobs enqueued first)."""
        from pgqueuer.types import QueueExecutionMode

        await self.enqueue_batches(n, 1000)
        drain = Drain(n)
        conn = await asyncpg.connect(self.url)
        try:
            qm = self._manager(conn, drain)
            METER.cpu = 0.0  # the enqueue above is not part of the figure
            start = METER.start()
            runner = asyncio.create_task(qm.run(batch_size=BATCH, mode=QueueExecutionMode.drain))
            await drain.done.wait()
            METER.stop()
            qm.shutdown.set()
            await runner
        finally:
            await conn.close()
        return drain.last - start

    async def latency(self, samples: int) -> list[float]:
        """Milliseconds from enqueue call to job execution, one job at a time into an idle worker."""
        stamps: list[float] = []
        got = asyncio.Event()

        class One(Drain):
            def hit(self) -> None:
                stamps.append(time.perf_counter())
                got.set()

        conn = await asyncpg.connect(self.url)
        qm = self._manager(conn, One(1))
        runner = asyncio.create_task(qm.run(batch_size=BATCH))
        out: list[float] = []
        try:
            await asyncio.sleep(0.2)  # listener registered
            for _ in range(samples):
                got.clear()
                t0 = time.perf_counter()
                await self.queries.enqueue("noop", PAYLOAD, 0)
                await asyncio.wait_for(got.wait(), 10)
                out.append((stamps[-1] - t0) * 1000)
                await asyncio.sleep(W3_IDLE_GAP)
        finally:
            qm.shutdown.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner, 10)
            await conn.close()
        return out


# -- procrastinate -----------------------------------------------------------------------------

class ProcrastinatePeer:
    def __init__(self, url: str) -> None:
        self.url = url

    async def open(self) -> None:
        import procrastinate

        logging.getLogger("procrastinate").setLevel(logging.WARNING)
        self.drain_state = Drain(0)
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=self.url, min_size=2, max_size=CONCURRENCY + 2)
        )
        state = self

        @self.app.task(name="noop")
        async def noop(n: int) -> None:
            state.drain_state.hit()

        self.task = noop
        await self.app.open_async()
        conn = await asyncpg.connect(self.url)
        try:
            installed = await conn.fetchval("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")
        finally:
            await conn.close()
        if not installed:
            await self.app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def reset(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers "
                               "RESTART IDENTITY CASCADE")
        finally:
            await conn.close()

    async def enqueue_single(self, n: int) -> float:
        METER.start()
        for i in range(n):
            await self.task.defer_async(n=i)
        return METER.stop()

    async def enqueue_batches(self, total: int, batch: int) -> float:
        METER.start()
        for base in range(0, total, batch):
            await self.task.batch_defer_async(*({"n": base + i} for i in range(min(batch, total - base))))
        return METER.stop()

    async def drain(self, n: int) -> float:
        await self.enqueue_batches(n, 1000)
        self.drain_state = Drain(n)
        METER.cpu = 0.0  # the enqueue above is not part of the figure
        start = METER.start()
        await self.app.run_worker_async(concurrency=CONCURRENCY, wait=False, install_signal_handlers=False,
                                        listen_notify=False, delete_jobs="never")
        METER.stop()
        if self.drain_state.count != n:
            raise RuntimeError(f"procrastinate ran {self.drain_state.count} of {n} jobs")
        return self.drain_state.last - start
