"""W1-W6 and memory: each runs its contenders interleaved and returns table lines.

Contender runs return one figure per round; lines compare medians. PostgreSQL contenders each own
a database on the same server (truncated before each round); SQLite rounds get a fresh file copied
from a schema template.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from statebook.adapters.db import open_book
from statebook.lifecycle import Book
from statebook.lifecycle.sweep import MAX_PROCESSES

import peers
import seed
import statebook_side as sb
from baseline import Remote, Run, Sides
from common import (BATCH, BENCH_DIR, CONCURRENCY, METER, Line, SqliteFiles, Sizes, cpu_per_op, interleave,
                    median, throughput_line)
from floor import PgFloor, SqliteFloor

PG, SQ = "postgresql", "sqlite"


@dataclass
class Ctx:
    sizes: Sizes
    pg: dict[str, str]
    files: SqliteFiles
    template: Path
    log: Callable[[str], None]
    sides: Sides | None = None
    """Set by ``--baseline``: W1-W3 run their statebook contenders in two child processes."""

    @property
    def rounds(self) -> int:
        return self.sizes.rounds

    @property
    def repeat(self) -> int:
        """Back-to-back runs of each (working, baseline) pair per round; 1 without ``--baseline``."""
        return 1 if self.sides is None else self.sides.repeat

    @contextlib.asynccontextmanager
    async def statebook_sides(self, contenders: Sequence[tuple[str, Run]], remotes: dict[str, Remote]
                              ) -> AsyncIterator[tuple[list[tuple[str, Run]], list[tuple[str, str]]]]:
        """Without ``--baseline`` the contenders as given; with it, each one ``remotes`` names runs in
        the working tree's child and the baseline's child instead (baseline.Sides.contenders)."""
        if self.sides is None:
            yield list(contenders), []
            return
        async with self.sides.contenders(contenders, remotes) as got:
            yield got

    def compare(self, line: Line, key: str, values: dict[str, list[float]],
                cpu: dict[str, list[float]] | None = None, count: int | None = None) -> Line:
        """``line`` with the baseline's figure for statebook contender ``key`` (unchanged without one)."""
        return line if self.sides is None else self.sides.compare(line, key, values, cpu, count)

    def sqlite_path(self, label: str) -> Path:
        path = self.files.fresh(label)
        shutil.copyfile(self.template, path)
        return path

    @contextlib.asynccontextmanager
    async def sqlite_book(self, label: str) -> AsyncIterator[Book]:
        path = self.sqlite_path(label)
        book = await open_book(f"sqlite:///{path}")
        try:
            yield book
        finally:
            await book.engine.dispose()
            self.files.drop(path)

    @contextlib.asynccontextmanager
    async def sqlite_floor(self, label: str) -> AsyncIterator[SqliteFloor]:
        path = self.sqlite_path(label)
        floor = SqliteFloor(str(path), CONCURRENCY)
        await floor.open()
        try:
            yield floor
        finally:
            await floor.close()
            self.files.drop(path)


async def make_template(files: SqliteFiles) -> Path:
    path = files.dir / "template.db"
    book = await open_book(f"sqlite:///{path}")
    await book.engine.dispose()
    return path


@contextlib.asynccontextmanager
async def pg_contenders(ctx: Ctx) -> AsyncIterator[tuple[Book, PgFloor, peers.PgQueuerPeer, peers.ProcrastinatePeer]]:
    book = await open_book(ctx.pg["statebook"])
    floor = PgFloor(ctx.pg["floor"], CONCURRENCY)
    pgq = peers.PgQueuerPeer(ctx.pg["pgqueuer"])
    proc = peers.ProcrastinatePeer(ctx.pg["procrastinate"])
    await floor.open()
    await pgq.open()
    await proc.open()
    try:
        yield book, floor, pgq, proc
    finally:
        await proc.close()
        await pgq.close()
        await floor.close()
        await book.engine.dispose()


# -- W1 ----------------------------------------------------------------------------------------

