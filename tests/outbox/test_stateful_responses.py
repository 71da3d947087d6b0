"""The response lifecycle as a Hypothesis state machine (issue 14; specs/notifications.md N31-N37).

Notifications are accepted with or without a ``response_timeout`` (and a timeout callback, registered
or not), some as followers of an owner through an ``obligation_key``; deliveries (single steps) succeed or reject;
several actors ack and dismiss (repeated, conflicting, late, on followers); a FakeClock passes
deadlines, leases and backoffs; the timeout pass (``expire_responses``, sometimes rolled back after it
enqueued its callbacks) and callback batches (whole ``deliver_due_dispatches`` passes with
``CallbackTransport``, or the outbox's single steps: scan, settle or claim, execute, finalize) interleave.
The registered callback's behaviour is scripted (ok, raise, run past its deadline, unregistered); a
claimant may crash between the claim and the finalization (its lease lapses and a later pass retries),
and any lease ever won may finalize late.

Each rule checks its own step against the snapshot before it (response_model says what should
happen); ``response_model.problems``, row == fold of facts (``replay``) and verify run after every
step; teardown checks liveness. ``HYPOTHESIS_PROFILE=deep`` runs far more; ``pytest -s`` prints how
often each interesting path ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

import statebook.outbox.dispatch.enqueue as enqueue_module
import statebook.outbox.notifications.intake as intake_module
import statebook.outbox.notifications.responses as responses_module
from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import Actor, FakeClock, verify
from statebook.lifecycle.replay import replay
from statebook.outbox import deliver_due_dispatches
from statebook.outbox.dispatch.attempts import scan
from statebook.outbox.notifications import (
    CallbackTransport, NotificationResponse, ResponseConflict, ack_notification, dismiss_notification, register_timeout_callback,
    send_notification, unregister_timeout_callback,
)
from statebook.outbox.notifications.responses import expire_responses
from statebook.outbox.notifications.calls import run_attempt
from statebook.outbox.notifications.delivery import deliver_due_notifications, scan_due
from statebook.outbox.notifications.delivery import claim as notify_claim
from statebook.outbox.notifications.delivery import finalize as notify_finalize
from statebook.outbox.notifications.scripted import ScriptedChannel
from statebook.outbox.dispatch.steps import claim, execute, finalize, release, settle

from response_model import (
    CALLBACK_TERMINAL, SEEN, TERMINAL, Snapshot, attribution, due_order, event, expected_answer, expected_expiry,
    problems, snapshot,
)

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
SETTINGS = settings(
    max_examples=300 if DEEP else 25,
    stateful_step_count=80 if DEEP else 50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FAST = 2.0
"""The channel adapter's deadline (real seconds): scripted channels answer at once."""
CUT = 0.05
"""The callback deadline (real seconds) of the machine's CallbackTransport: a "slow" callback outlives it."""
MAX_ATTEMPTS = 3
"""Callback attempts before a dead letter (the timeout pass's ``max_attempts``): small, so bounds are reached."""
MAX_NOTES = 10
LIVENESS_ROUNDS = 8
ACTORS = (Actor("operator", "alice"), Actor("operator", "bob"), Actor("oncall", "carol"))
MODES = ("ok", "ok", "fail", "fail", "slow", "unregistered")
WAITS = st.sampled_from((0.0, 0.0, 0.0, 5.0, 31.0, 60.0, 120.0))


