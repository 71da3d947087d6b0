"""W7 guarded transitions, and W1/W2 against DBOS: statebook next to the peers that record every step.

W7: N entities, each moved through the five transitions of a six-status chain by ``CONCURRENCY``
concurrent callers (a caller takes the next entity and moves it to the end). statebook: one
``transition`` per step, each its own transaction (a compare-and-set on the row and a hash-chained
fact). eventsourcing: ``repository.get``, one command, ``save`` (one event row). DBOS: a workflow of
five steps (a step output row each, and the workflow's status row). Entities are created before
the clock starts. Figures: transitions/s and the p50/p99 of one transition in milliseconds.

W1/W2 against DBOS: a DBOS workflow of one no-op step enqueued one call at a time (DBOS has no batch
enqueue) and drained by its queue worker, next to statebook's dispatch enqueue and drain.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import asyncpg
import sqlalchemy as sa

from statebook.adapters.db import open_book
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import (Actor, Book, Lifecycle, NewEntity, Reason, Registry, create_many, edges, history,
                                 managed_table, transition)

import statebook_side as sb
from durable_peers import CHAIN, DbosPeer, EventsourcingPeer, callers
from common import CONCURRENCY, Line, cpu_per_op, interleave, median, throughput_line

if TYPE_CHECKING:
    from workloads import Ctx

PG, SQ = "postgresql", "sqlite"
TARGET = 2.0
"""The issue's bar against every peer that records each step: statebook at least twice as fast."""

parcels = managed_table("bench_parcels", sa.Column("id", sa.String(32), primary_key=True), meta=sa.MetaData())
PARCEL = Lifecycle(
    entity_type="bench_parcel", table=parcels, statuses=CHAIN, initial={CHAIN[0]}, terminal={CHAIN[-1]},
    edges=[edge for source, target in zip(CHAIN, CHAIN[1:]) for edge in edges(source, target)],
    reason_prefixes={"parcel"}, reasons={f"parcel.{s}.step" for s in CHAIN},
)
ACTOR = Actor("system", "bench")


def registry() -> Registry:
    """The built-in lifecycles and W7's chain (the bench's own books open with it)."""
    reg = builtin_registry(seal=False)
    reg.register(PARCEL)
    return reg.seal()


def sizes(mode: str) -> tuple[int, int, int]:
    """(W7 entities, DBOS enqueue count, DBOS drain count) for ``quick`` or ``full``."""
    return (200, 1_000, 1_000) if mode == "quick" else (2_000, 5_000, 5_000)


# -- statebook's side ----------------------------------------------------------------------------

async def statebook_w7(book: Book, entities: Sequence[str]) -> tuple[float, list[float], int]:
    """(seconds, ms per transition, transition facts recorded): ``entities`` created first, then moved
    through the chain by ``CONCURRENCY`` callers, each ``transition`` its own transaction."""
    await create_many(book, PARCEL.entity_type,
                      [NewEntity({"id": ref}, CHAIN[0], Reason(f"parcel.{CHAIN[0]}.step"), ACTOR) for ref in entities])
    latencies: list[float] = []

    async def one(ref: str) -> None:
        for source, target in zip(CHAIN, CHAIN[1:]):
            t0 = time.perf_counter()
            await transition(book, PARCEL.entity_type, ref, target, expected=source,
                             reason=Reason(f"parcel.{target}.step"), actor=ACTOR)
            latencies.append((time.perf_counter() - t0) * 1000)

    seconds = await callers(entities, one)
    recorded = 0
    for ref in entities:
        recorded += sum(1 for fact in await history(book, PARCEL.entity_type, ref) if fact.previous_status is not None)
    return seconds, latencies, recorded


