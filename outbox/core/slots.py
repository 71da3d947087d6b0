"""Bounded concurrency for a delivery pass: a fixed number of slots, refilled as they free.

:func:`run_in_slots` runs claimed leases with at most ``concurrency`` at work at once, outside any
transaction. Work that finishes while a record commits is recorded together in the next group (one
transaction, one transition each — :func:`.claims.record_set`). As slots fall idle it claims more,
``budget`` rows at most, as many as ``want(free)`` allows (the dispatch pass claims ahead of its free
slots only as far as timed sends show the leases will start in time, specs/outbox.md O21; the
notification pass claims its free slots).

Both deliverable lifecycles run their passes on it: :func:`statebook.outbox.dispatch.delivery.run_leases`
and :func:`statebook.outbox.notifications.delivery.deliver_due_notifications`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Claimed", "run_in_slots"]

log = logging.getLogger("statebook.outbox")

L = TypeVar("L")
R = TypeVar("R")


@dataclass
class Claimed(Generic[L]):
    """What one refill claimed: the leases won, the claim's counters, and how many due rows it moved
    (claims and settlements; fewer than asked means none is left due)."""

    leases: list[L]
    counts: dict[str, int] = field(default_factory=dict)
    rows: int = 0


async def run_in_slots(
    leases: Iterable[L],
    work: Callable[[L], Awaitable[R]],
    record: Callable[[list[tuple[L, R]]], Awaitable[None]],
    *,
    concurrency: int,
    counts: dict[str, int],
    refill: Callable[[int], Awaitable[Claimed[L]]] | None = None,
    budget: int = 0,
    want: Callable[[int], int] = lambda free: free,
    what: str = "delivery",
    overlap: bool = False,
) -> None:
    """Run ``work`` for each lease in at most ``concurrency`` slots; ``record`` each group of finished
    work. ``work`` should not raise: one that does is logged and its lease is not recorded (its claim
    lapses and a later pass takes the row again). A refill that fails before anything was claimed
    raises; later, it ends the refills and the pass finishes what it holds. ``counts`` gets each
    refill's counters added. With ``overlap``, a group's record runs beside the refill of the slots
    it freed (two connections) instead of before it; the pass ends once every record has."""
    gate = asyncio.Semaphore(concurrency)
    queue: asyncio.Queue[tuple[L, R] | None] = asyncio.Queue()
    tasks: list[asyncio.Future[None]] = []
    records: set[asyncio.Future[None]] = set()
    waiting = running = 0

    async def run(lease: L) -> None:
        nonlocal waiting, running
        item: tuple[L, R] | None = None
        try:
            async with gate:
                waiting, running = waiting - 1, running + 1
                try:
                    item = (lease, await work(lease))
                finally:
                    running -= 1
        except Exception:
            log.exception("a %s failed; its claim lapses and a later pass takes the row again", what)
        queue.put_nowait(item)

    def start(more: Iterable[L]) -> int:
        nonlocal waiting
        fresh = [asyncio.ensure_future(run(lease)) for lease in more]
        waiting += len(fresh)
        tasks.extend(fresh)
        return len(fresh)

    async def claim_more() -> int:
        nonlocal budget
        free = concurrency - running - waiting
        if refill is None or budget <= 0 or free <= 0:
            return 0
        asked = min(budget, want(free))
        try:
            claimed = await refill(asked)
        except Exception:
            if not tasks:
                raise  # nothing claimed or run yet: the pass failed
            log.exception("claiming more failed; this %s pass ends with what it holds", what)
            budget = 0
            return 0
        for key, value in claimed.counts.items():
            counts[key] = counts.get(key, 0) + value
        budget = budget - asked if claimed.rows >= asked else 0
        return start(claimed.leases)

    remaining = start(leases)
    try:
        remaining += await claim_more()
        while remaining:
            finished = [await queue.get()]
            await asyncio.sleep(0)  # let work that is already finishing join this group
            while not queue.empty():
                finished.append(queue.get_nowait())
            remaining -= len(finished)
            group = [item for item in finished if item is not None]
            if group and overlap:
                writing = asyncio.ensure_future(record(group))
                records.add(writing)
                writing.add_done_callback(records.discard)
            elif group:
                await record(group)
            remaining += await claim_more()
        if records:
            await asyncio.gather(*records)
    finally:
        for task in tasks:
            task.cancel()
        for pending in records:
            pending.cancel()
