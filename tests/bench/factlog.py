"""What the fact log as a Merkle tree costs (specs/audit.md A6): a tree head of a million facts, the frontier's
appends, proofs and their verification.

Synthetic facts (``--facts``, one per entity, each hash 64 random hex digits) are inserted with one raw SQL
statement into a throwaway SQLite file and, with ``--pg``, a PostgreSQL database (``--pg-url``, or a throwaway
cluster). The tree reads only ``(seq, hash)``, so the rest of a fact does not matter here. Printed per backend:
the read of every ``(seq, hash)`` alone, the whole tree head (read and hashing), a checkpointer's resume after
1,000 new facts, and the time, size and verification time of an inclusion proof and of consistency proofs. Then,
without a database: hashing the leaves, and ``Frontier.append`` per batch of 1,000 leaves.

    .venv/bin/python tests/bench/factlog.py [--facts 1000000] [--pg] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conformance.lifecycle.support import prepare, task_registry  # noqa: E402

from statebook.adapters.db import connect  # noqa: E402
from statebook.lifecycle import Book, FakeClock  # noqa: E402
from statebook.lifecycle import tlog  # noqa: E402
from statebook.lifecycle.facts import facts_table  # noqa: E402
from statebook.lifecycle.factlog import (  # noqa: E402
    consistency_proof_for,
    inclusion_proof_for,
    leaf_of,
    tree_head,
)

from common import run_with_postgres  # noqa: E402  (tests/bench, the script's directory)

T = TypeVar("T")
GROWTH = 1000

# One statement per backend makes every synthetic fact; the columns the tree does not read get constants.
SERIES = {
    "sqlite": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count) ",
    "postgresql": "WITH n(i) AS (SELECT generate_series(1, :count)) ",
}
HASH = {"sqlite": "lower(hex(randomblob(32)))", "postgresql": "md5(random()::text) || md5(random()::text)"}
ID = {"sqlite": "lower(hex(randomblob(16)))", "postgresql": "md5(random()::text)"}
TEXT = {"sqlite": "'e' || i", "postgresql": "'e' || i::text"}


def insert_sql(dialect: str) -> str:
    return (SERIES[dialect]
            + "INSERT INTO status_transitions (id, entity_type, entity_id, prev_fact_id, previous_status, status, "
            "version, reason_code, reason_summary, evidence_refs, actor_type, actor_id, at, patch, metadata, "
            "policy_fingerprint, prev_hash, hash) "
            f"SELECT {ID[dialect]}, 'task', {TEXT[dialect]}, '', NULL, 'open', 1, 'task.open.created', '', '[]', "
            f"'system', 'bench', 0.0, '{{}}', '{{}}', '0000000000000000', '', {HASH[dialect]} FROM n")


def line(label: str, figures: str) -> None:
    print(f"  {label:<56s} {figures}")


async def timed(work: Callable[[], Awaitable[T]]) -> tuple[float, T]:
    start = time.perf_counter()
    result = await work()
    return time.perf_counter() - start, result


def per_call(fn: Callable[[], Any], calls: int = 2000) -> float:
    """Mean seconds per call of ``fn``."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


async def fill(book: Book, facts: int) -> float:
    start = time.perf_counter()
    async with book.engine.begin() as conn:
        await conn.execute(sa.text(insert_sql(book.engine.dialect.name)), {"count": facts - GROWTH})
    if book.engine.dialect.name == "postgresql":
        async with book.engine.connect() as conn:
            await (await conn.execution_options(isolation_level="AUTOCOMMIT")).execute(
                sa.text("VACUUM ANALYZE status_transitions"))
    return time.perf_counter() - start


async def read_only(book: Book) -> int:
    """Every (seq, hash) streamed as the tree head reads it, without hashing."""
    t = facts_table
    n = 0
    async with book.read() as conn, book.reads.snapshot(conn):
        async for batch in book.reads.batches(conn, sa.select(t.c.seq, t.c.hash).order_by(t.c.seq), 5000):
            n += len(batch)
    return n


