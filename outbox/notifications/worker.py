"""``NotificationWorker``: delivery passes over due notifications, on the loop every deliverable shares.

The loop — sleep until the next due row or a wake-up, a pause after a failed pass — is
:class:`statebook.outbox.core.passes.PassWorker`, the dispatch worker's too. A notification accepted
through the same book wakes it at commit; other processes' intakes wake it through ``extra_wakeups``
(PostgreSQL LISTEN on ``statebook_notification``) or at the tick.

>>> worker = NotificationWorker(book, {"email": my_email_channel}, tick_seconds=30)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping, Sequence
from typing import Any

from statebook.lifecycle import Book
from statebook.lifecycle.inputs import shown
from statebook.outbox.core.passes import ERROR_PAUSE_SECONDS, PassWorker

from .channels import CHANNEL_NAMES, PERSISTENT_ORDER, Channel, LinkHook, check_order
from .attempts import DEADLINE_SECONDS, DUE, LEASE_SECONDS
from .delivery import COUNTERS, deliver_due_notifications
from .errors import NotificationInvalid
from .responses import expire_responses, next_timeout


async def next_due(book: Book) -> float | None:
    """The earliest ``next_attempt_at`` of a pending or rate-limited notification (None when idle)."""
    return await DUE.next_due(book)


def check_adapters(channels: Any) -> dict[str, Channel]:
    """A mapping of channel name (:data:`~.channels.CHANNEL_NAMES`) to an adapter whose ``name`` is that name."""
    if not isinstance(channels, Mapping):
        raise NotificationInvalid(f"channels: expected a mapping of channel name to adapter, got "
                                  f"{type(channels).__name__}", argument="channels", rule="type")
    for name, adapter in channels.items():
        if name not in CHANNEL_NAMES:
            raise NotificationInvalid(f"channels: unknown channel {shown(name)}; channels are {', '.join(CHANNEL_NAMES)}",
                                      argument="channels", rule="channel")
        if not isinstance(adapter, Channel) or getattr(adapter, "name", None) != name:
            raise NotificationInvalid(f"channels: {name!r} needs a Channel adapter named {name!r} (name, persistent, "
                                      "reports_admission, guards_provider_attempts, async send)",
                                      argument="channels", rule="type")
    return dict(channels)


class NotificationWorker(PassWorker):
    """Delivers due notifications through ``channels`` until :meth:`stop` is called; ``links`` makes the
    response links each delivery carries (:data:`~.channels.LinkHook`)."""

    entity_types = frozenset({"notification"})
    name = "notification delivery"

    def __init__(
        self,
        book: Book,
        channels: Mapping[str, Channel],
        *,
        batch_size: int = 100,
        concurrency: int = 8,
        lease_seconds: float = LEASE_SECONDS,
        deadline: float = DEADLINE_SECONDS,
        tick_seconds: float = 30.0,
        extra_wakeups: AsyncIterable[Any] | None = None,
        order: Sequence[str] = PERSISTENT_ORDER,
        links: LinkHook | None = None,
    ) -> None:
        try:
            self.order = check_order(order)
        except ValueError as exc:
            raise NotificationInvalid(f"order: {exc}", argument="order", rule="order") from None
        if not isinstance(book, Book) or book.conn is not None:
            raise NotificationInvalid("book: a NotificationWorker needs an unbound statebook Book (channels run "
                                      "outside any transaction)", argument="book", rule="bound")
        if not 0 < deadline < lease_seconds:
            raise NotificationInvalid(f"deadline: the adapter deadline ({shown(deadline, 30)}) must be positive and shorter "
                                      f"than the lease ({shown(lease_seconds, 30)})", argument="deadline", rule="range")
        if links is not None and not callable(links):
            raise NotificationInvalid(f"links: expected a callable (notification_id, recipient, due_at) -> "
                                      f"action -> URL, got {type(links).__name__}", argument="links", rule="type")
        super().__init__(book, tick_seconds=tick_seconds, extra_wakeups=extra_wakeups)
        self.channels = check_adapters(channels)
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.deadline = deadline
        self.links = links
        self.totals = dict.fromkeys(COUNTERS, 0)

    async def run_pass(self) -> dict[str, int]:
        """Deliver one batch of due notifications and return its counts by outcome."""
        counts = await deliver_due_notifications(
            self._own, self.channels, limit=self.batch_size, concurrency=self.concurrency,
            lease_seconds=self.lease_seconds, deadline=self.deadline, order=self.order, links=self.links,
        )
        for key, value in counts.items():
            self.totals[key] += value
        self.passes += 1
        return counts

    async def next_delay(self, counts: dict[str, int] | None) -> float:
        """0 after a full batch; otherwise until the earliest due notification, at most the tick."""
        if counts is None:
            return min(self.tick_seconds, ERROR_PAUSE_SECONDS)
        earliest = None if counts["claimed"] >= self.batch_size else await next_due(self._own)
        return self.delay_until(earliest, counts["claimed"], self.batch_size)


class ResponseTimeoutWorker(PassWorker):
    """The response timeout pass (:func:`~.responses.expire_responses`), on its own loop: separate from
    delivery and callback batches (N35). Sleeps until the earliest pending deadline, at most the tick;
    a response started through the same book wakes it at commit."""

    entity_types = frozenset({"notification_response"})
    name = "response timeouts"

    def __init__(self, book: Book, *, batch_size: int = 100, tick_seconds: float = 30.0,
                 extra_wakeups: AsyncIterable[Any] | None = None) -> None:
        if not isinstance(book, Book) or book.conn is not None:
            raise NotificationInvalid("book: a ResponseTimeoutWorker needs an unbound statebook Book",
                                      argument="book", rule="bound")
        super().__init__(book, tick_seconds=tick_seconds, extra_wakeups=extra_wakeups)
        self.batch_size = batch_size
        self.totals = {"timed_out": 0, "callbacks": 0}

    async def run_pass(self) -> dict[str, int]:
        """Time out one batch of responses past their deadline and return the counts."""
        counts = await expire_responses(self._own, limit=self.batch_size)
        for key, value in counts.items():
            self.totals[key] += value
        self.passes += 1
        return counts

    async def next_delay(self, counts: dict[str, int] | None) -> float:
        """Seconds to sleep before the next pass: until the next deadline, at most a tick; a short pause after an
        error (``counts`` None).
        """
        if counts is None:
            return min(self.tick_seconds, ERROR_PAUSE_SECONDS)
        earliest = None if counts["timed_out"] >= self.batch_size else await next_timeout(self._own)
        return self.delay_until(earliest, counts["timed_out"], self.batch_size)
