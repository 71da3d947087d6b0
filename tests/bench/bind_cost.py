"""Client CPU of binding one 100-row, 10-column batch: ten arrays (``unnest``) against one JSON text of row
arrays (``json_array_elements``), each a prepared statement executed 2,000 times on a throwaway cluster.

usage: .venv/bin/python tests/bench/bind_cost.py   (specs/performance.md, "Client CPU per delivery")
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROWS, REPS = 100, 2000
TYPES = ["text", "bigint", "text", "text", "text", "bigint", "float8", "text", "text", "text"]


async def measure(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        rows = [[uuid.uuid4().hex, i, "delivering", uuid.uuid4().hex, uuid.uuid4().hex, i + 1, 1_764_900_000.123456 + i,
                 uuid.uuid4().hex, None, '{"attempt":1,"claim_id":"x"}'] for i in range(ROWS)]
        columns = [list(c) for c in zip(*rows)]
        names = ", ".join(f"c{i}" for i in range(len(TYPES)))
        arrays = await conn.prepare(
            f"SELECT count(*) FROM unnest({', '.join(f'${i + 1}::{t}[]' for i, t in enumerate(TYPES))}) AS v({names})")
        packed = await conn.prepare(
            "SELECT count(*) FROM json_array_elements($1::json) AS e(r) CROSS JOIN LATERAL (SELECT "
            + ", ".join(f"(e.r->>{i})::{t}" for i, t in enumerate(TYPES)) + ") AS x")
        encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode
        for label, run in (("arrays", lambda: arrays.fetchval(*columns)), ("json", lambda: packed.fetchval(encode(rows)))):
            for _ in range(50):
                assert await run() == ROWS
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(REPS):
                await run()
            print(f"{label:6s} client CPU {(time.process_time() - cpu) / REPS * 1e6:5.0f} us per batch, "
                  f"wall {(time.perf_counter() - wall) / REPS * 1e6:5.0f} us")
    finally:
        await conn.close()


def main() -> None:
    import pgcluster

    with pgcluster.throwaway_cluster() as url:
        asyncio.run(measure(url))


if __name__ == "__main__":
    main()