async def one_backend(book: Book, facts: int) -> None:
    name = book.engine.dialect.name
    print(f"== {name}: {facts:,} facts")
    line(f"insert {facts - GROWTH:,} synthetic facts (not measured)", f"{await fill(book, facts):.1f} s")
    seconds, n = await timed(lambda: read_only(book))
    line(f"read (seq, hash) of {n:,} facts, no hashing", f"{seconds:.2f} s")
    seconds, before = await timed(lambda: tree_head(book))
    line(f"tree head of {before.size:,} facts (read + hash)", f"{seconds:.2f} s, {seconds / before.size * 1e6:.2f} us/fact")
    async with book.engine.begin() as conn:
        await conn.execute(sa.text(insert_sql(name).replace("'e' ||", "'g' ||")), {"count": GROWTH})
    seconds, after = await timed(lambda: tree_head(book, since=before))
    line(f"resume from the frontier at {before.size:,} ({GROWTH:,} new facts)", f"{seconds * 1000:.1f} ms")
    whole = await tree_head(book)
    assert (whole.size, whole.root()) == (after.size, after.root()), "the resumed tree is the whole tree"
    size, root = whole.size, whole.root()

    t = facts_table
    index = size // 2 + 1
    async with book.engine.connect() as conn:
        seq, fact_id, hash_ = (await conn.execute(sa.select(t.c.seq, t.c.id, t.c.hash).order_by(t.c.seq)
                                                  .offset(index).limit(1))).one()
    seconds, (got, proof) = await timed(lambda: inclusion_proof_for(book, fact_id, size))
    assert got == index
    leaf = leaf_of(seq, hash_)
    assert tlog.verify_inclusion(index, size, leaf, proof, root)
    verify = per_call(lambda: tlog.verify_inclusion(index, size, leaf, proof, root))
    line(f"inclusion proof of leaf {index:,} of {size:,}", f"{seconds:.2f} s to compute, {len(proof)} nodes = "
         f"{32 * len(proof)} bytes, verify {verify * 1e6:.1f} us")
    for old in (size // 2 + 1, size - GROWTH):
        old_root = (await tree_head(book, size=old)).root()
        seconds, proof = await timed(lambda: consistency_proof_for(book, old, size))
        assert tlog.verify_consistency(old, size, old_root, root, proof)
        verify = per_call(lambda: tlog.verify_consistency(old, size, old_root, root, proof))
        line(f"consistency proof {old:,} -> {size:,}", f"{seconds:.2f} s to compute, {len(proof)} nodes = "
             f"{32 * len(proof)} bytes, verify {verify * 1e6:.1f} us")


def tree_alone(facts: int) -> None:
    print(f"== the tree alone, {facts:,} synthetic leaves")
    hashes = [os.urandom(32).hex() for _ in range(facts)]
    start = time.perf_counter()
    leaves = [leaf_of(seq, h) for seq, h in enumerate(hashes, 1)]
    seconds = time.perf_counter() - start
    line("leaf hashes (fact_leaf + leaf_hash)", f"{seconds:.2f} s, {seconds / facts * 1e6:.2f} us/leaf")
    frontier = tlog.Frontier()
    per_batch = []
    for lo in range(0, facts, 1000):
        start = time.perf_counter()
        frontier.append(leaves[lo:lo + 1000])
        per_batch.append(time.perf_counter() - start)
    start = time.perf_counter()
    root = frontier.root()
    folded = time.perf_counter() - start
    per_batch.sort()
    line("Frontier.append, per batch of 1,000 leaves", f"median {statistics.median(per_batch) * 1000:.2f} ms, "
         f"p99 {per_batch[int(len(per_batch) * 0.99)] * 1000:.2f} ms, all {sum(per_batch):.2f} s")
    line("Frontier.root(), saved frontier", f"{folded * 1e6:.0f} us, {len(frontier.to_bytes())} bytes")
    assert root == tlog.root(leaves)


async def on(url: str, facts: int) -> None:
    engine = connect(url)
    try:
        await prepare(engine, FakeClock())
        await one_backend(Book(engine, task_registry(), FakeClock()), facts)
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=1_000_000)
    parser.add_argument("--pg", action="store_true", help="PostgreSQL too (a throwaway cluster unless --pg-url)")
    parser.add_argument("--pg-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(on(f"sqlite:///{directory}/factlog.db", args.facts))
    if args.pg or args.pg_url:
        run_with_postgres(args.pg_url, lambda url: on(url, args.facts))
    tree_alone(args.facts)


if __name__ == "__main__":
    main()
