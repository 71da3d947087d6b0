"""The peers that durably record every step: DBOS Transact and eventsourcing, through their public APIs.

DBOS 3.x: a process-wide singleton. ``DBOS(config={"name", "system_database_url"})``, ``DBOS.launch()``,
``DBOS.destroy()``; ``DBOS.reset_system_database(truncate=True)`` empties its tables (only before a
launch). Queues are rows of its system database (``DBOS.register_queue``); a launched process runs a
polling worker thread per queue it listens to (``DBOS.listen_queues`` before launch). Workflows and
steps are decorated functions; it has no batch enqueue. Every step's output is a row (operation_outputs),
every workflow a status row.

eventsourcing 9.x: an ``Application`` whose persistence module comes from its environment
(``PERSISTENCE_MODULE`` = ``eventsourcing.sqlite`` or ``eventsourcing.postgres``); ``app.save(aggregate)``
appends the aggregate's new events (one stored_events row each) in one transaction, with optimistic
concurrency on (originator_id, originator_version).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from dbos import DBOS, SetWorkflowID
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from common import CONCURRENCY, METER

CHAIN = ("drafted", "submitted", "approved", "scheduled", "shipped", "delivered")
"""W7's six statuses: five guarded transitions from first to last, the same for every contender."""
QUEUE = "bench_noop"
POLL_SECONDS = 0.01
"""DBOS's queue polling interval (its default is 1 s, which would make every drain a wait)."""


_AFTER_DBOS = ThreadPoolExecutor(thread_name_prefix="bench")
"""The loop's default executor once DBOS is destroyed (one for the whole run, not one per round)."""


class Steps:
    """Counts executed steps across threads (DBOS runs dequeued workflows on a loop of its own)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.last = 0.0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def hit(self) -> None:
        with self._lock:
            self.count += 1
            self.last = time.perf_counter()
            if self.count >= self.expected:
                self.done.set()


# -- DBOS ------------------------------------------------------------------------------------

_steps = Steps(0)
_stamps: dict[str, list[float]] = {}
"""W7: per workflow id, the time each of its steps began (the boundaries between transitions)."""


@DBOS.step()
async def noop_step(n: int) -> int:
    _steps.hit()
    return n


@DBOS.workflow()
async def noop_workflow(n: int) -> int:
    return await noop_step(n)


@DBOS.step()
async def move_step(entity: str, to: str) -> str:
    _stamps[entity].append(time.perf_counter())
    return to


@DBOS.workflow()
async def chain_workflow(entity: str) -> str:
    status = CHAIN[0]
    for target in CHAIN[1:]:
        # the guard: the workflow's own record of where the entity is (DBOS replays it from the steps)
        if CHAIN.index(target) != CHAIN.index(status) + 1:
            raise RuntimeError(f"{entity}: {status} -> {target} is not an edge")
        status = await move_step(entity, target)
    return status


def dbos_url(url: str) -> str:
    """DBOS takes SQLAlchemy URLs; a bare ``postgresql://`` would select psycopg2, not installed."""
    return url.replace("postgresql://", "postgresql+psycopg://", 1) if url.startswith("postgresql://") else url


class DbosPeer:
    """One DBOS system database (a PostgreSQL database or a SQLite file); DBOS launched per phase."""

    def __init__(self, url: str) -> None:
        self.url = dbos_url(url)
        logging.getLogger("dbos").setLevel(logging.WARNING)

    def _create(self) -> None:
        DBOS(config={"name": "statebook-bench", "system_database_url": self.url, "log_level": "WARNING",
                     "sys_db_pool_size": CONCURRENCY + 5})

    def _stop(self) -> None:
        DBOS.destroy()
        # DBOS made its own executor the loop's default (for asyncio.to_thread) and has just shut it down
        asyncio.get_running_loop().set_default_executor(_AFTER_DBOS)

    async def fresh(self, queues: Sequence[str] = ()) -> None:
        """Empty the system database and launch, dequeuing only from ``queues``."""
        self._create()
        try:
            DBOS.reset_system_database(truncate=True)
        except Exception:  # the first round: no schema to empty yet
            pass
        DBOS.listen_queues(list(queues))
        DBOS.launch()
        await DBOS.register_queue_async(QUEUE, worker_concurrency=CONCURRENCY, polling_interval_sec=POLL_SECONDS)

    async def enqueue_single(self, n: int) -> float:
        """Seconds to enqueue ``n`` one-step workflows on a fresh database (no worker listening)."""
        await self.fresh()
        try:
            METER.start()
            for i in range(n):
                await DBOS.enqueue_workflow_async(QUEUE, noop_workflow, i)
            return METER.stop()
        finally:
            self._stop()

    async def drain(self, n: int) -> tuple[float, int]:
        """Seconds from launching a worker to the ``n``-th step's execution (``n`` enqueued first), and
        the steps DBOS recorded for them."""
        global _steps
        await self.enqueue_single(n)
        _steps = Steps(n)
        self._create()
        METER.cpu = 0.0  # the enqueue above is not part of the figure
        start = METER.start()
        try:
            DBOS.launch()
            waiter = ThreadPoolExecutor(1, thread_name_prefix="bench-wait")
            try:
                done = await asyncio.get_running_loop().run_in_executor(waiter, _steps.done.wait, 60 + n / 10)
            finally:
                waiter.shutdown()
            if not done:
                raise RuntimeError(f"DBOS ran {_steps.count} of {n} steps")
            METER.stop()
            # the last steps' outputs and workflow outcomes are written after their bodies ran
            for _ in range(1000):
                finished = await DBOS.list_workflows_async(queue_name=QUEUE, status="SUCCESS", load_input=False,
                                                           load_output=False)
                if len(finished) >= n:
                    break
                await asyncio.sleep(0.01)
            recorded = await _recorded_steps(finished)
        finally:
            self._stop()
        return _steps.last - start, recorded

    async def w7(self, entities: Sequence[str]) -> tuple[float, list[float], int]:
        """Each entity's workflow of five steps, ``CONCURRENCY`` callers; (seconds, ms per transition,
        steps recorded)."""
        await self.fresh()
        try:
            _stamps.clear()
            latencies: list[float] = []

            async def one(entity: str) -> None:
                _stamps[entity] = []
                t0 = time.perf_counter()
                with SetWorkflowID(f"w7-{entity}"):
                    status = await chain_workflow(entity)
                marks = [t0, *_stamps[entity][1:], time.perf_counter()]
                latencies.extend((b - a) * 1000 for a, b in zip(marks, marks[1:]))
                if status != CHAIN[-1]:
                    raise RuntimeError(f"{entity} ended in {status}")

            seconds = await callers(entities, one)
            statuses = await DBOS.list_workflows_async(workflow_id_prefix="w7-")
            return seconds, latencies, await _recorded_steps(statuses)
        finally:
            self._stop()


async def _recorded_steps(statuses: Sequence[Any]) -> int:
    total = 0
    for status in statuses:
        total += len(await DBOS.list_workflow_steps_async(status.workflow_id))
    return total


async def callers(entities: Sequence[str], one: Callable[[str], Any]) -> float:
    """Seconds for ``CONCURRENCY`` callers to run ``one`` over ``entities`` (each takes the next one)."""
    pending = list(reversed(entities))

    async def caller() -> None:
        while pending:
            await one(pending.pop())

    METER.start()
    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    return METER.stop()


# -- eventsourcing -----------------------------------------------------------------------------

class Parcel(Aggregate):
    """Five events after its creation, each method refusing to run from the wrong status."""

    @event("Drafted")
    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.status = CHAIN[0]

    def _guard(self, expected: str) -> None:
        if self.status != expected:
            raise RuntimeError(f"{self.ref}: expected {expected}, found {self.status}")

    @event("Submitted")
    def submit(self) -> None:
        self._guard("drafted")
        self.status = "submitted"

    @event("Approved")
    def approve(self) -> None:
        self._guard("submitted")
        self.status = "approved"

    @event("Scheduled")
    def schedule(self) -> None:
        self._guard("approved")
        self.status = "scheduled"

    @event("Shipped")
    def ship(self) -> None:
        self._guard("scheduled")
        self.status = "shipped"

    @event("Delivered")
    def deliver(self) -> None:
        self._guard("shipped")
        self.status = "delivered"


COMMANDS = ("submit", "approve", "schedule", "ship", "deliver")


def eventsourcing_env(url: str) -> dict[str, str]:
    """The environment selecting eventsourcing's recorder for a bench URL (``sqlite:///path`` or PostgreSQL)."""
    if url.startswith("sqlite:///"):
        return {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": url.removeprefix("sqlite:///"),
                "SQLITE_LOCK_TIMEOUT": "30"}
    parts = urlsplit(url)
    return {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": parts.path.lstrip("/"),
            "POSTGRES_HOST": parts.hostname or "localhost", "POSTGRES_PORT": str(parts.port or 5432),
            "POSTGRES_USER": parts.username or "postgres", "POSTGRES_PASSWORD": parts.password or "",
            "POSTGRES_POOL_SIZE": str(CONCURRENCY), "CREATE_TABLE": "y"}


class EventsourcingPeer:
    """An ``Application`` on one database; W7's commands run in ``CONCURRENCY`` threads (it is synchronous)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def w7(self, entities: Sequence[str]) -> tuple[float, list[float], int]:
        """(seconds, ms per transition, transition events recorded) for ``entities`` through five commands."""
        app = Application(env=eventsourcing_env(self.url))
        try:
            ids = {}
            for ref in entities:
                parcel = Parcel(ref)
                app.save(parcel)
                ids[ref] = parcel.id
            latencies: list[float] = []
            pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="eventsourcing")
            loop = asyncio.get_running_loop()

            def run(ref: str) -> None:
                for command in COMMANDS:
                    t0 = time.perf_counter()
                    parcel = app.repository.get(ids[ref])
                    getattr(parcel, command)()
                    app.save(parcel)
                    latencies.append((time.perf_counter() - t0) * 1000)

            async def one(ref: str) -> None:
                await loop.run_in_executor(pool, run, ref)

            try:
                seconds = await callers(entities, one)
            finally:
                pool.shutdown()
            recorded = sum(len(list(app.events.get(ids[ref], gt=1))) for ref in entities)
            return seconds, latencies, recorded
        finally:
            app.close()
