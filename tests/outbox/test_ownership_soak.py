"""Ownership under load on real PostgreSQL connections (specs/notifications.md N15-N28): intakes, delivery
passes that succeed or fail at random, and operators replaying dead letters, all at once on separate
connections for a few seconds (ten times as long under the deep profile). Afterwards: no transaction failed (a deadlock would), every obligation has at
most one live owner, every pending follower follows its claim's owner in the claim's generation, no follower
was satisfied unless an owner of its obligation delivered, and verify is clean."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from profiles import soak_seconds
import sqlalchemy as sa

from statebook.adapters.db import connect, open_book, reset_schema
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Book, FakeClock, verify
from statebook.outbox.notifications import (
    RecoveryRefused, list_dead_letters, replay_notification, send_notification,
)
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.schema import dedup_claims, notifications
from statebook.outbox.notifications.scripted import ScriptedChannel

# Serial: a soak bounded in seconds; on a loaded machine it would do too little to mean anything.
pytestmark = [pytest.mark.postgres, pytest.mark.serial]

SECONDS = soak_seconds(3.0)
KEYS = ("disk", "cpu", "net")


async def soak(url: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    clock = FakeClock(1_000_000.0)
    first = await open_book(url, clock=clock)
    await reset_schema(first.engine)
    books = [Book(connect(url), builtin_registry(), clock) for _ in range(6)]
    errors: list[str] = []
    stop = asyncio.Event()

    def step(delivery) -> str:
        return "success" if rng.random() < 0.15 else "reject"

    async def guarded(name: str, body) -> None:
        try:
            while not stop.is_set():
                await body()
                await asyncio.sleep(0)
        except Exception as exc:  # noqa: BLE001 - reported below, with the task's name
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    def intake(book: Book):
        async def once() -> None:
            await send_notification(book, recipient="ops", content={"n": rng.random()}, mode="guaranteed",
                                    channels=["email"], obligation_key=rng.choice(KEYS), obligation_window=rng.choice((0, 2, 20)))
            await asyncio.sleep(0.01)
        return once

    def worker(book: Book):
        async def once() -> None:
            await deliver_due_notifications(book, {"email": ScriptedChannel("email", [step])}, deadline=0.5, limit=20)
        return once

    def operator(book: Book):
        async def once() -> None:
            for row in await list_dead_letters(book, limit=20):
                if row.replay_block_reason is None and rng.random() < 0.5:
                    try:
                        await replay_notification(book, row.id, actor=Actor("operator", "soak"))
                    except RecoveryRefused:
                        pass  # a race with another operator or a new owner: refused, nothing written
            await asyncio.sleep(0.01)
        return once

    async def ticker() -> None:
        while not stop.is_set():
            clock.advance(1.5)  # backoffs and windows pass while the others work
            await asyncio.sleep(0.02)

    tasks = [asyncio.ensure_future(guarded(f"intake {i}", intake(books[i]))) for i in range(2)]
    tasks += [asyncio.ensure_future(guarded(f"worker {i}", worker(books[2 + i]))) for i in range(3)]
    tasks += [asyncio.ensure_future(guarded("operator", operator(books[5]))), asyncio.ensure_future(ticker())]
    await asyncio.sleep(SECONDS)
    stop.set()
    await asyncio.gather(*tasks)
    for b in books:
        await b.engine.dispose()
    errors += await check(first)
    await first.engine.dispose()
    return errors


async def check(book: Book) -> list[str]:
    found: list[str] = []
    async with book.read() as conn:
        rows = {r.id: dict(r._mapping) for r in await conn.execute(sa.select(notifications))}
        claims = {r.id: dict(r._mapping) for r in await conn.execute(sa.select(dedup_claims))}
    live = {"pending", "rate_limited"}
    for cid, c in claims.items():
        owners = [r for r in rows.values() if r["dedup_claim_id"] == cid and r["status"] in live
                  and r["obligation_owner_id"] is None]
        if len(owners) > 1:
            found.append(f"claim {cid}: {len(owners)} live owners")
        if owners and (c["status"], c["owner_id"]) != ("owned", owners[0]["id"]):
            found.append(f"claim {cid} ({c['status']}, {c['owner_id']}) does not name its live owner {owners[0]['id']}")
        for r in rows.values():
            if r["dedup_claim_id"] == cid and r["status"] == "pending" and r["obligation_owner_id"] is not None:
                if (r["obligation_owner_id"], r["generation"]) != (c["owner_id"], c["generation"]) or c["status"] != "owned":
                    found.append(f"follower {r['id']} follows {r['obligation_owner_id']}/{r['generation']}, claim "
                                 f"{c['status']} {c['owner_id']}/{c['generation']}")
            if r["dedup_claim_id"] == cid and r["status"] == "deduplicated":
                owner = rows.get(r["obligation_owner_id"])
                if owner is None or owner["status"] != "delivered":
                    found.append(f"{r['id']} deduplicated by {r['obligation_owner_id']}, which did not deliver")
    for entity_type in ("notification", "dedup_claim", "channel_attempt"):
        report = await verify(book, entity_type)
        if not report.ok:
            found.append(f"verify {entity_type}: {report}")
    if not any(r["status"] == "deduplicated" for r in rows.values()):
        found.append("the soak never satisfied a follower: it exercised too little")
    return found


def test_ownership_soak_on_postgresql(pg_url, caplog):
    caplog.set_level(logging.ERROR)
    errors = asyncio.run(soak(pg_url, seed=12))
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [] and logged == [], (errors, logged[:5])
