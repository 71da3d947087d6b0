"""``DeliveryWorker``: runs delivery passes, sleeping until the next due row or a wake-up.

An idle worker sleeps until the earliest ``next_attempt_at`` (or the tick, a safety net) and wakes
at once when a transaction that wrote a dispatch commits through the same :class:`Book` (its
``on_commit`` hook), or when ``extra_wakeups`` yields (e.g. PostgreSQL LISTEN/NOTIFY from
``statebook.adapters.pgnotify``, which sees enqueues by other processes).

>>> worker = DeliveryWorker(book, CallableTransport(send), tick_seconds=30)  # doctest: +SKIP
>>> task = asyncio.create_task(worker.run_until_stopped()); ...; worker.stop(); await task  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Any

from statebook.lifecycle import Actor, Book, Head

from . import checks
from .admin import apply_retention
from ..core.passes import ERROR_PAUSE_SECONDS, MIN_PAUSE_SECONDS, PassWorker
from .errors import DispatchInvalid
from .transport import Transport
from .attempts import DELIVERY_ACTOR, Candidate, next_due, read_candidates
from .delivery import COUNTERS, deliver_due_dispatches, deliver_offered
from .offers import offered_id, subscribe, unsubscribe

log = logging.getLogger("statebook.outbox.worker")

__all__ = ["ERROR_PAUSE_SECONDS", "MIN_PAUSE_SECONDS", "DeliveryWorker", "Retention"]


@dataclass(frozen=True)
class Retention:
    """Purge settled dispatches: delivered/acked after ``delivered_days``, dead_letter/expired after
    ``failed_days``; checked every ``every_seconds``."""

    delivered_days: float = 7
    failed_days: float = 30
    every_seconds: float = 3600

    def __post_init__(self) -> None:
        checks.days("delivered_days", self.delivered_days)
        checks.days("failed_days", self.failed_days)
        checks.seconds("every_seconds", self.every_seconds)


class DeliveryWorker(PassWorker):
    """Delivers due dispatches until :meth:`stop` is called (the loop: :class:`~.passes.PassWorker`)."""

    entity_types = frozenset({"dispatch"})

    def __init__(
        self,
        book: Book,
        transport: Transport,
        *,
        batch_size: int = 100,
        concurrency: int = 8,
        tick_seconds: float = 30.0,
        retention: Retention | None = None,
        extra_wakeups: AsyncIterable[Any] | None = None,
        actor: Actor = DELIVERY_ACTOR,
    ) -> None:
        checks.book_arg(book, unbound="a DeliveryWorker")
        checks.transport_arg(transport)
        checks.count("batch_size", batch_size, checks.MAX_BATCH)
        checks.count("concurrency", concurrency, checks.MAX_CONCURRENCY)
        checks.seconds("tick_seconds", tick_seconds)
        if retention is not None and not isinstance(retention, Retention):
            raise DispatchInvalid(f"retention: expected a Retention or None, got {type(retention).__name__}",
                                  argument="retention", rule="type")
        if extra_wakeups is not None and not hasattr(extra_wakeups, "__aiter__"):
            raise DispatchInvalid(f"extra_wakeups: expected an async iterable or None, got "
                                  f"{type(extra_wakeups).__name__}", argument="extra_wakeups", rule="type")
        checks.actor(actor)
        super().__init__(book, tick_seconds=tick_seconds, extra_wakeups=extra_wakeups)
        self.transport = transport
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.retention = retention
        self.actor = actor
        self.totals = dict.fromkeys(COUNTERS, 0)
        self._offered: dict[str, tuple[Candidate, Head] | None] = {}
        self._next_retention: float | None = None

    # -- the pass loop's hooks (.passes.PassWorker) -------------------------------------------------
    def started(self) -> None:
        subscribe(self.book, self._take)

    def stopped(self) -> None:
        unsubscribe(self.book, self._take)

    def on_wakeup(self, payload: Any) -> None:
        """A NOTIFY names a dispatch: offer it (read by key) while idle; anything else wakes a scan."""
        dispatch_id = offered_id(payload)
        if dispatch_id is None or not self._take(dispatch_id, None):
            self.wake()

    async def run_pass(self) -> dict[str, int]:
        """Deliver the dispatches offered since the last pass, or else one batch of due ones; return the counts."""
        offered, self._offered = self._offered, {}
        return await (self.run_offered(offered) if offered else self.run_once())

    def _take(self, dispatch_id: str, hint: tuple[Candidate, Head] | None) -> bool:
        """Accept an offer (see :mod:`.offers`) while idle: the next pass claims it without a scan."""
        if not self.idle.is_set() or len(self._offered) >= self.batch_size:
            return False
        if hint is not None or dispatch_id not in self._offered:
            self._offered[dispatch_id] = hint
        self.wake()
        return True

    # -- running ---------------------------------------------------------------------------------
    async def run_once(self) -> dict[str, int]:
        """One delivery pass (and retention when it is due); the pass's counters."""
        counts = await deliver_due_dispatches(
            self._own, transport=self.transport, batch_size=self.batch_size, concurrency=self.concurrency,
            actor=self.actor,
        )
        await self._retention_if_due()
        return self._counted(counts)

    async def run_offered(self, offered: dict[str, tuple[Candidate, Head] | None]) -> dict[str, int]:
        """Claim and deliver offered dispatches (read by key when the offer named only an id)."""
        hinted = [hint for hint in offered.values() if hint is not None]
        named = [dispatch_id for dispatch_id, hint in offered.items() if hint is None]
        if named:
            hinted += await read_candidates(self._own, named)
        return self._counted(await deliver_offered(
            self._own, hinted, transport=self.transport, concurrency=self.concurrency, actor=self.actor
        ))

    def _counted(self, counts: dict[str, int]) -> dict[str, int]:
        for key, value in counts.items():
            self.totals[key] += value
        self.passes += 1
        return counts

    async def _retention_if_due(self) -> None:
        if self.retention is None:
            return
        now = self.book.clock.now()
        if self._next_retention is not None and now < self._next_retention:
            return
        self._next_retention = now + self.retention.every_seconds
        purged = await apply_retention(
            self._own, now=now, delivered_days=self.retention.delivered_days, failed_days=self.retention.failed_days
        )
        if any(purged.values()):
            log.info("retention purged %s", purged)

    async def next_delay(self, counts: dict[str, int] | None) -> float:
        """Seconds to sleep after a pass with ``counts`` (None: the pass failed).

        0 after a full batch; otherwise until the earliest due row, at most the tick.
        """
        if counts is None:
            return min(self.tick_seconds, ERROR_PAUSE_SECONDS)
        if counts["attempted"] >= self.batch_size:
            return 0.0  # a full batch: more rows are probably due
        earliest = await next_due(self._own)
        if earliest is None:
            return self.tick_seconds
        delay = earliest - self.book.clock.now()
        if delay <= 0:
            progressed = any(counts[k] for k in ("attempted", "expired", "dead_letter"))
            return 0.0 if progressed else MIN_PAUSE_SECONDS
        return min(delay, self.tick_seconds)