async def empty_pg(url: str) -> None:
    """TRUNCATE every table of a bench database's public schema (a peer's tables, created by the peer)."""
    conn = await asyncpg.connect(url)
    try:
        names = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        if names:
            quoted = ", ".join(f'"{row[0]}"' for row in names)
            await conn.execute(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE")
    finally:
        await conn.close()


# -- the workload --------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def w7(ctx: Ctx) -> list[Line]:
    n, n_enqueue, n_drain = sizes(ctx.sizes.mode)
    moves = 5 * n
    p50: dict[str, list[float]] = {}
    p99: dict[str, list[float]] = {}
    recorded: dict[str, int] = {}
    round_no = 0
    sb_pg_url = ctx.pg["w7_statebook"]
    pg_book = await open_book(sb_pg_url, registry=registry())
    dispatch_book = await open_book(ctx.pg["statebook"])

    def refs() -> list[str]:
        nonlocal round_no
        round_no += 1
        return [f"p{round_no}x{i}" for i in range(n)]

    def record(name: str, got: tuple[float, list[float], int]) -> float:
        seconds, latencies, steps = got
        p50.setdefault(name, []).append(_pct(latencies, 0.50))
        p99.setdefault(name, []).append(_pct(latencies, 0.99))
        recorded[name] = steps
        if steps != moves:
            raise RuntimeError(f"{name} recorded {steps} of {moves} transitions")
        return moves / seconds

    async def sb_pg() -> float:
        await empty_pg(sb_pg_url)
        return record("statebook-pg", await statebook_w7(pg_book, refs()))

    async def sb_sq() -> float:
        path = ctx.files.fresh("w7")
        book = await open_book(f"sqlite:///{path}", registry=registry())
        try:
            return record("statebook-sqlite", await statebook_w7(book, refs()))
        finally:
            await book.engine.dispose()
            ctx.files.drop(path)

    async def es_pg() -> float:
        await empty_pg(ctx.pg["w7_eventsourcing"])
        return record("eventsourcing-pg", await EventsourcingPeer(ctx.pg["w7_eventsourcing"]).w7(refs()))

    async def es_sq() -> float:
        path = ctx.files.fresh("w7es")
        try:
            return record("eventsourcing-sqlite", await EventsourcingPeer(f"sqlite:///{path}").w7(refs()))
        finally:
            ctx.files.drop(path)

    async def dbos_w7(name: str, url: str) -> float:
        return record(name, await DbosPeer(url).w7(refs()))

    ctx.log(f"W7 {n:,} entities x 5 guarded transitions, {CONCURRENCY} callers")
    cpu: dict[str, list[float]] = {}
    try:
        r = await interleave(ctx.rounds, [
            ("statebook-pg", sb_pg), ("eventsourcing-pg", es_pg),
            ("dbos-pg", lambda: dbos_w7("dbos-pg", ctx.pg["dbos"])),
            ("statebook-sqlite", sb_sq), ("eventsourcing-sqlite", es_sq),
            ("dbos-sqlite", lambda: _with_sqlite(ctx, "w7dbos", lambda url: dbos_w7("dbos-sqlite", url))),
        ], ctx.log, cpu)

        async def sb_enq_pg() -> float:
            await sb.empty(dispatch_book)
            return n_enqueue / await sb.enqueue_single(dispatch_book, n_enqueue)

        async def sb_enq_sq() -> float:
            async with ctx.sqlite_book("w7-w1") as b:
                return n_enqueue / await sb.enqueue_single(b, n_enqueue)

        async def sb_drain_pg() -> float:
            await sb.empty(dispatch_book)
            return n_drain / await sb.drain(dispatch_book, n_drain)

        async def sb_drain_sq() -> float:
            async with ctx.sqlite_book("w7-w2") as b:
                return n_drain / await sb.drain(b, n_drain)

        async def dbos_enq(url: str) -> float:
            return n_enqueue / await DbosPeer(url).enqueue_single(n_enqueue)

        async def dbos_drain(name: str, url: str) -> float:
            seconds, steps = await DbosPeer(url).drain(n_drain)
            if steps != n_drain:
                raise RuntimeError(f"{name} recorded {steps} of {n_drain} steps")
            return n_drain / seconds

        ctx.log(f"W1/W2 against DBOS: {n_enqueue:,} single enqueues, a drain of {n_drain:,}")
        q = await interleave(ctx.rounds, [
            ("statebook-pg-enq", sb_enq_pg), ("dbos-pg-enq", lambda: dbos_enq(ctx.pg["dbos"])),
            ("statebook-sqlite-enq", sb_enq_sq), ("dbos-sqlite-enq", lambda: _with_sqlite(ctx, "w1dbos", dbos_enq)),
            ("statebook-pg-drain", sb_drain_pg), ("dbos-pg-drain", lambda: dbos_drain("dbos-pg", ctx.pg["dbos"])),
            ("statebook-sqlite-drain", sb_drain_sq),
            ("dbos-sqlite-drain", lambda: _with_sqlite(ctx, "w2dbos", lambda url: dbos_drain("dbos-sqlite", url))),
        ], ctx.log, cpu)
    finally:
        await pg_book.engine.dispose()
        await dispatch_book.engine.dispose()
    return _lines(r, q, p50, p99, cpu, n, n_enqueue, n_drain)


async def _with_sqlite(ctx: Ctx, label: str, run: Callable[[str], Awaitable[float]]) -> float:
    path = ctx.files.fresh(label)
    try:
        return await run(f"sqlite:///{path}")
    finally:
        ctx.files.drop(path)


Figures = dict[str, list[float]]


def _lines(r: Figures, q: Figures, p50: Figures, p99: Figures, cpu: Figures, n: int, n_enqueue: int,
           n_drain: int) -> list[Line]:
    moves = 5 * n
    name = f"W7 guarded transitions ({n:,} x 5)"
    lines = []
    for backend, key in ((PG, "pg"), (SQ, "sqlite")):
        mine = f"statebook-{key}"
        for peer in ("eventsourcing", "dbos"):
            theirs = f"{peer}-{key}"
            lines.append(throughput_line(name, backend, "tr/s", r[mine], peer, r[theirs], TARGET,
                                         cpu=cpu_per_op(cpu, mine, theirs, moves)))
            for label, pct in (("p50", p50), ("p99", p99)):
                s, o = median(pct[mine]), median(pct[theirs])
                lines.append(Line(f"W7 transition {label}", backend, "ms", s, peer, o, s / o if o else None,
                                  samples={"statebook": pct[mine], peer: pct[theirs]}))
    for backend, key in ((PG, "pg"), (SQ, "sqlite")):
        mine, theirs = f"statebook-{key}-enq", f"dbos-{key}-enq"
        lines.append(throughput_line(f"W1 enqueue single ({n_enqueue:,})", backend, "enq/s", q[mine], "DBOS",
                                     q[theirs], None, cpu=cpu_per_op(cpu, mine, theirs, n_enqueue)))
    for backend in (PG, SQ):
        lines.append(Line("W1 enqueue batch", backend, "enq/s", None, "DBOS",
                          note="n/a: DBOS has no batch enqueue"))
    for backend, key in ((PG, "pg"), (SQ, "sqlite")):
        mine, theirs = f"statebook-{key}-drain", f"dbos-{key}-drain"
        lines.append(throughput_line(f"W2 drain ({n_drain:,})", backend, "del/s", q[mine], "DBOS", q[theirs],
                                     TARGET, cpu=cpu_per_op(cpu, mine, theirs, n_drain)))
    for backend in (PG, SQ):
        lines.append(Line("W2 drain", backend, "del/s", None, "eventsourcing",
                          note="n/a: eventsourcing has no queue or worker"))
    return lines