async def w1(ctx: Ctx) -> list[Line]:
    z = ctx.sizes
    n, total, k = z.w1_single, z.w1_batch_total, z.w1_batch
    async with pg_contenders(ctx) as (book, floor, pgq, proc):
        async def sb_pg() -> float:
            await sb.empty(book)
            return n / await sb.enqueue_single(book, n)

        async def sb_pg_batch() -> float:
            await sb.empty(book)
            return total / await sb.enqueue_batches(book, total, k)

        async def sb_sq() -> float:
            async with ctx.sqlite_book("w1") as b:
                return n / await sb.enqueue_single(b, n)

        async def sb_sq_batch() -> float:
            async with ctx.sqlite_book("w1b") as b:
                return total / await sb.enqueue_batches(b, total, k)

        async def fl_pg() -> float:
            await floor.reset()
            return n / await floor.enqueue_single(n)

        async def fl_pg_one() -> float:
            await floor.reset()
            return n / await floor.enqueue_single(n, one_statement=True)

        async def fl_pg_batch() -> float:
            await floor.reset()
            return total / await floor.enqueue_batches(total, k)

        async def fl_sq() -> float:
            async with ctx.sqlite_floor("w1f") as f:
                return n / await f.enqueue_single(n)

        async def fl_sq_batch() -> float:
            async with ctx.sqlite_floor("w1fb") as f:
                return total / await f.enqueue_batches(total, k)

        async def pq() -> float:
            await pgq.reset()
            return n / await pgq.enqueue_single(n)

        async def pq_batch() -> float:
            await pgq.reset()
            return total / await pgq.enqueue_batches(total, k)

        async def pr() -> float:
            await proc.reset()
            return n / await proc.enqueue_single(n)

        async def pr_batch() -> float:
            await proc.reset()
            return total / await proc.enqueue_batches(total, k)

        def rate(count: int) -> Callable[[str, Any], float]:
            return lambda _name, seconds: count / seconds

        remotes = {
            "statebook-pg": Remote("enqueue_single", PG, {"n": n}, rate(n)),
            "statebook-sqlite": Remote("enqueue_single", SQ, {"n": n}, rate(n)),
            "statebook-pg-batch": Remote("enqueue_batches", PG, {"total": total, "batch": k}, rate(total)),
            "statebook-sqlite-batch": Remote("enqueue_batches", SQ, {"total": total, "batch": k}, rate(total)),
        }
        ctx.log(f"W1 single enqueue: {n:,} per round; batch: {total:,} in batches of {k}")
        cpu: dict[str, list[float]] = {}
        async with ctx.statebook_sides([
            ("statebook-pg", sb_pg), ("pgqueuer", pq), ("floor-pg", fl_pg), ("procrastinate", pr),
            ("floor-pg-1stmt", fl_pg_one), ("statebook-sqlite", sb_sq), ("floor-sqlite", fl_sq),
            ("statebook-pg-batch", sb_pg_batch), ("pgqueuer-list", pq_batch), ("floor-pg-batch", fl_pg_batch),
            ("procrastinate-batch", pr_batch), ("statebook-sqlite-batch", sb_sq_batch),
            ("floor-sqlite-batch", fl_sq_batch),
        ], remotes) as (contenders, alternate):
            r = await interleave(ctx.rounds, contenders, ctx.log, cpu, alternate, ctx.repeat)
    u = "enq/s"
    single, batch = f"W1 enqueue single ({n:,})", f"W1 enqueue batch {k} ({total:,})"

    def line(name: str, backend: str, sb_key: str, ref_label: str, ref_key: str, target: float | None,
             count: int, note: str = "") -> Line:
        return ctx.compare(throughput_line(name, backend, u, r[sb_key], ref_label, r[ref_key], target, note,
                                           cpu_per_op(cpu, sb_key, ref_key, count)), sb_key, r, cpu, count)

    return [
        line(single, PG, "statebook-pg", "pgqueuer", "pgqueuer", 1.0, n),
        line(single, PG, "statebook-pg", "floor", "floor-pg", 0.7, n),
        line(single, PG, "statebook-pg", "procrastinate", "procrastinate", None, n),
        line(single, PG, "statebook-pg", "floor 1-stmt", "floor-pg-1stmt", None, n,
             "floor with row+fact in one statement (no BEGIN/COMMIT round trips)"),
        line(single, SQ, "statebook-sqlite", "floor", "floor-sqlite", 0.7, n),
        line(batch, PG, "statebook-pg-batch", "pgqueuer", "pgqueuer-list", 0.5, total),
        line(batch, PG, "statebook-pg-batch", "floor", "floor-pg-batch", 0.7, total),
        line(batch, PG, "statebook-pg-batch", "procrastinate", "procrastinate-batch", None, total),
        line(batch, SQ, "statebook-sqlite-batch", "floor", "floor-sqlite-batch", 0.7, total),
    ]


