"""Notifications, the worker (specs/notifications.md N11): the shared pass loop delivers them, woken at commit."""

from __future__ import annotations

import asyncio

import pytest

from statebook.lifecycle import Book
from statebook.outbox.notifications import NotificationInvalid, NotificationWorker, get_notification, send_notification
from statebook.outbox.notifications.scripted import ScriptedChannel


async def until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.01)


class NotificationWorkerCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_the_worker_delivers_a_notification_accepted_through_its_book_at_commit(self, book: Book, clock):
        """N11: an idle worker (tick 30 s) is woken by the intake's commit and delivers; a failed attempt is
        retried once its backoff has passed on the book's clock."""
        email = ScriptedChannel("email", ["reject", "success"])
        worker = NotificationWorker(book, {"email": email}, tick_seconds=30, deadline=0.05)
        task = asyncio.create_task(worker.run_until_stopped())
        try:
            await asyncio.wait_for(worker.idle.wait(), 5)
            accepted = await send_notification(book, recipient="ops", content={"text": "x"}, mode="guaranteed",
                                               channels=["email"])
            await until(lambda: email.calls == 1)
            await asyncio.wait_for(worker.idle.wait(), 5)
            assert (await get_notification(book, accepted.id)).status == "pending"
            clock.advance(1)
            worker.wake()
            await until(lambda: email.calls == 2)
            await asyncio.wait_for(worker.idle.wait(), 5)
            row = await get_notification(book, accepted.id)
            assert (row.status, row.attempts) == ("delivered", 2)
            assert worker.totals["delivered"] == 1 and worker.totals["retried"] == 1
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)

    async def test_the_worker_refuses_what_it_cannot_run(self, book: Book):
        """N3 / N11: channels must be adapters named after a known channel; the deadline must fit the lease;
        the book must be unbound."""
        with pytest.raises(NotificationInvalid, match="unknown channel"):
            NotificationWorker(book, {"fax": ScriptedChannel("fax")})
        with pytest.raises(NotificationInvalid, match="named 'email'"):
            NotificationWorker(book, {"email": ScriptedChannel("slack")})
        with pytest.raises(NotificationInvalid, match="needs a Channel"):
            NotificationWorker(book, {"email": object()})
        with pytest.raises(NotificationInvalid, match="shorter"):
            NotificationWorker(book, {}, deadline=60, lease_seconds=60)
        async with book.begin() as tx:
            with pytest.raises(NotificationInvalid, match="unbound"):
                NotificationWorker(tx, {})

    async def test_a_worker_s_writes_wake_the_other_workers_of_its_book_not_itself(self, book: Book, clock):
        """N11, N35: the delivery that starts a response wakes the idle timeout worker (tick 30 s) at commit;
        the timeout worker's pass, once the deadline passed, wakes the dispatch worker that sends the
        callback; no worker is woken by its own writes."""
        from statebook.outbox import DeliveryWorker
        from statebook.outbox.notifications import (
            CallbackTransport, ResponseTimeoutWorker, get_response, register_timeout_callback,
            unregister_timeout_callback,
        )

        calls = []

        async def page(event):
            calls.append(event)

        register_timeout_callback("wake-test", page)
        delivering = NotificationWorker(book, {"email": ScriptedChannel("email", ["success"])}, tick_seconds=30,
                                        deadline=2)
        timeouts = ResponseTimeoutWorker(book, tick_seconds=30)
        dispatches = DeliveryWorker(book, CallbackTransport(), tick_seconds=30)
        workers = [delivering, timeouts, dispatches]
        tasks = [asyncio.create_task(w.run_until_stopped()) for w in workers]
        try:
            for w in workers:
                await asyncio.wait_for(w.idle.wait(), 5)
            accepted = await send_notification(book, recipient="ops", content={"text": "x"}, mode="guaranteed",
                                               channels=["email"], response_timeout=60, timeout_callback="wake-test")
            await until(lambda: timeouts.wakeups >= 1)
            assert (await get_response(book, accepted.id)).status == "pending"
            assert delivering.wakeups == 1  # the intake only: its own delivery did not wake it
            clock.advance(60)
            timeouts.wake()  # the fake clock moved: the real sleep until the deadline is still running
            await until(lambda: calls != [])
            assert [c["notification_id"] for c in calls] == [accepted.id]
            assert timeouts.totals["timed_out"] == 1 and dispatches.wakeups >= 1
        finally:
            unregister_timeout_callback("wake-test")
            for w in workers:
                w.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
