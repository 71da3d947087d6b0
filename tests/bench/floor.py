"""The raw-SQL floor: the SQL work statebook's design must do, issued directly with the same drivers.

Enqueue: row insert + creation fact in one transaction (one row per transaction, or a batch of rows
with multi-row inserts). Drain: the transaction boundaries statebook's delivery uses — one
transaction claims a batch of due rows (row updates compare-and-set on version and status, plus
their facts), the transport runs outside any transaction, one transaction finalizes the batch (row
updates + facts). The statements are set-based (one UPDATE and one multi-row fact INSERT per
transaction, ``FOR UPDATE SKIP LOCKED`` on PostgreSQL), which is the design the issue asks for, so
the floor is the physical limit of that design.

Drivers: asyncpg on PostgreSQL, aiosqlite on SQLite (what statebook runs on), no framework. Fact
hashes are computed with the engine's ``insert_values``: hashing is inherent to the design.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite
import asyncpg

from common import METER
from rows import (DISPATCH_COLUMNS, FACT_COLUMNS, HAS_CLAIM_ID, Head, claim_patch, dispatch_params, fact_params,
                  insert_dispatch_sql, insert_fact_sql, new_dispatch, step)

SCAN = ("SELECT id, status, version, attempt, last_fact_id, chain_hash FROM dispatch_outbox "
        "WHERE status IN ('pending', 'delivering') AND next_attempt_at <= {now} "
        "ORDER BY next_attempt_at, id LIMIT {limit}")
_PROJ = ("status", "version", "updated_at", "status_reason_code", "status_reason_summary", "last_fact_id",
         "chain_hash")
CLAIM_SET = (*_PROJ, "attempt", "next_attempt_at", *(("claim_id",) if HAS_CLAIM_ID else ()))
FINAL_SET = (*_PROJ, "last_error")
Deliver = Callable[[], Awaitable[None]]


def _update_sql(columns: tuple[str, ...], style: str) -> str:
    """UPDATE ... SET columns WHERE id, version, status (compare-and-set) and attempt."""
    n = len(columns)
    if style == "pg":
        sets = ", ".join(f"{c} = ${i}" for i, c in enumerate(columns, 1))
        return (f"UPDATE dispatch_outbox SET {sets} WHERE id = ${n + 1} AND version = ${n + 2} "
                f"AND status = ${n + 3} AND attempt = ${n + 4}")
    sets = ", ".join(f"{c} = ?" for c in columns)
    return f"UPDATE dispatch_outbox SET {sets} WHERE id = ? AND version = ? AND status = ? AND attempt = ?"


_PG_TYPES = {"version": "int", "attempt": "int", "max_attempts": "int", "ack_required": "int",
             "at": "float8", "updated_at": "float8", "next_attempt_at": "float8", "created_at": "float8",
             "expires_at": "float8", "payload": "json", "evidence_refs": "json", "patch": "json",
             "metadata": "json"}


def _unnest_insert(table: str, columns: tuple[str, ...]) -> str:
    """A multi-row INSERT taking one array per column (PostgreSQL)."""
    arrays = ", ".join(
        f"${i}::{'text' if _PG_TYPES.get(c) == 'json' else _PG_TYPES.get(c, 'text')}[]"
        for i, c in enumerate(columns, 1)
    )
    cols = ", ".join(f"u.{c}::json" if _PG_TYPES.get(c) == "json" else f"u.{c}" for c in columns)
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT {cols} FROM unnest({arrays}) AS u({', '.join(columns)})"


def _unnest_update(columns: tuple[str, ...]) -> str:
    """A set-based compare-and-set: one UPDATE over arrays of (id, version, new values) (PostgreSQL)."""
    keys = ("id", "old_version", "old_status")
    types = {"old_version": "int", "old_status": "text"}
    allc = (*keys, *columns)
    arrays = ", ".join(f"${i}::{types.get(c, _PG_TYPES.get(c, 'text'))}[]" for i, c in enumerate(allc, 1))
    sets = ", ".join(f"{c} = u.{c}" for c in columns)
    return (f"UPDATE dispatch_outbox d SET {sets} FROM unnest({arrays}) AS u({', '.join(allc)}) "
            "WHERE d.id = u.id AND d.version = u.old_version AND d.status = u.old_status RETURNING d.id")


def _columns(params: list[tuple[Any, ...]], n: int) -> list[list[Any]]:
    return [[p[i] for p in params] for i in range(n)]


# -- PostgreSQL --------------------------------------------------------------------------------

class PgFloor:
    """The floor on PostgreSQL over asyncpg (a pool of ``concurrency`` connections)."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.concurrency = concurrency
        self.pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        self.pool = await asyncpg.create_pool(self.url, min_size=self.concurrency, max_size=self.concurrency)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def reset(self) -> None:
        assert self.pool is not None
        await self.pool.execute("TRUNCATE dispatch_outbox, status_transitions RESTART IDENTITY")

    async def enqueue_single(self, n: int, *, one_statement: bool = False) -> float:
        """Seconds for ``n`` enqueues, one transaction each.

        ``one_statement``: row and fact in ONE statement (a data-modifying CTE), which PostgreSQL
        runs atomically without BEGIN/COMMIT round trips — one round trip per enqueue instead of four.
        """
        assert self.pool is not None
        ins_row, ins_fact = insert_dispatch_sql("pg"), insert_fact_sql("pg")
        k = len(DISPATCH_COLUMNS)
        both = (f"WITH r AS ({ins_row}) INSERT INTO status_transitions ({', '.join(FACT_COLUMNS)}) VALUES ("
                + ", ".join(f"${k + i}" for i in range(1, len(FACT_COLUMNS) + 1)) + ")")
        async with self.pool.acquire() as conn:
            METER.start()
            for i in range(n):
                row, fact = new_dispatch(time.time(), i)
                if one_statement:
                    await conn.execute(both, *dispatch_params(row), *fact_params(fact))
                    continue
                async with conn.transaction():
                    await conn.execute(ins_row, *dispatch_params(row))
                    await conn.execute(ins_fact, *fact_params(fact))
            return METER.stop()

    async def enqueue_batches(self, total: int, batch: int) -> float:
        """Seconds for ``total`` enqueues, ``batch`` rows + facts per transaction (multi-row inserts)."""
        assert self.pool is not None
        ins_rows = _unnest_insert("dispatch_outbox", DISPATCH_COLUMNS)
        ins_facts = _unnest_insert("status_transitions", FACT_COLUMNS)
        async with self.pool.acquire() as conn:
            METER.start()
            for base in range(0, total, batch):
                now = time.time()
                made = [new_dispatch(now, base + i) for i in range(min(batch, total - base))]
                async with conn.transaction():
                    await conn.execute(ins_rows, *_columns([dispatch_params(r) for r, _ in made],
                                                           len(DISPATCH_COLUMNS)))
                    await conn.execute(ins_facts, *_columns([fact_params(f) for _, f in made], len(FACT_COLUMNS)))
            return METER.stop()

    async def seed_pending(self, n: int) -> None:
        await self.enqueue_batches(n, 1000)

    async def drain(self, deliver: Deliver, batch: int) -> None:
        """Claim, deliver and finalize until nothing is due."""
        while await self._drain_batch(deliver, batch):
            pass

    async def _drain_batch(self, deliver: Deliver, batch: int) -> int:
        assert self.pool is not None
        upd_claim, upd_final = _unnest_update(CLAIM_SET), _unnest_update(FINAL_SET)
        ins_facts = _unnest_insert("status_transitions", FACT_COLUMNS)
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                found = await conn.fetch(SCAN.format(now="$1", limit="$2") + " FOR UPDATE SKIP LOCKED",
                                         time.time(), batch)
                if not found:
                    return 0
                now = time.time()
                heads = [Head(r["id"], r["status"], r["version"], r["attempt"], r["last_fact_id"], r["chain_hash"])
                         for r in found]
                steps = [step(h, "delivering", "dispatch.delivering.attempt", "delivery", now,
                              claim_patch(h, now)) for h in heads]
                claimed = await self._set_update(conn, upd_claim, ins_facts, heads, steps, CLAIM_SET)
            gate = asyncio.Semaphore(self.concurrency)

            async def one() -> None:
                async with gate:
                    await deliver()

            await asyncio.gather(*(one() for _ in claimed))
            now = time.time()
            heads = [Head(h.id, "delivering", h.version + 1, h.attempt + 1, f["id"], f["hash"])
                     for h, (f, _) in zip(heads, steps) if h.id in claimed]
            steps = [step(h, "delivered", "dispatch.delivered.transport_ok", "delivery", now, {"last_error": None})
                     for h in heads]
            async with conn.transaction():
                await self._set_update(conn, upd_final, ins_facts, heads, steps, FINAL_SET)
        return len(found)

    @staticmethod
    async def _set_update(conn: Any, upd: str, ins: str, heads: list[Head],
                          steps: list[tuple[dict[str, Any], dict[str, Any]]], columns: tuple[str, ...]) -> set[str]:
        arrays = [[h.id for h in heads], [h.version for h in heads], [h.status for h in heads]]
        arrays += [[cols[c] for _, cols in steps] for c in columns]
        won = {r["id"] for r in await conn.fetch(upd, *arrays)}
        facts = [fact_params(f) for h, (f, _) in zip(heads, steps) if h.id in won]
        if facts:
            await conn.execute(ins, *_columns(facts, len(FACT_COLUMNS)))
        return won


# -- SQLite ------------------------------------------------------------------------------------

SQLITE_SYNCHRONOUS = "NORMAL"
"""The floor's ``PRAGMA synchronous``: statebook's NORMAL, or FULL in a ``run.py --durable`` run (which sets it)."""


async def sqlite_connect(path: str) -> aiosqlite.Connection:
    """The connection settings statebook uses: WAL, busy timeout, FK on, synchronous NORMAL (see above)."""
    conn = await aiosqlite.connect(path, isolation_level=None, timeout=5.0)
    for pragma in ("PRAGMA journal_mode=WAL", "PRAGMA busy_timeout=5000", "PRAGMA foreign_keys=ON",
                   f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}"):
        await conn.execute(pragma)
    return conn


class SqliteFloor:
    """The floor on SQLite over aiosqlite: one connection (SQLite has one writer), BEGIN IMMEDIATE."""

    def __init__(self, path: str, concurrency: int) -> None:
        self.path = path
        self.concurrency = concurrency
        self.conn: aiosqlite.Connection | None = None
        self.lock = asyncio.Lock()

    async def open(self) -> None:
        self.conn = await sqlite_connect(self.path)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def _tx(self, statements: list[tuple[str, tuple[Any, ...] | list[tuple[Any, ...]], bool]]) -> list[int]:
        """Run (sql, params, many) in one BEGIN IMMEDIATE transaction; rowcounts."""
        assert self.conn is not None
        counts = []
        async with self.lock:
            await self.conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, params, many in statements:
                    cur = await (self.conn.executemany(sql, params) if many else self.conn.execute(sql, params))
                    counts.append(cur.rowcount)
                    await cur.close()
            except BaseException:
                await self.conn.execute("ROLLBACK")
                raise
            await self.conn.execute("COMMIT")
        return counts

    async def enqueue_single(self, n: int) -> float:
        ins_row, ins_fact = insert_dispatch_sql("sqlite"), insert_fact_sql("sqlite")
        METER.start()
        for i in range(n):
            row, fact = new_dispatch(time.time(), i)
            await self._tx([(ins_row, dispatch_params(row), False), (ins_fact, fact_params(fact), False)])
        return METER.stop()

    async def enqueue_batches(self, total: int, batch: int) -> float:
        ins_row, ins_fact = insert_dispatch_sql("sqlite"), insert_fact_sql("sqlite")
        METER.start()
        for base in range(0, total, batch):
            now = time.time()
            made = [new_dispatch(now, base + i) for i in range(min(batch, total - base))]
            await self._tx([(ins_row, [dispatch_params(r) for r, _ in made], True),
                            (ins_fact, [fact_params(f) for _, f in made], True)])
        return METER.stop()

    async def seed_pending(self, n: int) -> None:
        await self.enqueue_batches(n, 1000)

    async def drain(self, deliver: Deliver, batch: int) -> None:
        """Claim a batch (one transaction), deliver it, finalize it (one transaction); until nothing is due."""
        assert self.conn is not None
        scan = SCAN.format(now="?", limit="?")
        claim_sql, final_sql, ins_fact = (_update_sql(CLAIM_SET, "sqlite"), _update_sql(FINAL_SET, "sqlite"),
                                          insert_fact_sql("sqlite"))
        gate = asyncio.Semaphore(self.concurrency)

        def claim_step(h: Head, now: float) -> tuple[dict[str, Any], tuple[Any, ...]]:
            fact, cols = step(h, "delivering", "dispatch.delivering.attempt", "delivery", now, claim_patch(h, now))
            return fact, (*(cols[c] for c in CLAIM_SET), h.id, h.version, h.status, h.attempt)

        def final_step(h: Head, claim_fact: dict[str, Any], now: float) -> tuple[dict[str, Any], tuple[Any, ...]]:
            c = Head(h.id, "delivering", h.version + 1, h.attempt + 1, claim_fact["id"], claim_fact["hash"])
            fact, cols = step(c, "delivered", "dispatch.delivered.transport_ok", "delivery", now, {"last_error": None})
            return fact, (*(cols[k] for k in FINAL_SET), c.id, c.version, c.status, c.attempt)

        async def send() -> None:
            async with gate:
                await deliver()

        while True:
            found, claims = await self._claim_batch(scan, batch, claim_sql, ins_fact, claim_step)
            if not found:
                return
            await asyncio.gather(*(send() for _ in found))
            now = time.time()
            finals = [final_step(h, f, now) for h, (f, _) in zip(found, claims)]
            await self._tx([(final_sql, [p for _, p in finals], True),
                            (ins_fact, [fact_params(f) for f, _ in finals], True)])

    async def _claim_batch(self, scan: str, batch: int, claim_sql: str, ins_fact: str,
                           claim_step: Callable[[Head, float], tuple[dict[str, Any], tuple[Any, ...]]],
                           ) -> tuple[list[Head], list[tuple[dict[str, Any], tuple[Any, ...]]]]:
        """Scan and claim a batch in one write transaction (SQLite's single writer makes it exclusive)."""
        assert self.conn is not None
        async with self.lock:
            await self.conn.execute("BEGIN IMMEDIATE")
            try:
                cur = await self.conn.execute(scan, (time.time(), batch))
                found = [Head(*r[:6]) for r in await cur.fetchall()]
                await cur.close()
                now = time.time()
                claims = [claim_step(h, now) for h in found]
                if found:
                    cur = await self.conn.executemany(claim_sql, [p for _, p in claims])
                    assert cur.rowcount == len(found), "a claim lost its compare-and-set inside BEGIN IMMEDIATE"
                    await cur.close()
                    await self.conn.executemany(ins_fact, [fact_params(f) for f, _ in claims])
            except BaseException:
                await self.conn.execute("ROLLBACK")
                raise
            await self.conn.execute("COMMIT")
        return found, claims