# -- W2 ----------------------------------------------------------------------------------------

class _Deliveries:
    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0

    async def __call__(self) -> None:
        self.count += 1
        self.last = time.perf_counter()


async def _floor_drain(floor: PgFloor | SqliteFloor, n: int) -> float:
    await floor.seed_pending(n)
    d = _Deliveries()
    METER.cpu = 0.0  # the seeding above is not part of the figure
    start = METER.start()
    await floor.drain(d, BATCH)
    METER.stop()
    if d.count != n:
        raise RuntimeError(f"the floor delivered {d.count} of {n}")
    return n / (d.last - start)


async def w2(ctx: Ctx) -> list[Line]:
    n, n_proc = ctx.sizes.w2_drain, ctx.sizes.w2_drain_procrastinate
    async with pg_contenders(ctx) as (book, floor, pgq, proc):
        async def sb_pg() -> float:
            await sb.empty(book)
            return n / await sb.drain(book, n)

        async def sb_sq() -> float:
            async with ctx.sqlite_book("w2") as b:
                return n / await sb.drain(b, n)

        async def fl_pg() -> float:
            await floor.reset()
            return await _floor_drain(floor, n)

        async def fl_sq() -> float:
            async with ctx.sqlite_floor("w2f") as f:
                return await _floor_drain(f, n)

        async def pq() -> float:
            await pgq.reset()
            return n / await pgq.drain(n)

        async def pr() -> float:
            await proc.reset()
            return n_proc / await proc.drain(n_proc)

        def rate(_name: str, seconds: float) -> float:
            return n / seconds

        ctx.log(f"W2 drain {n:,} no-op dispatches (procrastinate {n_proc:,}), concurrency {CONCURRENCY}, "
                f"batch {BATCH}")
        cpu: dict[str, list[float]] = {}
        async with ctx.statebook_sides([
            ("statebook-pg", sb_pg), ("pgqueuer", pq), ("floor-pg", fl_pg), ("procrastinate", pr),
            ("statebook-sqlite", sb_sq), ("floor-sqlite", fl_sq),
        ], {"statebook-pg": Remote("drain", PG, {"n": n}, rate),
            "statebook-sqlite": Remote("drain", SQ, {"n": n}, rate)}) as (contenders, alternate):
            r = await interleave(ctx.rounds, contenders, ctx.log, cpu, alternate, ctx.repeat)
    u, name = "del/s", f"W2 drain ({n:,})"

    def cmp(line: Line, key: str) -> Line:
        return ctx.compare(line, key, r, cpu, n)

    return [
        cmp(throughput_line(name, PG, u, r["statebook-pg"], "pgqueuer", r["pgqueuer"], 1.2,
                            cpu=cpu_per_op(cpu, "statebook-pg", "pgqueuer", n)), "statebook-pg"),
        cmp(throughput_line(name, PG, u, r["statebook-pg"], "procrastinate", r["procrastinate"], 2.0,
                            f"procrastinate drains {n_proc:,}",
                            cpu_per_op(cpu, "statebook-pg", "procrastinate", n, n_proc)), "statebook-pg"),
        cmp(throughput_line(name, PG, u, r["statebook-pg"], "floor", r["floor-pg"], 0.7,
                            cpu=cpu_per_op(cpu, "statebook-pg", "floor-pg", n)), "statebook-pg"),
        cmp(throughput_line(name, SQ, u, r["statebook-sqlite"], "floor", r["floor-sqlite"], 0.7,
                            cpu=cpu_per_op(cpu, "statebook-sqlite", "floor-sqlite", n)), "statebook-sqlite"),
    ]