class Page:
    """The registered host callback ``page``: records each event it is called with (by notification)
    and behaves as the machine scripts it."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls: dict[str, list[dict]] = {}

    async def __call__(self, event: dict) -> None:
        self.calls.setdefault(event["notification_id"], []).append(dict(event))
        if self.mode == "fail":
            raise ConnectionError("the pager is down")
        if self.mode == "slow":
            await asyncio.sleep(10 * CUT)


class ResponseMachine(RuleBasedStateMachine):
    url: Any = None
    backend = ""

    def __init__(self) -> None:
        super().__init__()
        # Deterministic ids: same-instant responses and callbacks are ordered by id, and replays must not diverge.
        serial = itertools.count()
        fresh = lambda: hashlib.sha256(f"rm-{next(serial)}".encode()).hexdigest()[:32]  # noqa: E731
        self._real = (intake_module.new_id, enqueue_module.new_id)
        intake_module.new_id = enqueue_module.new_id = fresh
        self.runner = asyncio.Runner()
        self.clock = FakeClock()
        try:
            self.book = self.run(self._open())
        except BaseException:
            self.restore()
            raise
        self.page = Page()
        register_timeout_callback("page", self.page)
        self.transport = CallbackTransport(timeout=CUT)
        self.recorded: dict[str, tuple] = {}  # response id -> attribution, as first seen terminal
        self.answered: list[tuple[str, int, str]] = []  # (notification, actor, target) answers recorded
        self.candidates: list = []  # a claimant's last scan
        self.held: list = []  # leases claimed and not yet finalized (a crash drops one)
        self.executed: list = []  # (lease, result) run and not yet finalized
        self.leases: list = []  # every lease ever won, for late finalizations
        self.last: Snapshot | None = None
        self.folded: dict[tuple[str, str], dict] = {}  # rows already found equal to their facts' fold
        self.verified: tuple | None = None  # the rows and facts verify last passed on
        self.sent = 0

    async def _open(self):
        book = await open_book(self.url(), clock=self.clock)
        if self.backend == "postgres":
            await reset_schema(book.engine)
        return book

    def restore(self) -> None:
        intake_module.new_id, enqueue_module.new_id = self._real

    def run(self, coro):  # noqa: ANN001
        return self.runner.run(coro)

    def snap(self) -> Snapshot:
        return self.run(snapshot(self.book))

    def before(self) -> Snapshot:
        assert self.last is not None
        return self.last

    # -- intake and delivery ---------------------------------------------------------------------

    @initialize(n=st.integers(1, 3), timeout=st.sampled_from((10.0, 30.0)), follower=st.booleans())
    def some_work(self, n, timeout, follower):
        """A few delivered notifications expecting an answer (most with the callback), and perhaps a
        follower of one of them accepted before its owner's delivery: every example has responses."""
        for i in range(n):
            self.do_send(timeout, "page" if i % 3 != 2 else None, "disk" if i == 0 else None)
        if follower:
            self.do_send(None, None, "disk")
        self.run(self.deliver_due("success"))

    @precondition(lambda self: self.sent < MAX_NOTES)
    @rule(timeout=st.sampled_from((None, 10.0, 30.0, 60.0)),
          callback=st.sampled_from(("page", "page", None, "gone")), dedup=st.sampled_from((None, None, "disk", "cpu")),
          then=st.sampled_from((None, "success", "success", "reject")))
    def send(self, timeout, callback, dedup, then):
        """A notification with or without a deadline; a callback only with one ("gone" is never registered);
        an obligation key makes it the owner of its obligation or a follower of a live owner; ``then``: a
        delivery pass right after (see deliver)."""
        self.do_send(timeout, callback if timeout is not None else None, dedup)
        if then is not None:
            self.snap_then(lambda: self.deliver(then))

    def snap_then(self, step) -> None:  # noqa: ANN001
        """Run a second step within this rule: its checks compare against the database as it is now."""
        self.last = self.snap()
        step()

    def do_send(self, timeout, callback, dedup) -> None:  # noqa: ANN001
        self.sent += 1
        self.run(send_notification(self.book, recipient="ops", content={"n": self.sent}, mode="guaranteed",
                                   channels=["email"], obligation_key=dedup, response_timeout=timeout,
                                   timeout_callback=callback))

    @rule(step=st.sampled_from(("success", "success", "reject")))
    def deliver(self, step):
        """N31, N35: a delivery pass: a first delivery starts the response (due from now); a failure is not
        silence; a delivery pass never times a response out."""
        before, now = self.before(), self.clock.now()
        self.run(self.deliver_due(step))
        after = self.snap()
        for rid, r in after.responses.items():
            old = before.responses.get(rid)
            if old is None:
                event("response started")
                assert (r["status"], r["started_at"]) == ("pending", now), r
            else:
                assert r == old, f"N35: a delivery pass changed response {rid[:8]}: {old} -> {r}"

    async def deliver_due(self, step: str) -> None:
        """A delivery pass made of the single steps (scan, then claim, attempt and finalize each in turn).
        ``deliver_due_notifications`` records outcomes beside its next claims (two connections), so on
        PostgreSQL whether a successor elected mid-pass is delivered in the same pass depends on timing:
        a machine's steps must replay alike. Liveness uses the real pass."""
        channels = {"email": ScriptedChannel("email", [step])}
        for cand in await scan_due(self.book, now=self.clock.now()):
            lease = await notify_claim(self.book, cand, now=self.clock.now())
            if lease is not None:
                result = await run_attempt(self.book, lease, channels, deadline=FAST)
                if result.outcome is not None:
                    await notify_finalize(self.book, lease, result, now=self.clock.now())

    # -- answers ---------------------------------------------------------------------------------

    @precondition(lambda self: self.last is not None and self.last.notes)
    @rule(data=st.data(), who=st.integers(0, len(ACTORS) - 1), state=st.sampled_from(("acked", "dismissed")),
          note=st.sampled_from((None, "on it")))
    def answer(self, data, who, state, note):
        nid = data.draw(st.sampled_from(sorted(self.before().notes)), label="notification")
        self.do_answer(nid, who, state, note)

    @precondition(lambda self: self.answered)
    @rule(data=st.data(), note=st.sampled_from((None, "again")))
    def answer_again(self, data, note):
        """N33: an answer recorded before, asked again by the same actor (or on a follower of the same owner)."""
        nid, who, target = data.draw(st.sampled_from(self.answered), label="answer")
        self.do_answer(nid, who, target, note)

    def do_answer(self, nid: str, who: int, target: str, note: str | None) -> None:
        """N32, N33, N34: recorded (ONE fact with the actor and the book's time), the original again
        (same answer, nothing written), or ResponseConflict with nothing written."""
        before, now, actor = self.before(), self.clock.now(), ACTORS[who]
        name = f"{actor.type}:{actor.id}"
        verdict, rid = expected_answer(before, nid, name, target, now)
        fn = ack_notification if target == "acked" else dismiss_notification
        follower = before.notes[nid]["obligation_owner_id"] not in (None, nid)
        try:
            got = self.run(fn(self.book, nid, actor=actor, note=note))
        except ResponseConflict as exc:
            event(f"answer: conflict ({rid.split(' ')[0]})" + (" (follower)" if follower else ""))
            assert verdict == "conflict", f"N33: {name} {target} {nid[:8]} was refused ({exc}); expected {verdict}"
            assert self.snap().response_view() == before.response_view(), "N33: a conflicting answer wrote"
            return
        after = self.snap()
        assert verdict != "conflict", f"N33: {name} {target} {nid[:8]} returned {got}; expected a conflict: {rid}"
        assert rid is not None and got.id == rid
        if verdict == "original":
            event("answer: the original again" + (" (follower)" if follower else ""))
            old = before.responses[rid]
            assert got == NotificationResponse.from_row(old), f"N33: a repeat returned {got}, not {old}"
            assert after.response_view() == before.response_view(), "N33: a repeated answer wrote"
            return
        event(f"answer: {target}" + (" (follower)" if follower else ""))
        assert (got.status, got.responder, got.responded_at.timestamp(), got.note) == (target, name, now, note), got
        facts = after.of("notification_response", rid)
        assert len(facts) == len(before.of("notification_response", rid)) + 1
        last = facts[-1]
        assert (last.status, last.reason_code, last.actor_type, last.actor_id, last.at) == (
            target, f"notification_response.{target}.responder", actor.type, actor.id, now)
        self.answered.append((nid, who, target))

    # -- the timeout pass ------------------------------------------------------------------------

    @rule(limit=st.sampled_from((1, 2, 100)), wait=WAITS)
    def expire(self, limit, wait=0.0):
        """N35, N36: exactly the due pending responses, by (due time, id), at most ``limit``, time out at
        now, each with ONE callback when it names one; nothing else changes. (``wait``: the clock moves
        first, so that deadlines pass even in examples that draw few ticks.)"""
        self.clock.advance(wait)
        before, now = self.before(), self.clock.now()
        expected = expected_expiry(before, now, limit)
        got = self.run(expire_responses(self.book, limit=limit, max_attempts=MAX_ATTEMPTS))
        after = self.snap()
        changed = sorted(i for i, r in after.responses.items() if r != before.responses.get(i))
        assert changed == sorted(expected), f"N35: timed out {changed}, expected {expected} (limit {limit})"
        for rid in expected:
            assert (after.responses[rid]["status"], after.responses[rid]["responded_at"]) == ("timed_out", now)
        with_callback = [i for i in expected if before.responses[i]["timeout_callback"] is not None]
        assert got == {"timed_out": len(expected), "callbacks": len(with_callback)}, (got, expected)
        new = set(after.callbacks) - set(before.callbacks)
        assert sorted(after.callbacks[c]["dedup_key"] for c in new) == sorted(f"timeout:{i}" for i in with_callback)
        event(f"expire: {len(expected)} timed out" + (" (capped)" if len(expected) == limit else ""))

    @rule(limit=st.sampled_from((1, 100)), wait=WAITS)
    def expire_again(self, limit, wait):
        """A second entry: Hypothesis picks rules uniformly, and the timeout pass is the heart of it."""
        self.expire(limit, wait)

    def due_with_callback(self) -> bool:
        return self.last is not None and any(
            r["status"] == "pending" and r["due_at"] <= self.clock.now() and r["timeout_callback"] is not None
            for r in self.last.responses.values())

    @precondition(due_with_callback)
    @rule()
    def expire_crashes(self):
        """N36: the process dies after the timeout pass enqueued its callbacks, before the commit: neither the
        timeouts nor their callbacks exist (one transaction), and a later pass does both."""
        before = self.before()
        real = responses_module.enqueue_dispatches

        async def enqueue_then_die(tx, rows):  # noqa: ANN001
            await real(tx, rows)
            raise SystemExit("the timeout worker died")

        responses_module.enqueue_dispatches = enqueue_then_die
        try:
            with pytest.raises(SystemExit):
                self.run(expire_responses(self.book, max_attempts=MAX_ATTEMPTS))
        finally:
            responses_module.enqueue_dispatches = real
        after = self.snap()
        assert (after.responses, after.callbacks) == (before.responses, before.callbacks), "N36: half a timeout"
        assert after.facts == before.facts
        event("expire: crashed before commit")

    # -- callbacks: whole batches ----------------------------------------------------------------

    @rule(mode=st.sampled_from(MODES))
    def script_callback(self, mode):
        """The host callback's behaviour from now on: it recovers when the script says ok again."""
        self.page.mode = mode

    @contextlib.contextmanager
    def scripted(self):
        """Run with the callback as scripted ("unregistered": nothing is registered as page meanwhile)."""
        if self.page.mode == "unregistered":
            unregister_timeout_callback("page")
        try:
            yield
        finally:
            register_timeout_callback("page", self.page)

    @rule(batch=st.sampled_from((1, 2, 100)), wait=WAITS)
    def callback_pass(self, batch, wait):
        """N36, N37, O11: a callback batch takes the first ``batch`` due callbacks in (due, event time, id)
        order; its failures touch callback dispatches only, never a response."""
        self.clock.advance(wait)
        before, now = self.before(), self.clock.now()
        expected = due_order(before, now)[:batch]
        with self.scripted():
            counts = self.run(deliver_due_dispatches(self.book, transport=self.transport, batch_size=batch))
        after = self.snap()
        touched = sorted(i for i in after.callbacks
                         if len(after.of("dispatch", i)) != len(before.of("dispatch", i)))
        assert touched == sorted(expected), f"N36: a batch of {batch} took {touched}, the due order is {expected}"
        assert after.responses == before.responses, "N37: a callback batch rewrote a response"
        self.forget_superseded(after)
        event(f"callback pass: {counts['delivered']} ok, {counts['retried']} retried, {counts['dead_letter']} dead")

    # -- callbacks: the outbox's single steps, with crashes --------------------------------------

    @rule(limit=st.sampled_from((1, 100)))
    def scan_callbacks(self, limit):
        """O11 / N36: a scan returns the due callbacks in (due, event time, id) order, capped."""
        before, now = self.before(), self.clock.now()
        self.candidates = self.run(scan(self.book, now=now, limit=limit))
        got, expected = [c.dispatch_id for c in self.candidates], due_order(before, now)[:limit]
        assert got == expected, f"N36/O11: the scan read {got}; by (due, event time, id) the rows say {expected}: " + ", ".join(
            f"{i[:8]}=({before.callbacks[i]['next_attempt_at']}, {before.callbacks[i]['created_at']})" for i in expected)
        if len({before.callbacks[i]["next_attempt_at"] for i in got}) < len(got):
            event("scan: a due-time tie")

    @precondition(lambda self: self.candidates)
    @rule(data=st.data())
    def claim_callback(self, data):
        """A claim (after settle, which dead-letters a lapsed last attempt) wins only while the row is
        what the scan read; a won claim uses one attempt of the bound."""
        cand = data.draw(st.sampled_from(self.candidates), label="candidate")
        self.candidates = []
        before, now = self.before(), self.clock.now()
        row = before.callbacks.get(cand.dispatch_id)
        settled = self.run(settle(self.book, cand, now=now))
        if settled is not None:
            event(f"settle: {settled}")
            assert settled == "dead_letter" and cand.exhausted, (settled, cand)
            return
        lease = self.run(claim(self.book, cand, now=now, timeout=CUT))
        fresh = row is not None and (row["status"], row["attempt"], row["next_attempt_at"]) == (
            cand.status, cand.attempt, cand.next_attempt_at) and row["attempt"] < row["max_attempts"]
        assert (lease is not None) == fresh, (lease, row, cand)
        event(f"claim: {'won' if lease else 'lost'}{' (reclaim)' if cand.status == 'delivering' else ''}")
        if lease is not None:
            self.held.append(lease)
            self.leases.append(lease)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def run_callback(self, data):
        """The transport runs outside any transaction: the host callback is called (or the lease is
        released when too little of it is left to start)."""
        lease = self.held.pop(data.draw(st.integers(0, len(self.held) - 1), label="lease"))
        with self.scripted():
            result = self.run(execute(lease, self.transport, now=self.clock.now()))
        if result is None:
            got = self.run(release(self.book, lease, now=self.clock.now()))
            event(f"callback not started: {got}")
            return
        self.executed.append((lease, result))

    @precondition(lambda self: self.executed)
    @rule(data=st.data())
    def finalize_callback(self, data):
        lease, result = self.executed.pop(data.draw(st.integers(0, len(self.executed) - 1), label="lease"))
        self.check_finalize(lease, result)

    @precondition(lambda self: self.held or self.executed)
    @rule(data=st.data(), after_run=st.booleans())
    def crash(self, data, after_run):
        """The dispatch worker dies between the claim and the finalization (before or after the callback
        ran): the lease lapses and a later pass retries, or settles a lapsed last attempt as dead."""
        pool = self.executed if after_run and self.executed else self.held or self.executed
        pool.pop(data.draw(st.integers(0, len(pool) - 1), label="crashing"))
        event("crash after the callback ran" if pool is self.executed else "crash before the callback ran")

    @rule(data=st.data())
    def advance_callback(self, data):
        """The next single step of the callback claimant, whatever it holds: finalize, run, claim or scan."""
        if self.executed:
            self.finalize_callback(data)
        elif self.held:
            self.run_callback(data)
        elif self.candidates:
            self.claim_callback(data)
        else:
            self.scan_callbacks(100)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), ok=st.booleans())
    def late_finalize(self, data, ok):
        """O8: a finalization with any lease ever won, however late: only the row's current claim settles."""
        from statebook.outbox import TransportResult

        lease = data.draw(st.sampled_from(self.leases), label="lease")
        self.check_finalize(lease, TransportResult(True) if ok else TransportResult.failed("late"))

    def check_finalize(self, lease, result) -> None:  # noqa: ANN001
        before, now = self.before(), self.clock.now()
        row = before.callbacks[lease.dispatch_id]
        current = row["status"] == "delivering" and row["claim_id"] == lease.claim_id
        got = self.run(finalize(self.book, lease, result, now=now))
        after = self.snap()
        assert after.responses == before.responses, "N37: a callback outcome rewrote a response"
        if not current:
            event("late finalize: conflict")
            assert got == "conflict", (got, row, lease)
            assert after.callbacks[lease.dispatch_id] == row
            return
        expected = "delivered" if result.ok else "dead_letter" if lease.attempt >= lease.max_attempts else "retried"
        assert got == expected, (got, expected, lease)
        event(f"finalize: {got}")

    def forget_superseded(self, snap: Snapshot) -> None:
        """Held leases whose row a pass reclaimed or settled stay only as late finalizations."""
        self.held = [h for h in self.held if snap.callbacks[h.dispatch_id]["claim_id"] == h.claim_id]

    @rule(seconds=st.sampled_from((1.0, 5.0, 16.0, 30.0, 60.0, 61.0, 120.0, 1900.0)))
    def tick(self, seconds):
        """Time passes: deadlines, leases (15 s, or 5.05 s for a pass's) and backoffs (60 s, 120 s:
        a retry can fall due at the very instant a fresh timeout enqueues its callback)."""
        self.clock.advance(seconds)
        event("tick")

    # -- invariants and liveness -----------------------------------------------------------------

    @invariant()
    def response_invariants(self):
        """N31-N37 (response_model.problems); row == fold of facts for every response and callback; verify."""
        snap = self.snap()
        found = problems(snap, self.recorded, self.page.calls, MAX_ATTEMPTS)
        assert not found, "\n".join(found)
        for rid, r in snap.responses.items():
            if r["status"] in TERMINAL:
                self.recorded.setdefault(rid, attribution(r))
        # A row already found equal to its facts' fold is replayed again only once it changes; verify (every fact
        # and row of both types) runs again only once the rows or the facts it reads changed (the snapshot holds
        # every response, every dispatch, which here are all callbacks, and all their facts).
        for entity_type, rows in (("notification_response", snap.responses), ("dispatch", snap.callbacks)):
            for eid, row in rows.items():
                if self.folded.get((entity_type, eid)) != row:
                    assert self.run(replay(self.book, entity_type, eid)) == row, \
                        f"L7: {entity_type} {eid[:8]} != fold"
                    self.folded[(entity_type, eid)] = row
        state = (snap.responses, snap.callbacks, snap.facts)
        if state != self.verified:
            for entity_type in ("notification_response", "dispatch"):
                report = self.run(verify(self.book, entity_type))
                assert report.ok, report.findings
            self.verified = state
        self.last = snap

    def teardown(self):
        try:
            if sys.exc_info()[0] is None:
                self.check_liveness()
        finally:
            self.restore()
            unregister_timeout_callback("page")
            self.run(self.book.engine.dispose())
            self.runner.close()

    def check_liveness(self):
        """With crashes over and the callback recovered, passes bring every delivered response to a
        terminal state and every callback to delivered or (its bound spent) dead_letter."""
        self.held, self.executed, self.candidates = [], [], []
        self.page.mode = "ok"
        for _ in range(LIVENESS_ROUNDS):
            self.clock.advance(1900.0)
            self.run(deliver_due_notifications(self.book, {"email": ScriptedChannel("email", ["success"])},
                                               deadline=FAST))
            self.run(expire_responses(self.book, max_attempts=MAX_ATTEMPTS))
            self.run(deliver_due_dispatches(self.book, transport=self.transport))
            self.response_invariants()
            snap = self.last
            if all(r["status"] in TERMINAL for r in snap.responses.values()) and all(
                    c["status"] in CALLBACK_TERMINAL for c in snap.callbacks.values()):
                break
        stuck = {i[:8]: r["status"] for i, r in snap.responses.items() if r["status"] not in TERMINAL}
        stuck |= {i[:8]: (c["status"], c["attempt"]) for i, c in snap.callbacks.items()
                  if c["status"] not in CALLBACK_TERMINAL}
        assert not stuck, f"liveness: not settled after {LIVENESS_ROUNDS} rounds: {stuck}"
        for cb in snap.callbacks.values():
            event(f"liveness: callback {cb['status']}")
        assert self.run(verify(self.book)).ok


def machine_for(backend: str, url_factory) -> type[ResponseMachine]:  # noqa: ANN001
    return type(f"ResponseMachine_{backend}", (ResponseMachine,), {"url": staticmethod(url_factory), "backend": backend})


def test_response_state_machine_sqlite(tmp_path_factory):
    """N31-N37 under interleaved deliveries, answers, timeout passes, callback batches and steps, crashes
    and clock jumps, on SQLite."""
    SEEN.clear()
    run_state_machine_as_test(
        machine_for("sqlite", lambda: f"sqlite:///{tmp_path_factory.mktemp('response_sm') / 'sm.db'}"),
        settings=SETTINGS)
    print("\nsqlite paths:", dict(sorted(SEEN.items())))


@pytest.mark.postgres
def test_response_state_machine_postgres(pg_url):
    """The same machine on PostgreSQL (schema reset per example)."""
    SEEN.clear()
    run_state_machine_as_test(machine_for("postgres", lambda: pg_url), settings=SETTINGS)
    print("\npostgres paths:", dict(sorted(SEEN.items())))
