"""What a fact costs next to a plain insert of the same row: PostgreSQL and SQLite, 1 and 500 rows per statement.

Issue 11 asks for the fact insert's cost against a plain insert of the same row width without our
indexes. The rows are real facts (enqueued, claimed, delivered: three per dispatch, hashed by the
engine's ``insert_values``, tests/bench/rows.py), generated before the clock starts. Each variant
is a table with the facts' columns and types; ``plain`` has only the ``seq`` primary key, and each
other variant adds ONE thing of ``status_transitions`` to it, so the difference says what that thing
costs. The statements are the fact insert's shapes: one row (``VALUES``, autocommit, as a single
enqueue's unit) and 500 rows per statement (PostgreSQL: ``unnest`` of one array per column with the
JSON columns cast, as the engine sends; SQLite: ``executemany`` in one ``BEGIN IMMEDIATE``
transaction, as the engine does), on the engine's drivers (asyncpg, aiosqlite).

Printed per backend, batch size and variant: rows/s end to end (median of the rounds), its ratio
to ``plain``, client CPU per row, and on PostgreSQL the server's execution time per row (a second
pass of the same inserts under ``EXPLAIN (ANALYZE, TIMING OFF)``) and the WAL bytes per row.

    .venv/bin/python tests/bench/fact_cost.py [--pg-url URL] [--rounds 5] [--single 2000] [--batched 30000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statebook.adapters.db import open_book  # noqa: E402

from common import drop_databases, median, recreate_databases, run_with_postgres  # noqa: E402
from floor import _PG_TYPES, sqlite_connect  # noqa: E402
from rows import FACT_COLUMNS, delivered_history  # noqa: E402

FACTS = "status_transitions"
JSON = {"evidence_refs", "patch", "metadata"}
_PG_COLUMN_TYPES = {"seq": "bigserial", "version": "integer", "at": "double precision", "tx_id": "bigint",
                    "id": "varchar(32)", "prev_fact_id": "varchar(32)", "command_digest": "varchar(64)",
                    "policy_fingerprint": "varchar(16)", "prev_hash": "varchar(64)", "hash": "varchar(64)"}
_NULLABLE = {"previous_status", "status", "idempotency_key", "command_digest", "tx_id"}
TX_DEFAULT = "ALTER TABLE {t} ALTER COLUMN tx_id SET DEFAULT (pg_current_xact_id()::text::bigint)"
VERSION = "CREATE UNIQUE INDEX {t}_version ON {t} (entity_type, entity_id, version)"
IDEMPOTENCY = ("CREATE UNIQUE INDEX {t}_idem ON {t} (entity_type, entity_id, idempotency_key) "
               "WHERE idempotency_key IS NOT NULL")

# (label, table, JSON columns typed json, DDL added to the plain table; None: the real facts table)
PG_VARIANTS: list[tuple[str, str, bool, list[str] | None]] = [
    ("plain: same columns and types, bigint pk only", "fc_plain", True, []),
    ("plain, JSON columns as text (no json parse)", "fc_text", False, []),
    ("plain + tx_id default (pg_current_xact_id)", "fc_txid", True, [TX_DEFAULT]),
    ("plain + uq_fact_version", "fc_version", True, [VERSION]),
    ("plain + uq_fact_idempotency (partial)", "fc_idem", True, [IDEMPOTENCY]),
    ("plain + tx_id default + ix_fact_tail", "fc_tail", True,
     [TX_DEFAULT, "CREATE INDEX {t}_tail ON {t} (tx_id, seq)"]),
    ("status_transitions as shipped", FACTS, True, None),
]
SQLITE_VARIANTS: list[tuple[str, str, bool, list[str] | None]] = [
    ("plain: same columns and types, integer pk only", "fc_plain", True, []),
    ("plain + uq_fact_version", "fc_version", True, [VERSION]),
    ("plain + uq_fact_idempotency (partial)", "fc_idem", True, [IDEMPOTENCY]),
    ("status_transitions as shipped", FACTS, True, None),
]


def make_facts(n: int) -> list[tuple[Any, ...]]:
    """``n`` facts as the engine writes them (JSON as canonical text), three per dispatch."""
    now = time.time()
    out: list[tuple[Any, ...]] = []
    for i in range((n + 2) // 3):
        out.extend(delivered_history(now + i * 0.003, i)[1])
    return out[:n]


def _pg_create(table: str, json_typed: bool) -> str:
    cols = []
    for c in ("seq", *FACT_COLUMNS, "tx_id"):
        typ = _PG_COLUMN_TYPES.get(c, "json" if c in JSON and json_typed else "text")
        cols.append(f"{c} {typ}" + (" PRIMARY KEY" if c == "seq" else "" if c in _NULLABLE else " NOT NULL"))
    return f"CREATE TABLE {table} ({', '.join(cols)})"


def _sqlite_create(table: str) -> str:
    types = {"seq": "INTEGER", "version": "INTEGER", "at": "FLOAT", "tx_id": "BIGINT"}
    cols = []
    for c in ("seq", *FACT_COLUMNS, "tx_id"):
        typ = types.get(c, "JSON" if c in JSON else "TEXT")
        cols.append(f"{c} {typ}" + (" NOT NULL PRIMARY KEY" if c == "seq" else "" if c in _NULLABLE else " NOT NULL"))
    return f"CREATE TABLE {table} ({', '.join(cols)})"


def pg_single(table: str) -> str:
    return (f"INSERT INTO {table} ({', '.join(FACT_COLUMNS)}) VALUES ("
            + ", ".join(f"${i}" for i in range(1, len(FACT_COLUMNS) + 1)) + ")")


def pg_batched(table: str, json_typed: bool) -> str:
    arrays = ", ".join(f"${i}::{'text' if c in JSON else _PG_TYPES.get(c, 'text')}[]"
                       for i, c in enumerate(FACT_COLUMNS, 1))
    cols = ", ".join(f"u.{c}::json" if c in JSON and json_typed else f"u.{c}" for c in FACT_COLUMNS)
    return (f"INSERT INTO {table} ({', '.join(FACT_COLUMNS)}) SELECT {cols} "
            f"FROM unnest({arrays}) AS u({', '.join(FACT_COLUMNS)})")


def _arrays(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [[r[i] for r in rows] for i in range(len(FACT_COLUMNS))]


class Result:
    def __init__(self) -> None:
        self.rate: list[float] = []
        self.cpu: list[float] = []
        self.server: list[float] = []
        self.wal: list[float] = []


async def pg_round(conn: asyncpg.Connection, table: str, json_typed: bool, facts: list[tuple[Any, ...]],
                   batch: int, res: Result) -> None:
    sql = pg_single(table) if batch == 1 else pg_batched(table, json_typed)
    chunks = [facts[i:i + batch] for i in range(0, len(facts), batch)]
    args = [list(c[0]) if batch == 1 else _arrays(c) for c in chunks]
    await conn.execute(f"TRUNCATE {table} RESTART IDENTITY")
    wal0 = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    c0, t0 = time.process_time(), time.perf_counter()
    for a in args:
        await conn.execute(sql, *a)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    wal1 = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    res.rate.append(len(facts) / elapsed)
    res.cpu.append(cpu / len(facts) * 1e6)
    res.wal.append(float(wal1 - wal0) / len(facts))
    # the server's side: the same inserts, each timed by the executor (index maintenance included)
    await conn.execute(f"TRUNCATE {table} RESTART IDENTITY")
    explain = "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql
    total = 0.0
    for a in args:
        plan = await conn.fetchval(explain, *a)
        total += json.loads(plan)[0]["Execution Time"]
    res.server.append(total / len(facts) * 1000)  # microseconds per row


async def sqlite_round(conn: Any, table: str, facts: list[tuple[Any, ...]], batch: int, res: Result) -> None:
    sql = f"INSERT INTO {table} ({', '.join(FACT_COLUMNS)}) VALUES ({', '.join('?' * len(FACT_COLUMNS))})"
    await conn.execute(f"DELETE FROM {table}")
    await conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(0, len(facts), batch):
        await conn.execute("BEGIN IMMEDIATE")
        if batch == 1:
            await conn.execute(sql, facts[i])
        else:
            await conn.executemany(sql, facts[i:i + batch])
        await conn.execute("COMMIT")
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    res.rate.append(len(facts) / elapsed)
    res.cpu.append(cpu / len(facts) * 1e6)


def _order(items: list[Any], r: int) -> list[Any]:
    return items if r % 2 == 0 else list(reversed(items))


async def measure_pg(base: str, sizes: dict[int, int], rounds: int, log: Any) -> dict[tuple[int, str], Result]:
    name = "bench_fact_cost"
    url = (await recreate_databases(base, [name]))[name]
    book = await open_book(url)  # the real facts table, as the engine creates it
    await book.engine.dispose()
    out: dict[tuple[int, str], Result] = {}
    conn = await asyncpg.connect(url)
    try:
        for _label, table, json_typed, ddl in PG_VARIANTS:
            if ddl is not None:
                await conn.execute(_pg_create(table, json_typed))
                for stmt in ddl:
                    await conn.execute(stmt.format(t=table))
        for batch, n in sizes.items():
            facts = make_facts(n)
            for r in range(rounds):
                for label, table, json_typed, _ddl in _order(PG_VARIANTS, r):
                    res = out.setdefault((batch, label), Result())
                    await pg_round(conn, table, json_typed, facts, batch, res)
                    log(f"    PG batch {batch} round {r + 1}/{rounds} {label}: {res.rate[-1]:,.0f} rows/s, "
                        f"server {res.server[-1]:.1f} us/row, WAL {res.wal[-1]:.0f} B/row")
    finally:
        await conn.close()
        await drop_databases(base, [name])
    return out


async def measure_sqlite(path: str, sizes: dict[int, int], rounds: int, log: Any) -> dict[tuple[int, str], Result]:
    book = await open_book(f"sqlite:///{path}")
    await book.engine.dispose()
    out: dict[tuple[int, str], Result] = {}
    conn = await sqlite_connect(path)
    try:
        for _label, table, _json, ddl in SQLITE_VARIANTS:
            if ddl is not None:
                await conn.execute(_sqlite_create(table))
                for stmt in ddl:
                    await conn.execute(stmt.format(t=table))
        for batch, n in sizes.items():
            facts = make_facts(n)
            for r in range(rounds):
                for label, table, _json, _ddl in _order(SQLITE_VARIANTS, r):
                    res = out.setdefault((batch, label), Result())
                    await sqlite_round(conn, table, facts, batch, res)
                    log(f"    SQLite batch {batch} round {r + 1}/{rounds} {label}: {res.rate[-1]:,.0f} rows/s")
    finally:
        await conn.close()
    return out


def table(backend: str, variants: list[Any], results: dict[tuple[int, str], Result], sizes: dict[int, int]) -> str:
    pg = backend == "PostgreSQL"
    head = "| backend | rows per statement | table | rows/s | vs plain | client CPU us/row |"
    head += " server us/row | vs plain | WAL bytes/row |" if pg else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for batch in sizes:
        plain = results[(batch, variants[0][0])]
        p_rate, p_server = median(plain.rate), median(plain.server) if pg else 0.0
        for label, *_ in variants:
            res = results[(batch, label)]
            rate = median(res.rate)
            row = f"| {backend} | {batch} | {label} | {rate:,.0f} | {p_rate / rate:.2f}x | {median(res.cpu):.1f} |"
            if pg:
                server = median(res.server)
                row += f" {server:.1f} | {server / p_server:.2f}x | {median(res.wal):,.0f} |"
            lines.append(row)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--single", type=int, default=2_000, help="rows inserted one per statement, per round")
    parser.add_argument("--batched", type=int, default=30_000, help="rows inserted 500 per statement, per round")
    parser.add_argument("--only", choices=("pg", "sqlite"))
    args = parser.parse_args()
    sizes = {1: args.single, 500: args.batched}

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    async def job(pg_url: str) -> str:
        out = []
        if args.only in (None, "sqlite"):
            with tempfile.TemporaryDirectory() as tmp:
                sq = await measure_sqlite(f"{tmp}/facts.db", sizes, args.rounds, log)
            out.append(table("SQLite", SQLITE_VARIANTS, sq, sizes))
        if args.only in (None, "pg"):
            pg = await measure_pg(pg_url, sizes, args.rounds, log)
            out.append(table("PostgreSQL", PG_VARIANTS, pg, sizes))
        return ("vs plain: time per row over plain's (1.25x = a quarter slower); rows/s median of "
                f"{args.rounds} rounds, variants interleaved\n\n" + "\n\n".join(out))

    if args.only == "sqlite":
        print(asyncio.run(job("")))
    else:
        print(run_with_postgres(args.pg_url, job))


if __name__ == "__main__":
    main()