# -- W3 ----------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def w3(ctx: Ctx) -> list[Line]:
    samples = ctx.sizes.w3_samples
    p50: dict[str, list[float]] = {}
    p99: dict[str, list[float]] = {}
    async with pg_contenders(ctx) as (book, _floor, pgq, _proc):
        def record(name: str, ms: list[float]) -> float:
            p50.setdefault(name, []).append(_pct(ms, 0.50))
            p99.setdefault(name, []).append(_pct(ms, 0.99))
            return _pct(ms, 0.50)

        async def sb_pg() -> float:
            await sb.empty(book)
            return record("statebook-pg", await sb.latency(book, samples))

        async def sb_pg_listen() -> float:
            await sb.empty(book)
            return record("statebook-pg-listen", await sb.latency(book, samples, listen_url=ctx.pg["statebook"]))

        async def sb_sq() -> float:
            async with ctx.sqlite_book("w3") as b:
                return record("statebook-sqlite", await sb.latency(b, samples))

        async def pq() -> float:
            await pgq.reset()
            return record("pgqueuer", await pgq.latency(samples))

        ctx.log(f"W3 idle latency: {samples} samples per round (p50 printed)")
        async with ctx.statebook_sides([
            ("statebook-pg", sb_pg), ("pgqueuer", pq), ("statebook-pg-listen", sb_pg_listen),
            ("statebook-sqlite", sb_sq),
        ], {"statebook-pg": Remote("latency", PG, {"samples": samples}, record),
            "statebook-pg-listen": Remote("latency", PG, {"samples": samples, "listen": True}, record),
            "statebook-sqlite": Remote("latency", SQ, {"samples": samples}, record)}) as (contenders, alternate):
            # A W3 run is 500 samples (seconds, not a fraction of one) and its p50 is already a median:
            # a quarter of the pairs resolves it, and keeps a --baseline run near 25 minutes.
            await interleave(ctx.rounds, contenders, ctx.log, alternate=alternate, repeat=max(1, ctx.repeat // 4))
    lines = []
    for name, label in (("statebook-pg", "W3 latency (commit hook)"), ("statebook-pg-listen", "W3 latency (LISTEN)")):
        s50, s99, q50, q99 = (median(p50[name]), median(p99[name]), median(p50["pgqueuer"]),
                              median(p99["pgqueuer"]))
        lines.append(ctx.compare(Line(f"{label} p50", PG, "ms", s50, "pgqueuer", q50, s50 / q50,
                                      "<= 20 ms and <= pgqueuer", s50 <= 20 and s50 <= q50,
                                      samples={"statebook": p50[name], "pgqueuer": p50["pgqueuer"]}), name, p50))
        lines.append(ctx.compare(Line(f"{label} p99", PG, "ms", s99, "pgqueuer", q99, s99 / q99, "<= 100 ms",
                                      s99 <= 100, samples={"statebook": p99[name], "pgqueuer": p99["pgqueuer"]}),
                                 name, p99))
    s50, s99 = median(p50["statebook-sqlite"]), median(p99["statebook-sqlite"])
    lines.append(ctx.compare(Line("W3 latency (commit hook) p50", SQ, "ms", s50, target="<= 20 ms", passed=s50 <= 20,
                                  samples={"statebook": p50["statebook-sqlite"]}), "statebook-sqlite", p50))
    lines.append(ctx.compare(Line("W3 latency (commit hook) p99", SQ, "ms", s99, target="<= 100 ms",
                                  passed=s99 <= 100, samples={"statebook": p99["statebook-sqlite"]}),
                             "statebook-sqlite", p99))
    return lines


# -- W4 and W5 ---------------------------------------------------------------------------------

async def pg_schema(url: str) -> None:
    book = await open_book(url)
    await sb.empty(book)
    await book.engine.dispose()


async def w4(ctx: Ctx) -> list[Line]:
    z = ctx.sizes
    sq_small, sq_large = ctx.sqlite_path("w4-small"), ctx.sqlite_path("w4-large")
    for url in (ctx.pg["w4_small"], ctx.pg["w4_large"]):
        await pg_schema(url)
    for rows, pg_url, path in ((z.w4_small, ctx.pg["w4_small"], sq_small), (z.w4_large, ctx.pg["w4_large"], sq_large)):
        took = await seed.seed_history(rows, [seed.PgTarget(pg_url), seed.SqliteTarget(str(path))])
        ctx.log(f"W4 seeded {rows:,} delivered dispatches ({3 * rows:,} facts) on both backends in {took:.1f}s")
    books = {"pg-small": await open_book(ctx.pg["w4_small"]), "pg-large": await open_book(ctx.pg["w4_large"]),
             "sqlite-small": await open_book(f"sqlite:///{sq_small}"),
             "sqlite-large": await open_book(f"sqlite:///{sq_large}")}
    try:
        def run(name: str) -> Callable[[], Any]:
            async def go() -> float:
                return 1000 * await sb.claim_deliver(books[name], z.w4_due)
            return go

        ctx.log(f"W4 claim+deliver {z.w4_due:,} due rows next to {z.w4_small:,} vs {z.w4_large:,} terminal rows")
        r = await interleave(ctx.rounds, [(name, run(name)) for name in books], ctx.log)
    finally:
        for book in books.values():
            await book.engine.dispose()
        ctx.files.drop(sq_small)
        ctx.files.drop(sq_large)
    lines = []
    for backend, key in ((PG, "pg"), (SQ, "sqlite")):
        small, large = r[f"{key}-small"], r[f"{key}-large"]
        ratio = median(large) / median(small)
        lines.append(Line(f"W4 claim+deliver {z.w4_due:,}, {z.w4_large:,} vs {z.w4_small:,} history", backend, "ms",
                          median(large), f"{z.w4_small:,} rows", median(small), ratio, "<= 1.5x", ratio <= 1.5,
                          samples={"large": large, "small": small}))
    return lines


async def w5(ctx: Ctx) -> list[Line]:
    rows = -(-ctx.sizes.w5_facts // 3)
    path = ctx.sqlite_path("w5")
    took = await seed.seed_history(rows, [seed.SqliteTarget(str(path))])
    ctx.log(f"W5 seeded {rows:,} delivered dispatches ({3 * rows:,} facts) in {took:.1f}s")
    book = await open_book(f"sqlite:///{path}")
    facts = 0
    try:
        async def go() -> float:
            nonlocal facts
            rate, facts = await sb.verify_rate(book)
            return rate

        r = await interleave(ctx.rounds, [("statebook-sqlite", go)], ctx.log)
    finally:
        await book.engine.dispose()
        ctx.files.drop(path)
    rate = median(r["statebook-sqlite"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return [Line(f"W5 verify ({facts:,} facts)", SQ, "facts/s", rate, target=">= 100,000 facts/s",
                 passed=rate >= 100_000, samples={"statebook": r["statebook-sqlite"]},
                 note=f"{cores} cores: this process and {min(cores - 1, MAX_PROCESSES)} worker process(es)")]


# -- memory ------------------------------------------------------------------------------------

async def memory(ctx: Ctx) -> list[Line]:
    n = ctx.sizes.memory_drain
    lines = []
    for backend in (PG, SQ):
        if backend == PG:
            url = ctx.pg["statebook"]
            book = await open_book(url)
            await sb.empty(book)
            await book.engine.dispose()
            floor: PgFloor | SqliteFloor = PgFloor(url, 2)
            path = None
        else:
            path = ctx.sqlite_path("memory")
            url = f"sqlite:///{path}"
            floor = SqliteFloor(str(path), 2)
        await floor.open()
        await floor.seed_pending(n)
        await floor.close()
        ctx.log(f"memory: draining {n:,} dispatches on {backend} in a child process")
        proc = subprocess.run([sys.executable, str(BENCH_DIR / "memory.py"), url, str(n)], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(BENCH_DIR)})
        if path is not None:
            ctx.files.drop(path)
        if proc.returncode != 0:
            raise RuntimeError(f"memory child failed:\n{proc.stderr[-3000:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        ctx.log(f"    {got}")
        lines.append(Line(f"memory: peak RSS growth draining {n:,}", backend, "MB", got["growth_mb"],
                          "baseline RSS", got["baseline_mb"], None, "<= 50 MB", got["growth_mb"] <= 50,
                          note=f"{got['delivered']:,} delivered"))
    return lines
