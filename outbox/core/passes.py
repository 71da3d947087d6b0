"""The worker loop every deliverable shares: run a pass, sleep until the next due row or a wake-up.

A :class:`PassWorker` runs :meth:`~PassWorker.run_pass` again and again. Between passes it sleeps for
:meth:`~PassWorker.next_delay` (the earliest due row, at most the tick) and wakes at once when a
transaction that wrote one of its ``entity_types`` commits through the same :class:`Book` (its
``on_commit`` hook), or when ``extra_wakeups`` yields (e.g. PostgreSQL LISTEN/NOTIFY from
``statebook.adapters.pgnotify``). A failing pass is logged and retried after a pause. The dispatch
outbox's :class:`~statebook.outbox.DeliveryWorker` and the notifications'
:class:`~statebook.outbox.notifications.NotificationWorker` are the two kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterable
from typing import Any

from statebook.lifecycle import Book

log = logging.getLogger("statebook.outbox.worker")

MIN_PAUSE_SECONDS = 0.05
"""Pause after a pass that changed nothing while rows look due (e.g. held by another worker)."""
ERROR_PAUSE_SECONDS = 5.0


class PassWorker:
    """Runs passes until :meth:`stop` is called (see the module docstring). Subclasses give
    ``entity_types``, :meth:`run_pass` and :meth:`next_delay`; :meth:`on_wakeup` may take a wake-up's
    payload as an offer."""

    entity_types: frozenset[str] = frozenset()
    name = "delivery"

    def __init__(self, book: Book, *, tick_seconds: float, extra_wakeups: AsyncIterable[Any] | None = None) -> None:
        self.book = book
        self.tick_seconds = tick_seconds
        self.extra_wakeups = extra_wakeups
        self.passes = 0
        self.wakeups = 0
        self.idle = asyncio.Event()
        """Set while the worker sleeps between passes (tests wait on it)."""
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def _own(self) -> Book:
        """The book this worker writes through: its own commits do not wake it, but they wake the other
        workers of the same book (a delivery that starts a response wakes the timeout pass; a timeout that
        enqueues its callback wakes the dispatch worker)."""
        hooks = [hook for hook in self.book.on_commit if hook != self._on_commit]
        return dataclasses.replace(self.book, on_commit=hooks)

    # -- what a kind of worker gives -------------------------------------------------------------
    async def run_pass(self) -> dict[str, int]:
        """Run one pass and return its counts (implemented by each worker)."""
        raise NotImplementedError

    async def next_delay(self, counts: dict[str, int] | None) -> float:
        """Seconds to sleep before the next pass given the last pass's counts (None after an error); implemented by
        each worker.
        """
        raise NotImplementedError

    def delay_until(self, earliest: float | None, done: int, full: int) -> float:
        """The usual sleep after a pass that did ``done`` of at most ``full``: none after a full batch;
        else until ``earliest`` (the next due time; None: idle), at most the tick; a short pause when
        something is due that this pass did not take (another worker holds it)."""
        if done >= full:
            return 0.0
        if earliest is None:
            return self.tick_seconds
        delay = earliest - self.book.clock.now()
        if delay <= 0:
            return 0.0 if done else MIN_PAUSE_SECONDS
        return min(delay, self.tick_seconds)

    def on_wakeup(self, payload: Any) -> None:
        """A payload from ``extra_wakeups``: by default, just wake."""
        self.wake()

    def started(self) -> None:
        """Called once the loop runs (subscribe to offers, ...)."""

    def stopped(self) -> None:
        """Called when the loop ends."""

    # -- control ---------------------------------------------------------------------------------
    def wake(self) -> None:
        """Run a pass now. Safe to call from any thread and from commit hooks."""
        loop = self._loop
        if loop is None:
            self._wake.set()
            return
        # Called from commit hooks: must never raise into the committing caller.
        with contextlib.suppress(RuntimeError):  # the worker's loop is already closed
            loop.call_soon_threadsafe(self._wake.set)

    def stop(self) -> None:
        """Finish the current pass, then return from :meth:`run_until_stopped`."""
        self._stopping = True
        self.wake()

    def _on_commit(self, entity_type: str) -> None:
        if entity_type in self.entity_types:
            self.wakeups += 1
            self.wake()

    async def _listen(self, source: AsyncIterable[Any]) -> None:
        try:
            async for payload in source:
                self.wakeups += 1
                self.on_wakeup(payload)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("extra wake-up source failed; falling back to the tick", exc_info=True)

    async def run_until_stopped(self) -> None:
        """Run passes until :meth:`stop`; a failing pass is logged and retried after a pause."""
        self._loop = asyncio.get_running_loop()
        self.book.on_commit.append(self._on_commit)
        self.started()
        listener = asyncio.ensure_future(self._listen(self.extra_wakeups)) if self.extra_wakeups else None
        try:
            while not self._stopping:
                self._wake.clear()
                self.idle.clear()
                counts: dict[str, int] | None
                try:
                    counts = await self.run_pass()
                except Exception:
                    log.exception("%s pass failed", self.name)
                    counts = None
                if self._stopping:
                    break
                try:
                    delay = await self.next_delay(counts)
                except Exception:
                    log.exception("could not read the next due time")
                    delay = min(self.tick_seconds, ERROR_PAUSE_SECONDS)
                if delay <= 0:
                    continue
                self.idle.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
        finally:
            self.idle.clear()
            self.stopped()
            with contextlib.suppress(ValueError):
                self.book.on_commit.remove(self._on_commit)
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener
