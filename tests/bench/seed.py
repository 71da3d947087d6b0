"""Bulk history: many delivered dispatches with their three facts each, written fast.

The rows and facts are valid (``verify`` accepts them: chains, hashes, edges, fold == row); they are
generated once per chunk and written to every target with the backend's bulk path (COPY on
PostgreSQL, ``executemany`` in one transaction on SQLite), then the tables are analysed, as a
long-running database would be.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import sqlite3
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

import asyncpg

from rows import DISPATCH_COLUMNS, FACT_COLUMNS, delivered_history, insert_dispatch_sql, insert_fact_sql

CHUNK = 5_000


class Target(Protocol):
    async def write(self, rows: list[tuple[Any, ...]], facts: list[tuple[Any, ...]]) -> None: ...
    async def finish(self) -> None: ...


class PgTarget:
    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: asyncpg.Connection | None = None

    async def write(self, rows: list[tuple[Any, ...]], facts: list[tuple[Any, ...]]) -> None:
        if self.conn is None:
            self.conn = await asyncpg.connect(self.url)
        async with self.conn.transaction():
            await self.conn.copy_records_to_table("dispatch_outbox", records=rows, columns=list(DISPATCH_COLUMNS))
            await self.conn.copy_records_to_table("status_transitions", records=facts, columns=list(FACT_COLUMNS))

    async def finish(self) -> None:
        if self.conn is not None:
            await self.conn.execute("VACUUM ANALYZE dispatch_outbox")
            await self.conn.execute("VACUUM ANALYZE status_transitions")
            await self.conn.close()
            self.conn = None


class SqliteTarget:
    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")

    async def write(self, rows: list[tuple[Any, ...]], facts: list[tuple[Any, ...]]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(insert_dispatch_sql("sqlite"), rows)
        self.conn.executemany(insert_fact_sql("sqlite"), facts)
        self.conn.execute("COMMIT")

    async def finish(self) -> None:
        self.conn.execute("ANALYZE")
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.close()


def _chunk(base: float, first: int, k: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    rows: list[tuple[Any, ...]] = []
    facts: list[tuple[Any, ...]] = []
    for i in range(first, first + k):
        row, three = delivered_history(base + i * 0.003, i)
        rows.append(row)
        facts.extend(three)
    return rows, facts


async def seed_history(n_rows: int, targets: Sequence[Target], *, start: float | None = None) -> float:
    """Write ``n_rows`` delivered dispatches (3 facts each) to every target; seconds taken.

    A child process builds the next chunk (hashing is the CPU cost) while this one writes.
    """
    t0 = time.perf_counter()
    base = (start if start is not None else time.time()) - n_rows * 0.003 - 86_400
    loop = asyncio.get_running_loop()
    firsts = list(range(0, n_rows, CHUNK))
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_child_init, initargs=(sys.path,)) as pool:
        pending = [loop.run_in_executor(pool, _chunk, base, f, min(CHUNK, n_rows - f)) for f in firsts[:2]]
        for i in range(len(firsts)):
            rows, facts = await pending[i]
            if i + 2 < len(firsts):
                f = firsts[i + 2]
                pending.append(loop.run_in_executor(pool, _chunk, base, f, min(CHUNK, n_rows - f)))
            for target in targets:
                await target.write(rows, facts)
    for target in targets:
        await target.finish()
    return time.perf_counter() - t0


def _child_init(path: list[str]) -> None:
    sys.path[:] = path


async def bulk_create(book: Any, entity_type: str, values: Sequence[dict[str, Any]], *, status: str, reason: str,
                      summary: str, actor: tuple[str, str]) -> None:
    """Create many entities in one transaction with two multi-row inserts (rows, creation facts).

    The same row and fact ``create`` would write (creation fact = the data columns, hash from
    ``insert_values``); used to seed fixtures fast, never for a measured path.
    """
    import sqlalchemy as sa

    from statebook.lifecycle.facts import facts_table
    from statebook.lifecycle.facts import GENESIS, insert_values

    lc = book.policy(entity_type)
    now = book.clock.now()
    rows, facts = [], []
    for item in values:
        data = {"id": uuid.uuid4().hex, **item}
        content = {
            "id": uuid.uuid4().hex, "entity_type": entity_type, "entity_id": data["id"], "prev_fact_id": GENESIS,
            "previous_status": None, "status": status, "version": 1, "reason_code": reason,
            "reason_summary": summary, "evidence_refs": [], "actor_type": actor[0], "actor_id": actor[1], "at": now,
            "patch": data, "metadata": {}, "idempotency_key": None, "command_digest": None,
            "policy_fingerprint": lc.fingerprint,
        }
        fact = insert_values(content, GENESIS)
        facts.append(fact)
        rows.append({**data, "status": status, "version": 1, "updated_at": now, "status_reason_code": reason,
                     "status_reason_summary": summary, "last_fact_id": fact["id"], "chain_hash": fact["hash"]})
    async with book.begin() as tx:
        await tx.conn.execute(sa.insert(lc.table), rows)
        await tx.conn.execute(sa.insert(facts_table), facts)
