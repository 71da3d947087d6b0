"""What the schema gate and the upgrade cost: open_book's revision check, and upgrading the previous schema.

    .venv/bin/python tests/bench/migrations.py [--rounds 20]

Prints the median wall time of ``open_book(create=False)`` on a database at head (the gate: one catalog query,
one query of the version table), of ``open_book`` creating an empty database (create_all + HEAD), and of
``statebook.adapters.migrations.upgrade`` on a copy of tests/fixtures/schema_v2.sqlite (stamp, 0002), SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "schema_v2.sqlite"


async def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def main(rounds: int) -> None:
    from statebook.adapters.db import connect, open_book
    from statebook.adapters.migrations import upgrade

    work = Path(tempfile.mkdtemp())
    head = f"sqlite:///{work / 'head.db'}"
    await (await open_book(head)).engine.dispose()

    async def open_only() -> None:
        book = await open_book(head, create=False)
        await book.engine.dispose()

    async def create_empty() -> None:
        path = work / f"new{time.perf_counter_ns()}.db"
        book = await open_book(f"sqlite:///{path}")
        await book.engine.dispose()

    async def upgrade_fixture() -> None:
        path = work / f"v2-{time.perf_counter_ns()}.db"
        shutil.copy(FIXTURE, path)
        engine = connect(f"sqlite:///{path}")
        async with engine.connect() as conn:
            await conn.run_sync(upgrade)
        await engine.dispose()

    await upgrade_fixture()  # imports alembic once, outside the timing
    for label, fn in (("open_book(create=False) at head", open_only), ("open_book on an empty file", create_empty),
                      ("upgrade of schema_v2.sqlite", upgrade_fixture)):
        figures = [await timed(fn) for _ in range(rounds)]
        print(f"{label}: {statistics.median(figures) * 1000:.1f} ms (median of {rounds})")
    shutil.rmtree(work)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    asyncio.run(main(parser.parse_args().rounds))
