"""The dispatch row's indexes: which query each serves (EXPLAIN), what each costs a drain, and HOT.

Every index on ``dispatch_outbox`` must name the query that needs it (specs/performance.md,
"Dispatch indexes"). Two parts:

``plans``: a table of 100,000 delivered dispatches (seeded as the engine writes them, with their
facts) plus 1,000 pending ones enqueued through the engine, statistics refreshed; the plan of each
query statebook issues on the table, on SQLite and PostgreSQL.

``drain`` (PostgreSQL): one scratch database per variant of the index set (all indexes; each one
dropped; only the primary key and the dedup key, with and without ``fillfactor``). Each round
enqueues N dispatches and drains them (W2: claim + deliver + finalize, ``CONCURRENCY`` in flight,
``BATCH`` rows per claim), variants interleaved. Printed per variant: the drain's rate (median of
the rounds), the WAL bytes the drain wrote per row (deterministic: the index entries each update
adds show up there, whatever the machine's load), and the updates of the drain counted by
``pg_stat_user_tables`` with how many were HOT.

    .venv/bin/python tests/bench/dispatch_indexes.py [--pg-url URL] [--only plans|drain]
        [--history 100000] [--pending 1000] [--n 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statebook.adapters.db import open_book, reset_schema  # noqa: E402
from statebook.outbox import dispatch_outbox, enqueue_dispatches  # noqa: E402
from statebook.outbox.dispatch.attempts import SCAN, ACTIVE  # noqa: E402

import seed  # noqa: E402  (tests/bench, the script's directory)
import statebook_side as sb  # noqa: E402
from common import METER, drop_databases, median, recreate_databases, run_with_postgres  # noqa: E402

t = dispatch_outbox
TERMINAL = ("delivered", "acked", "dead_letter", "expired")
SUCCEEDED = ("delivered", "acked")


def _queries(now: float) -> list[tuple[str, str, Any]]:
    """(index it should use, query and where it is issued, statement) for each read of the table."""
    day = 86_400.0
    return [
        ("primary key", "get_dispatch, the finalize's compare-and-set and read_candidates (by id)",
         sa.select(t).where(t.c.id == ":id")),
        ("idx_dispatch_outbox_dedup", "enqueue with dedup_key: the rows holding the keys (enqueue._existing_ids)",
         sa.select(t.c.dedup_key, t.c.id).where(t.c.dedup_key.in_(["k1", "k2"]))),
        ("idx_dispatch_outbox_due", "the due scan (attempts.scan_heads, every claim), FOR UPDATE SKIP LOCKED on PG",
         SCAN.params(b_now=now, b_limit=100)),
        ("idx_dispatch_outbox_due", "next_due: the worker's sleep (min next_attempt_at of active rows)",
         sa.select(sa.func.min(t.c.next_attempt_at)).where(ACTIVE)),
        ("idx_dispatch_outbox_created", "list_dispatches(limit=50), newest first (admin, CLI `dispatch list`)",
         sa.select(t).order_by(t.c.created_at.desc(), t.c.id.desc()).limit(50)),
        ("idx_dispatch_outbox_created", "list_dispatches(status='pending', limit=50)",
         sa.select(t).where(t.c.status == "pending").order_by(t.c.created_at.desc(), t.c.id.desc()).limit(50)),
        ("idx_dispatch_outbox_created", "daemon summary: the latest dispatch",
         sa.select(t.c.id).order_by(t.c.created_at.desc(), t.c.id).limit(1)),
        ("idx_dispatch_outbox_settled", "retention / purge_dispatches: settled rows older than 7 days",
         sa.select(t.c.id, t.c.status).where(t.c.status.in_(SUCCEEDED), t.c.updated_at < now - 7 * day)
         .order_by(t.c.updated_at, t.c.id)),
        ("idx_dispatch_outbox_settled", "retention of failures: dead_letter/expired older than 30 days",
         sa.select(t.c.id, t.c.status).where(t.c.status.in_(("dead_letter", "expired")),
                                             t.c.updated_at < now - 30 * day).order_by(t.c.updated_at, t.c.id)),
        ("idx_dispatch_outbox_settled", "scheduler threshold metric dead_letters: count in the last 60 minutes",
         sa.select(sa.func.count()).where(t.c.status == "dead_letter", t.c.updated_at >= now - 3600)),
    ]


def _sql(stmt: Any, dialect: Any, *, lock: bool) -> str:
    sql = str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    sql = sql.replace("':id'", "'" + "0" * 32 + "'")
    return sql + (" FOR UPDATE SKIP LOCKED" if lock else "")


async def _fill(url: str, history: int, pending: int) -> Any:
    book = await open_book(url)
    await reset_schema(book.engine)
    await book.engine.dispose()
    if url.startswith("sqlite"):
        target: Any = seed.SqliteTarget(url.removeprefix("sqlite:///"))
    else:
        target = seed.PgTarget(url.replace("postgresql+asyncpg", "postgresql"))
    # history first, a day and more in the past (seed_history), so retention has rows to find
    await seed.seed_history(history, [target])
    book = await open_book(url)
    for start in range(0, pending, 500):
        await enqueue_dispatches(book, [{"kind": "k", "deliver_to": f"seat-{i}"}
                                        for i in range(start, min(pending, start + 500))])
    async with book.engine.begin() as conn:
        await conn.exec_driver_sql("ANALYZE")
    return book


async def plans(url: str, history: int, pending: int) -> list[str]:
    book = await _fill(url, history, pending)
    postgres = book.engine.dialect.name == "postgresql"
    out = []
    try:
        async with book.engine.connect() as conn:
            for i, (_index, _name, stmt) in enumerate(_queries(book.clock.now())):
                sql = _sql(stmt, book.engine.dialect, lock=postgres and i == 2)
                explain = "EXPLAIN (COSTS OFF) " if postgres else "EXPLAIN QUERY PLAN "
                rows = (await conn.exec_driver_sql(explain + sql)).all()
                lines = [r[0] if postgres else r[-1] for r in rows]
                plan = "; ".join(" ".join(line.split()) for line in lines)
                out.append(re.sub(r"'0{32}'(::\w+)?", ":id", plan))
    finally:
        await book.engine.dispose()
    return out


def plan_table(results: dict[str, list[str]], now: float = 0.0) -> str:
    backends = list(results)
    lines = ["| index | query | " + " | ".join(backends) + " |", "|---|---|" + "---|" * len(backends)]
    for i, (index, name, _stmt) in enumerate(_queries(now)):
        lines.append(f"| {index} | {name} | " + " | ".join(f"`{results[b][i]}`" for b in backends) + " |")
    return "\n".join(lines)


# -- the drain's cost per index (PostgreSQL) ------------------------------------------------------

VARIANTS: list[tuple[str, list[str], str]] = [
    ("all five (as shipped)", [], ""),
    ("without created", ["idx_dispatch_outbox_created"], ""),
    ("without settled", ["idx_dispatch_outbox_settled"], ""),
    ("without dedup", ["idx_dispatch_outbox_dedup"], ""),
    ("without due (the scan then reads the table)", ["idx_dispatch_outbox_due"], ""),
    ("pk + dedup only (no index names a changing column)",
     ["idx_dispatch_outbox_created", "idx_dispatch_outbox_settled", "idx_dispatch_outbox_due"], ""),
    ("pk + dedup only, fillfactor 50",
     ["idx_dispatch_outbox_created", "idx_dispatch_outbox_settled", "idx_dispatch_outbox_due"], "50"),
]


def _raw(url: str) -> str:
    return url.replace("postgresql+asyncpg", "postgresql")


async def _counters(url: str) -> tuple[int, int, int]:
    """(n_tup_upd, n_tup_hot_upd, WAL position in bytes) of dispatch_outbox, read from a fresh connection."""
    conn = await asyncpg.connect(_raw(url))
    try:
        row = await conn.fetchrow("SELECT n_tup_upd, n_tup_hot_upd, pg_current_wal_lsn() - '0/0'::pg_lsn AS wal "
                                  "FROM pg_stat_user_tables WHERE relname = 'dispatch_outbox'")
        return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"]), int(row["wal"])
    finally:
        await conn.close()


async def _flushed(url: str) -> tuple[int, int, int]:
    """The counters once every backend of the drain has exited (a backend flushes its statistics then)."""
    conn = await asyncpg.connect(_raw(url))
    try:
        name = url.rsplit("/", 1)[1]
        for _ in range(100):
            if not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> "
                                       "pg_backend_pid()", name):
                break
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    await asyncio.sleep(0.2)
    return await _counters(url)


async def _prepare(url: str, drop: list[str], fillfactor: str) -> None:
    book = await open_book(url)
    try:
        async with book.engine.begin() as conn:
            for name in drop:
                await conn.exec_driver_sql(f"DROP INDEX {name}")
            if fillfactor:
                await conn.exec_driver_sql(f"ALTER TABLE dispatch_outbox SET (fillfactor = {fillfactor})")
    finally:
        await book.engine.dispose()


async def _round(url: str, n: int) -> tuple[float, float, int, int, int]:
    """One drain of ``n`` freshly enqueued rows: (del/s, client CPU us/row, updates, HOT updates, WAL bytes)."""
    book = await sb.fresh_book(url)
    try:
        await sb.enqueue_batches(book, n, 500)
        async with book.engine.connect() as conn:
            await conn.exec_driver_sql("ANALYZE dispatch_outbox")
    finally:
        await book.engine.dispose()
    upd0, hot0, wal0 = await _flushed(url)
    book = await open_book(url)
    try:
        sink = sb.Sink()
        METER.cpu = 0.0
        start = METER.start()
        await sb.drain_due(book, sink, n)
        METER.stop()
        seconds = sink.last - start
    finally:
        await book.engine.dispose()
    upd1, hot1, wal1 = await _flushed(url)
    return n / seconds, METER.cpu / n * 1e6, upd1 - upd0, hot1 - hot0, wal1 - wal0


async def drain_costs(base: str, n: int, rounds: int, log: Any) -> str:
    names = [f"bench_idx_{i}" for i in range(len(VARIANTS))]
    urls = await recreate_databases(_raw(base), names)
    results: dict[str, list[tuple[float, float, int, int, int]]] = {name: [] for name in names}
    try:
        for name, (_label, drop, ff) in zip(names, VARIANTS):
            await _prepare(urls[name], drop, ff)
        for r in range(rounds):
            order = list(zip(names, VARIANTS))
            if r % 2:
                order.reverse()  # neither end of the list always runs warmer
            for name, (label, _drop, _ff) in order:
                res = await _round(urls[name], n)
                results[name].append(res)
                log(f"    round {r + 1}/{rounds} {label}: {res[0]:,.0f} del/s, {res[3]}/{res[2]} HOT, "
                    f"{res[4] / n:,.0f} WAL B/row")
    finally:
        await drop_databases(_raw(base), names)
    first = median([x[0] for x in results[names[0]]])
    lines = [f"| indexes | W2 drain {n:,} (del/s, median of {rounds}) | vs all five | client CPU us/row | "
             "WAL bytes/row | updates of the drain, HOT |", "|---|---|---|---|---|---|"]
    for name, (label, _drop, _ff) in zip(names, VARIANTS):
        rs = results[name]
        rate = median([x[0] for x in rs])
        upd, hot = rs[-1][2], rs[-1][3]
        lines.append(f"| {label} | {rate:,.0f} | {rate / first:.2f}x | {median([x[1] for x in rs]):,.0f} | "
                     f"{median([x[4] / n for x in rs]):,.0f} | {upd:,}, {hot:,} HOT ({100 * hot / max(upd, 1):.0f}%) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    parser.add_argument("--only", choices=("plans", "drain"))
    parser.add_argument("--history", type=int, default=100_000, help="delivered rows for the plans")
    parser.add_argument("--pending", type=int, default=1_000, help="pending rows for the plans")
    parser.add_argument("--n", type=int, default=3_000, help="rows per drain")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    async def job(pg_url: str) -> str:
        out = []
        if args.only in (None, "plans"):
            with tempfile.TemporaryDirectory() as tmp:
                started = time.perf_counter()
                results = {"SQLite": await plans(f"sqlite:///{tmp}/dispatch.db", args.history, args.pending),
                           "PostgreSQL": await plans(pg_url, args.history, args.pending)}
                log(f"plans: {time.perf_counter() - started:.0f}s")
            out.append(f"Plans: {args.history:,} delivered + {args.pending:,} pending dispatches, statistics "
                       "refreshed\n\n" + plan_table(results))
        if args.only in (None, "drain"):
            out.append(await drain_costs(pg_url, args.n, args.rounds, log))
        return "\n\n".join(out)

    print(run_with_postgres(args.pg_url, job))


if __name__ == "__main__":
    main()
