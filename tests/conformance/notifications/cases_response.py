"""Notifications, the response lifecycle (specs/notifications.md N31-N39): acknowledge, dismiss, time out,
and the timeout's durable host callback on the dispatch outbox."""

from __future__ import annotations

import asyncio

import pytest

from statebook.lifecycle import Actor, Book, history, verify
from statebook.outbox import deliver_due_dispatches
from statebook.outbox.notifications import (
    CallbackTransport, NotificationInvalid, ResponseConflict, ack_notification, dismiss_notification,
    get_notification, get_response, register_timeout_callback, send_notification, timeout_callbacks,
    unregister_timeout_callback,
)
from statebook.outbox.notifications.responses import expire_responses
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.scripted import ScriptedChannel

FAST = 2.0
"""The adapter deadline of these passes (real seconds): their scripted channels answer at once, so it only
has to be long enough on a loaded machine."""
ALICE, BOB = Actor("operator", "alice"), Actor("operator", "bob")


async def send(book: Book, text: str = "disk full", **kwargs):
    kwargs.setdefault("mode", "guaranteed")
    kwargs.setdefault("channels", ["email"])
    return await send_notification(book, recipient="ops", content={"text": text}, **kwargs)


async def deliver(book: Book, step: str = "success") -> dict[str, int]:
    return await deliver_due_notifications(book, {"email": ScriptedChannel("email", [step])}, deadline=FAST)


async def facts(book: Book, nid: str) -> int:
    return len(await history(book, "notification_response", nid))


class Calls:
    """A registered async callback that records its events and fails the first ``fail`` calls."""

    def __init__(self, name: str, fail: int = 0) -> None:
        self.name, self.fail, self.events = name, fail, []

    async def __call__(self, event):
        self.events.append(event)
        if len(self.events) <= self.fail:
            raise ConnectionError("the pager is down")

    def __enter__(self):
        register_timeout_callback(self.name, self)
        return self

    def __exit__(self, *exc):
        unregister_timeout_callback(self.name)


