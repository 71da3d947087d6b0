"""Which index serves each query on ``status_transitions``: EXPLAIN on both backends, as a Markdown table.

Every index the facts table keeps must name the query that needs it (specs/performance.md, "Fact
indexes"). This script fills a database with a few thousand dispatches and their facts through the
engine, refreshes the planner's statistics and prints the plan of each query statebook issues on the
table — so a reader sees the index each one uses, and a dropped index shows up as a scan.

    .venv/bin/python tests/bench/fact_indexes.py [--pg-url URL] [--entities 3000]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statebook.adapters.db import open_book, reset_schema  # noqa: E402
from statebook.lifecycle import FakeClock  # noqa: E402
from statebook.outbox import CallableTransport, deliver_due_dispatches, enqueue_dispatches  # noqa: E402

from common import run_with_postgres  # noqa: E402  (tests/bench, the script's directory)

QUERIES: list[tuple[str, str, str]] = [
    ("history, replay, as_of (one entity's facts in order)",
     "SELECT * FROM status_transitions WHERE entity_type = 'dispatch' AND entity_id = :one ORDER BY version",
     "same"),
    ("create: ids with a history (purged ids are never reused)",
     "SELECT DISTINCT entity_id FROM status_transitions WHERE entity_type = 'dispatch' AND entity_id IN (:one, :two)",
     "SELECT DISTINCT entity_id FROM status_transitions WHERE entity_type = 'dispatch' "
     "AND entity_id = ANY(ARRAY[:one, :two])"),
    ("idempotent replay: the fact a key produced",
     "SELECT id FROM status_transitions WHERE entity_type = 'dispatch' AND entity_id = :one "
     "AND idempotency_key = 'k'", "same"),
    ("verify: facts per type",
     "SELECT entity_type, count(*) FROM status_transitions WHERE entity_type IN ('dispatch') GROUP BY entity_type",
     "same"),
    ("verify: id ranges of 5,000 facts",
     "SELECT entity_id FROM status_transitions WHERE entity_type = 'dispatch' AND entity_id > :one "
     "ORDER BY entity_id LIMIT 1 OFFSET 500", "same"),
    ("verify: one range's facts in entity and version order",
     "SELECT * FROM status_transitions WHERE entity_type = 'dispatch' AND entity_id >= :one AND entity_id < :two "
     "ORDER BY entity_id, version",
     "SELECT * FROM status_transitions WHERE entity_type = 'dispatch' AND entity_id >= :one AND entity_id < :two "
     "ORDER BY entity_id COLLATE \"C\", version"),
    ("tail: facts after a cursor",
     "SELECT * FROM status_transitions WHERE seq > 10 ORDER BY seq LIMIT 1000",
     "SELECT * FROM status_transitions WHERE (tx_id, seq) > (0, 10) "
     "AND tx_id < pg_snapshot_xmin(pg_current_snapshot())::text::bigint ORDER BY tx_id, seq LIMIT 1000"),
]


async def _fill(url: str, entities: int) -> tuple[Any, str, str]:
    clock = FakeClock(1_700_000_000.0)
    book = await open_book(url, clock=clock)
    await reset_schema(book.engine)
    for start in range(0, entities, 500):
        await enqueue_dispatches(book, [{"kind": "k", "deliver_to": f"seat-{i}"}
                                        for i in range(start, min(entities, start + 500))])
    await deliver_due_dispatches(book, transport=CallableTransport(_delivered), batch_size=entities)
    async with book.engine.begin() as conn:
        await conn.exec_driver_sql("ANALYZE")
        ids = (await conn.execute(sa.text("SELECT DISTINCT entity_id FROM status_transitions ORDER BY entity_id LIMIT 2"))
               ).scalars().all()
    return book, ids[0], ids[1]


async def _delivered(_to: str, _payload: str) -> bool:
    return True


async def plans(url: str, entities: int) -> list[tuple[str, str]]:
    book, one, two = await _fill(url, entities)
    postgres = book.engine.dialect.name == "postgresql"
    out = []
    try:
        async with book.engine.connect() as conn:
            for name, sqlite_sql, pg_sql in QUERIES:
                sql = sqlite_sql if not postgres or pg_sql == "same" else pg_sql
                explain = "EXPLAIN (COSTS OFF) " if postgres else "EXPLAIN QUERY PLAN "
                rows = (await conn.execute(sa.text(explain + sql), {"one": one, "two": two})).all()
                lines = [r[0] if postgres else r[-1] for r in rows]
                plan = "; ".join(" ".join(line.split()) for line in lines)
                out.append((name, re.sub(r"'[0-9a-f]{32}'", ":id", plan)))
    finally:
        await book.engine.dispose()
    return out


def table(results: dict[str, list[tuple[str, str]]]) -> str:
    backends = list(results)
    lines = ["| query | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    for i, (name, _sql, _pg) in enumerate(QUERIES):
        lines.append(f"| {name} | " + " | ".join(f"`{results[b][i][1]}`" for b in backends) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    parser.add_argument("--entities", type=int, default=3000)
    args = parser.parse_args()

    async def both(pg_url: str) -> dict[str, list[tuple[str, str]]]:
        with tempfile.TemporaryDirectory() as tmp:
            return {"SQLite": await plans(f"sqlite:///{tmp}/facts.db", args.entities),
                    "PostgreSQL": await plans(pg_url, args.entities)}

    print(table(run_with_postgres(args.pg_url, both)))

if __name__ == "__main__":
    main()
