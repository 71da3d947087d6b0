"""How ``verify`` reads: facts and rows side by side, in ranges of entity ids, in this process and
in worker processes.

Facts and rows are both read in entity id order and merged (:class:`screen.Merge`), so memory
holds a batch, not a table. Each range is read in one transaction, so an entity's facts and row
always come from one snapshot. When the backend offers a database file to read on connections of
its own (``Reads.file_screen``: a SQLite file, the book not bound to a transaction) it is cut into
ranges of about ``CHUNK_FACTS`` facts: a thread of this process screens ranges from the end of the
list while worker processes (:func:`screen.serve`) take them from the front — the screen is
CPU-bound Python, so processes are what use more cores. Otherwise (PostgreSQL, or a bound
transaction whose writes only its connection sees) each lifecycle is one range, read on the book's
connection in one transaction. Every dialect-specific read (the snapshot, undecodable text, the id
order, streaming, the file) is the backend's (``Reads``). Entities that fail the screen go to ``judge`` (the full
check) here; findings come out in range order whoever screened them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .book import Book

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection
from .errors import StorageError
from .facts import SCALAR_FIELDS, STORED_FIELDS, facts_table, stored_column
from .policy import Lifecycle
from .schema import row_defaults
from .screen import BATCH, Merge, Screen, Suspect, Worker, WorkerError, byte_key
from .store import FileScreen, Reads

log = logging.getLogger("statebook.lifecycle")

TICK = 5000
"""Progress is reported about every this many facts."""
PARALLEL_MIN_FACTS = 50_000
"""Worker processes are started (unless asked for) only from this many facts (one costs ~50 ms to start)."""
CHUNK_FACTS = 5_000
"""Facts per range of entity ids (progress is reported as each range is done)."""
MAX_PROCESSES = 7

SCREENED_FIELDS = (*STORED_FIELDS, "seq")
"""The fact columns verify reads: the stored fields and the seq (the keyed chain's rule needs it)."""

Judge = Callable[[Lifecycle, Screen, Iterable[Suspect]], list[Any]]


async def sweep(
    book: Book,
    lifecycles: Sequence[Lifecycle],
    judge: Judge,
    *,
    progress: Callable[[int, int], None] | None = None,
    processes: int | None = None,
    key: bytes | None = None,
    keyed_after: int | None = None,
) -> tuple[int, int, list[Any]]:
    """Screen every entity of ``lifecycles``: (entities, facts, what ``judge`` found). ``key`` and
    ``keyed_after``: the keyed chain's rule (``chain.Rule``) the screen hashes by."""
    reads = book.reads
    async with _snapshot(book) as conn:
        t = facts_table
        async with reads.lenient(conn):  # a few rows: ids that are not UTF-8 must not stop the sweep (L12b)
            counts: dict[str, int] = dict((await conn.execute(
                sa.select(t.c.entity_type, sa.func.count())
                .where(t.c.entity_type.in_([lc.entity_type for lc in lifecycles]))
                .group_by(t.c.entity_type)
            )).all())
            total = sum(counts.values())
            file = reads.file_screen(book.conn)  # None for a bound book: its writes only its connection sees
            workers = _workers(total, processes) if file is not None else 0
            chunks: list[_Chunk] = []
            for lc in lifecycles:
                screen = screen_of(lc, key, keyed_after)
                ranges = await _ranges(conn, lc, counts.get(lc.entity_type, 0)) if file else [(None, None)]
                chunks += [_Chunk(lc, screen, lo, hi) for lo, hi in ranges]
        run = _Run(reads, conn, chunks, judge, total, progress, file)
        await run.all(workers)
        return run.entities, run.facts, [f for i in range(len(chunks)) for f in run.found[i]]


@asynccontextmanager
async def _snapshot(book: Book) -> AsyncIterator[AsyncConnection]:
    """A connection in one read transaction (the bound one, if the book is bound)."""
    async with book.read() as conn:
        if conn.in_transaction():
            yield conn
            return
        async with book.reads.snapshot(conn):
            yield conn


def _workers(total: int, processes: int | None) -> int:
    """How many worker processes to start for a file of ``total`` facts."""
    if processes is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        processes = min(cores - 1, MAX_PROCESSES) if total >= PARALLEL_MIN_FACTS else 0
    return max(processes, 0) if sys.executable else 0


def screen_of(lc: Lifecycle, key: bytes | None = None, keyed_after: int | None = None) -> Screen:
    """The screen for ``lc``: its current policy, the policies it accepts, its table's defaults, the chain's rule."""
    columns = lc.table.columns  # names as plain str (SQLAlchemy's str subclass would not unpickle in a worker)
    earlier = {str(p.fingerprint): (_moves(p), tuple(p.initial)) for p in lc.accepted if p.fingerprint != lc.fingerprint}
    return Screen(
        str(lc.entity_type), SCREENED_FIELDS, len(SCALAR_FIELDS), [str(c.name) for c in columns],
        [str(c.name) for c in columns if isinstance(c.type, sa.JSON)], _moves(lc), lc.initial,
        defaults={str(k): v for k, v in row_defaults(lc.table).items()}, fingerprint=str(lc.fingerprint),
        earlier=earlier, strict=lc.accepts is not None, key=key, keyed_after=keyed_after,
    )


def _moves(lc: Lifecycle) -> dict[tuple[str, str], frozenset[str]]:
    """Each (previous, status) ``lc`` allows and the actor types that may take it (empty: any)."""
    moves = {(e.source, e.target): e.actors for e in lc.edges}
    for status in lc.statuses:
        same = lc.edge(status, status)  # an implicit same-status move, when the lifecycle allows one
        if same is not None:
            moves[(status, status)] = same.actors
    return moves


async def _ranges(conn: AsyncConnection, lc: Lifecycle, count: int) -> list[tuple[str | None, str | None]]:
    """Consecutive ranges of entity ids of about ``CHUNK_FACTS`` facts each (a short index walk each)."""
    t = facts_table
    bounds: list[str | None] = [None]
    while count > CHUNK_FACTS:
        query = sa.select(t.c.entity_id).where(t.c.entity_type == lc.entity_type)
        if bounds[-1] is not None:
            query = query.where(t.c.entity_id > bounds[-1])
        bound = (await conn.execute(query.order_by(t.c.entity_id).limit(1).offset(CHUNK_FACTS))).scalar()
        if bound is None:
            break
        bounds.append(bound)
    return list(zip(bounds, [*bounds[1:], None]))


@dataclass(frozen=True)
class _Chunk:
    """The entities of one lifecycle with ids in [lo, hi) (None: unbounded)."""

    lc: Lifecycle
    screen: Screen
    lo: str | None
    hi: str | None

    def queries(self, reads: Reads) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """(facts, rows) in id order: code point order (``Reads.in_id_order``), as Merge compares ids."""
        t, table = facts_table, self.lc.table
        facts = sa.select(*(stored_column(t.c[k]) for k in SCREENED_FIELDS)).where(t.c.entity_type == self.lc.entity_type)
        rows = sa.select(*(stored_column(c) for c in table.columns))
        if self.lo is not None:
            facts, rows = facts.where(t.c.entity_id >= self.lo), rows.where(table.c.id >= self.lo)
        if self.hi is not None:
            facts, rows = facts.where(t.c.entity_id < self.hi), rows.where(table.c.id < self.hi)
        return facts.order_by(reads.in_id_order(t.c.entity_id), t.c.version), rows.order_by(reads.in_id_order(table.c.id))


class _Run:
    """The chunks of one sweep, screened here (from the end of the list) and by workers (from the front)."""

    def __init__(self, reads: Reads, conn: AsyncConnection, chunks: list[_Chunk], judge: Judge, total: int,
                 progress: Callable[[int, int], None] | None, file: FileScreen | None) -> None:
        self.reads = reads
        self.conn = conn
        self.file = file
        self.own = file
        """The file as this process reads it (None once it could not: then on the snapshot's connection)."""
        self.chunks = chunks
        self.judge = judge
        self.total = total
        self.progress = progress
        self.entities = self.facts = 0
        self.found: dict[int, list[Any]] = {}
        self.next_tick = TICK

    async def all(self, workers: int) -> None:
        todo = deque(range(len(self.chunks)))
        async with AsyncExitStack() as stack:
            helpers = []
            for _ in range(min(workers, len(todo) // 2) if self.file is not None else 0):
                try:
                    assert self.file is not None  # the range is empty without one
                    worker = await stack.enter_async_context(Worker.started(*self.file.worker))
                except (OSError, NotImplementedError, RuntimeError) as exc:  # e.g. a loop without subprocesses
                    log.warning("verify: cannot start a worker process (%s); screening in this process", exc)
                    break
                # Its first two chunks now, so it starts on them as soon as it is up.
                helpers.append(asyncio.create_task(self.elsewhere(todo, worker, self.give(todo, worker))))
            try:
                await self.here(todo)
                await asyncio.gather(*helpers)
                await self.here(todo)  # ranges a failed worker gave back
            finally:
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
        if self.progress is not None:
            self.progress(self.facts, self.total)

    def give(self, todo: deque[int], worker: Worker, sent: deque[int] | None = None) -> deque[int]:
        """Send chunks from the front of ``todo`` until the worker holds two; the chunks it holds."""
        sent = deque() if sent is None else sent
        assert self.file is not None  # only a worker is given chunks, and workers need the file screen
        while todo and len(sent) < 2:
            i = todo.popleft()
            sent.append(i)
            chunk = self.chunks[i]
            worker.send(self.file.job(chunk.screen.spec, *chunk.queries(self.reads)))
        return sent

    def count(self, entities: int, facts: int) -> None:
        self.entities += entities
        self.facts += facts
        if self.facts >= self.next_tick:
            self.next_tick = (self.facts // TICK + 1) * TICK
            if self.progress is not None:
                self.progress(self.facts, self.total)

    def judged(self, chunk: _Chunk, suspects: list[Suspect]) -> list[Any]:
        return self.judge(chunk.lc, chunk.screen, suspects) if suspects else []

    async def here(self, todo: deque[int]) -> None:
        """Screen chunks from the end of ``todo`` in this process."""
        while todo:
            i = todo.pop()
            chunk = self.chunks[i]
            if self.own is not None:
                # A file this process may read on its own connection: a thread reads and screens it
                # (no driver hand-offs per batch, and the event loop stays free meanwhile).
                job = self.own.job(chunk.screen.spec, *chunk.queries(self.reads))
                try:
                    entities, facts, suspects = await asyncio.to_thread(self.own.screen, job)
                except StorageError as exc:  # e.g. a read-only open refused: read on the book's connection
                    log.warning("verify: cannot read %s on its own (%s); reading on the book's connection",
                                self.own.path, exc)
                    self.own = None
                else:
                    self.count(entities, facts)
                    self.found[i] = self.judged(chunk, suspects)
                    continue
            counted = (self.entities, self.facts)
            try:
                self.found[i] = await self.on_snapshot(chunk)
            except Exception as exc:
                if not self.reads.undecodable(exc):
                    raise
                self.entities, self.facts = counted  # read it again, counting it once
                async with self.reads.lenient(self.conn):
                    self.found[i] = await self.on_snapshot(chunk, lenient=True)

    async def on_snapshot(self, chunk: _Chunk, *, lenient: bool = False) -> list[Any]:
        """Screen one chunk on the snapshot's connection (no file of its own, or a bound transaction); ``lenient``:
        its text is read leniently, so ids are ordered by their stored bytes (:func:`.screen.byte_key`)."""
        facts_query, rows_query = chunk.queries(self.reads)
        merge = Merge(chunk.screen, byte_key if lenient else None)
        found: list[Any] = []
        entity_at = chunk.screen.entity_at
        seen = (0, 0)
        async with aclosing(self.reads.batches(self.conn, rows_query, BATCH)) as rows:
            async with aclosing(self.reads.batches(self.conn, facts_query, BATCH)) as facts:
                async for batch in facts:
                    while merge.wants_rows(batch[-1][entity_at]):
                        merge.add_rows(await _next(rows))
                    merge.add_facts(batch)
                    found += self.judged(chunk, merge.suspects)
                    merge.suspects.clear()
                    self.count(merge.entities - seen[0], merge.facts - seen[1])
                    seen = (merge.entities, merge.facts)
            merge.end_facts()
            async for batch in rows:
                merge.add_rows(batch)
        self.count(merge.entities - seen[0], merge.facts - seen[1])
        return found + self.judged(chunk, merge.suspects)

    async def elsewhere(self, todo: deque[int], worker: Worker, sent: deque[int]) -> None:
        """Collect a worker's results, handing it the next chunk for each; if it fails, the
        chunks it holds go back to ``todo`` for this process."""
        try:
            while sent:
                entities, facts, suspects = await worker.reply()
                i = sent.popleft()
                self.count(entities, facts)
                self.found[i] = self.judged(self.chunks[i], suspects)
                self.give(todo, worker, sent)
        except (OSError, EOFError, WorkerError, asyncio.IncompleteReadError, pickle.UnpicklingError) as exc:
            log.warning("verify: a worker process failed (%s); this process screens its ranges", exc)
            worker.kill()  # it may still be working on, or writing, the chunks it held
            todo.extendleft(reversed(sent))


async def _next(batches: AsyncIterator[Sequence[Sequence[Any]]]) -> Sequence[Sequence[Any]]:
    # Not anext(batches, ()): with a default it can raise SystemError on Python 3.11.
    try:
        return await batches.__anext__()
    except StopAsyncIteration:
        return ()