class NotificationResponseCases:
    """Mixed into NotificationConformance, so each backend runs them (tests/conformance)."""

    async def test_the_deadline_starts_at_the_first_delivery_and_an_undelivered_one_never_times_out(
            self, book: Book, clock):
        """N31: no response before delivery (however late it is); the deadline counts from the delivery;
        a failed delivery is not human silence."""
        late = (await send(book, response_timeout=60)).id
        never = (await send(book, "never", response_timeout=60, channels=["slack"])).id
        await deliver_due_notifications(book, {"slack": ScriptedChannel("slack", ["reject"])}, deadline=FAST)
        clock.advance(3600)
        assert await expire_responses(book) == {"timed_out": 0, "callbacks": 0}
        assert await get_response(book, late) is None
        delivered_at = clock.now()
        await deliver(book)
        response = await get_response(book, late)
        assert (response.status, response.started_at.timestamp(), response.due_at.timestamp()) == ("pending", delivered_at, delivered_at + 60)
        for _ in range(2):  # the other one exhausts its cycle: failed, never a response
            clock.advance(10)
            await deliver_due_notifications(book, {"slack": ScriptedChannel("slack", ["reject"])}, deadline=FAST)
        assert (await get_notification(book, never)).status == "failed"
        clock.advance(response.due_at.timestamp() - 1 - clock.now())
        assert (await expire_responses(book))["timed_out"] == 0
        clock.advance(1)
        assert (await expire_responses(book))["timed_out"] == 1
        assert await get_response(book, never) is None

    async def test_answers_are_atomic_attributed_and_audited(self, book: Book, clock):
        """N32: pending -> acked | dismissed | timed_out, each one fact with the actor and the book's time."""
        acked, dismissed, silent = [(await send(book, t, response_timeout=60)).id for t in ("a", "d", "s")]
        await deliver(book)
        clock.advance(5)
        a = await ack_notification(book, acked, actor=ALICE, note="on it")
        d = await dismiss_notification(book, dismissed, actor=BOB)
        assert (a.status, a.responder, a.responded_at.timestamp(), a.note) == ("acked", "operator:alice", clock.now(), "on it")
        assert (d.status, d.responder) == ("dismissed", "operator:bob")
        clock.advance(60)
        await expire_responses(book)
        s = await get_response(book, silent)
        assert (s.status, s.responder, s.responded_at.timestamp()) == ("timed_out", None, clock.now())
        last = (await history(book, "notification_response", acked))[-1]
        assert (last.reason_code, last.actor_type, last.actor_id, last.at) == (
            "notification_response.acked.responder", "operator", "alice", a.responded_at.timestamp())
        for entity_type in ("notification_response", "notification"):
            assert (await verify(book, entity_type)).ok

    async def test_a_repeated_answer_is_the_original_and_a_conflicting_one_changes_nothing(self, book: Book, clock):
        """N33: the same actor asking again for the same state gets the original (same time, no new fact);
        another actor, another terminal state, or a first answer after the deadline is a conflict that
        never overwrites the recorded attribution."""
        nid = (await send(book, response_timeout=60)).id
        await deliver(book)
        first = await ack_notification(book, nid, actor=ALICE)
        clock.advance(5)
        before = await facts(book, nid)
        assert await ack_notification(book, nid, actor=ALICE) == first
        assert await facts(book, nid) == before
        with pytest.raises(ResponseConflict) as caught:
            await ack_notification(book, nid, actor=BOB)
        assert caught.value.recorded.responder == "operator:alice"
        with pytest.raises(ResponseConflict):
            await dismiss_notification(book, nid, actor=ALICE)
        assert await get_response(book, nid) == first and await facts(book, nid) == before
        late = (await send(book, "late", response_timeout=60)).id
        await deliver(book)
        clock.advance(61)
        with pytest.raises(ResponseConflict, match="due at"):
            await ack_notification(book, late, actor=ALICE)
        with pytest.raises(ResponseConflict, match="not waiting"):
            await ack_notification(book, (await send(book, "no response expected")).id, actor=ALICE)

    async def test_followers_read_and_answer_their_owner_s_response(self, book: Book):
        """N34: a follower has no response of its own: reads give it its owner's (ack_inherited), and an
        answer to it answers the owner."""
        owner = (await send(book, obligation_key="disk", response_timeout=60)).id
        follower = (await send(book, "again", obligation_key="disk", response_timeout=60)).id
        await deliver(book)
        o, f = await get_notification(book, owner), await get_notification(book, follower)
        assert (o.effective_ack_status, o.ack_inherited) == ("pending", False)
        assert (f.status, f.effective_ack_status, f.ack_inherited) == ("deduplicated", "pending", True)
        await ack_notification(book, follower, actor=ALICE)
        assert (await get_response(book, owner)).status == "acked"
        f = await get_notification(book, follower)
        assert (f.effective_ack_status, f.ack_inherited) == ("acked", True)

    async def test_the_timeout_pass_is_its_own_and_orders_by_deadline_then_id(self, book: Book, clock):
        """N35: delivery passes never time responses out; the timeout pass takes due responses by
        (due time, id), at most its limit, each once."""
        ids = [(await send(book, str(n), response_timeout=60 + (n % 2) * 10)).id for n in range(6)]
        await deliver(book)
        clock.advance(3600)
        await deliver(book)  # a delivery pass: nothing times out
        assert [(await get_response(book, i)).status for i in ids] == ["pending"] * len(ids)
        rows = [await get_response(book, i) for i in ids]
        order = [r.id for r in sorted(rows, key=lambda r: (r.due_at.timestamp(), r.id))]
        assert (await expire_responses(book, limit=4))["timed_out"] == 4
        timed = {i for i in ids if (await get_response(book, i)).status == "timed_out"}
        assert timed == set(order[:4])
        assert (await expire_responses(book, limit=4))["timed_out"] == 2
        assert (await expire_responses(book, limit=4))["timed_out"] == 0

    async def test_each_timeout_has_one_durable_bounded_callback(self, book: Book, clock):
        """N36: the timeout enqueues exactly one callback obligation in its transaction, due at the timeout's
        time; it carries the event id (the timeout's fact); a failing callback is retried with backoff and
        dead-lettered at its bound; the recipient sees the same event id on every attempt."""
        with Calls("page", fail=99) as calls:
            nid = (await send(book, response_timeout=60, timeout_callback="page")).id
            await deliver(book)
            clock.advance(60)
            await expire_responses(book)
            await expire_responses(book)  # a second pass adds nothing
            [cb] = await timeout_callbacks(book, nid)
            timeout_fact = (await history(book, "notification_response", nid))[-1]
            assert (cb.status, cb.next_attempt_at.timestamp(), cb.deliver_to) == ("pending", clock.now(), "callback:page")
            for _ in range(20):
                await deliver_due_dispatches(book, transport=CallbackTransport())
                [cb] = await timeout_callbacks(book, nid)
                if cb.status == "dead_letter":
                    break
                assert cb.next_attempt_at.timestamp() > clock.now()  # a retry waits for its backoff
                clock.advance(cb.next_attempt_at.timestamp() - clock.now())
            assert cb.status == "dead_letter" and cb.attempt == cb.max_attempts == len(calls.events)
            assert {e["event_id"] for e in calls.events} == {timeout_fact.id}
            assert calls.events[0]["notification_id"] == nid

    async def test_a_failing_callback_never_rewrites_the_response(self, book: Book, clock):
        """N37: the callback fails, is retried, then succeeds: the response stays timed_out with its
        original time and version throughout."""
        with Calls("page", fail=2) as calls:
            nid = (await send(book, response_timeout=60, timeout_callback="page")).id
            await deliver(book)
            clock.advance(60)
            await expire_responses(book)
            recorded = await get_response(book, nid)
            for _ in range(5):
                await deliver_due_dispatches(book, transport=CallbackTransport())
                assert await get_response(book, nid) == recorded
                clock.advance(3600)
            [cb] = await timeout_callbacks(book, nid)
            assert (cb.status, len(calls.events)) == ("delivered", 3)

    async def test_only_async_callbacks_are_registered(self):
        """N38: a blocking callable is refused at registration; an async def (or an object with an async
        __call__) is accepted."""
        def blocking(event):
            return None

        for bad in (blocking, print, lambda e: None, "page"):
            with pytest.raises(NotificationInvalid):
                register_timeout_callback("bad", bad)

        async def fine(event):
            return None

        register_timeout_callback("fine", fine)
        register_timeout_callback("calls", Calls("calls"))
        unregister_timeout_callback("fine")
        unregister_timeout_callback("calls")

    async def test_response_times_come_from_the_injected_clock(self, book: Book, clock):
        """N39: started_at, due_at, responded_at and the callback's due time are the book's clock."""
        nid = (await send(book, response_timeout=30, timeout_callback="page")).id
        clock.advance(1234)
        await deliver(book)
        r = await get_response(book, nid)
        assert (r.started_at.timestamp(), r.due_at.timestamp()) == (clock.now(), clock.now() + 30)
        clock.advance(30)
        await expire_responses(book)
        assert (await get_response(book, nid)).responded_at.timestamp() == clock.now()
        [cb] = await timeout_callbacks(book, nid)
        assert cb.created_at.timestamp() == cb.next_attempt_at.timestamp() == clock.now()

    async def test_bad_response_arguments_are_refused(self, book: Book):
        """N31: response_timeout must be positive seconds; a callback needs a timeout."""
        for bad in ({"response_timeout": 0}, {"response_timeout": -1}, {"response_timeout": True},
                    {"response_timeout": "60"}, {"timeout_callback": "page"}, {"response_timeout": 60, "timeout_callback": ""}):
            with pytest.raises(NotificationInvalid):
                await send(book, **bad)

    async def test_racing_answers_record_one(self, book: Book, db_url, clock):
        """N33: two actors answering at once on separate connections: one answer is recorded, the other
        is a conflict; the attribution is the winner's."""
        from statebook.adapters.db import connect

        nid = (await send(book, response_timeout=60)).id
        await deliver(book)
        books = [Book(connect(db_url), book.registry, clock) for _ in range(2)]
        try:
            got = await asyncio.gather(ack_notification(books[0], nid, actor=ALICE),
                                       dismiss_notification(books[1], nid, actor=BOB), return_exceptions=True)
        finally:
            for b in books:
                await b.engine.dispose()
        won = [g for g in got if not isinstance(g, BaseException)]
        assert len(won) == 1 and all(isinstance(g, ResponseConflict) for g in got if isinstance(g, BaseException)), got
        assert (await get_response(book, nid)).responder == won[0].responder
