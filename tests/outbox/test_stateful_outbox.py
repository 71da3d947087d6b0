"""The outbox as a Hypothesis state machine: producers, step-by-step claimants, consumers, operators.

Three claimants advance deliveries one step per rule (scan, settle+claim, run the transport,
finalize) in any interleaving with each other, with whole ``deliver_due_dispatches`` passes, acks,
operator retries, expedites and purges, and jumps of a FakeClock. A claimant may crash between any two steps
(it forgets what it held); a claim or finalization may commit while its claimant is told it failed
("ambiguous": it then behaves as crashed) or roll back inside its transaction ("aborted"). Every
lease ever won stays drawable, so stale "zombie" finalizations come late and must be refused.

Each rule checks its own step against the row it acted on (outbox_model says what should happen);
``outbox_model.problems`` runs after every step; teardown checks liveness (O20). SQLite gets a fresh
file per example, PostgreSQL a reset schema. ``HYPOTHESIS_PROFILE=deep`` runs far more and longer
examples; ``pytest -s`` prints how often each interesting path ran.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, initialize, invariant, multiple, precondition, rule, run_state_machine_as_test,
)

from profiles import examples
import statebook.outbox.dispatch.enqueue as enqueue_module
from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import Actor, EntityNotFound, FakeClock, TransitionRejected, verify
from statebook.lifecycle.replay import read_row
from statebook.outbox import (
    AckRejected,
    CallableTransport,
    TransportResult,
    ack_dispatch,
    deliver_due_dispatches,
    enqueue_dispatch,
    expedite_dispatch,
    purge_dispatch,
    retry_dispatch,
)
from statebook.outbox.dispatch.attempts import CLAIM_LEASE_SECONDS, backoff_seconds, scan
from statebook.outbox.dispatch.steps import claim, execute, finalize, release, settle

from outbox_model import (
    LIVE, SEEN, TERMINAL, Claimant, Held, Runs, Snapshot, claim_keys, claimable, epoch_of, event, expected_finalize,
    expected_settle, problems, scripted, snapshot,
)

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
SETTINGS = settings(
    max_examples=examples(40),  # deep: 400
    stateful_step_count=80 if DEEP else 50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CLAIMANTS = 3
LIVENESS_ROUNDS = 8  # max_attempts <= 4, so a handful of passes must settle everything
OUTCOMES = st.sampled_from(("ok", "fail", "timeout", "raise"))
MODES = st.sampled_from(("normal", "normal", "normal", "ambiguous", "aborted"))
LIMITS = st.sampled_from((1, 2, 100))


class Told(Exception):
    """The claimant is told its step failed (whether or not the transaction committed)."""


class OutboxMachine(RuleBasedStateMachine):
    url: Any = None
    backend = ""

    dispatches = Bundle("dispatches")
    leases = Bundle("leases")  # never consumed: every lease stays drawable for zombie finalizations

    def __init__(self) -> None:
        super().__init__()
        # Ids decide the scan order of rows due at the same instant; random ids would make replays
        # (and so shrinking) diverge, so this machine's dispatch ids are a deterministic sequence.
        assert callable(getattr(enqueue_module, "new_id", None)), "enqueue no longer draws ids via new_id"
        serial = itertools.count()
        self._real_new_id = enqueue_module.new_id
        enqueue_module.new_id = lambda: hashlib.sha256(f"sm-{next(serial)}".encode()).hexdigest()[:32]
        self.runner = asyncio.Runner()
        self.clock = FakeClock()
        try:
            self.book = self.run(self._open())
        except BaseException:
            enqueue_module.new_id = self._real_new_id
            self.runner.close()
            raise
        self.claimants = [Claimant() for _ in range(CLAIMANTS)]
        self.runs = Runs()
        self.tokens: dict[str, str | None] = {}
        self.dedup: dict[str, str] = {}  # live dedup key -> id
        self.all_held: list[Held] = []  # the leases bundle, as a list the preconditions can read
        self.last: Snapshot | None = None  # the database after the previous step
        self.steps = 0

    async def _open(self):
        book = await open_book(self.url(), clock=self.clock)
        if self.backend == "postgres":
            await reset_schema(book.engine)
        return book

    def run(self, coro):
        return self.runner.run(coro)

    def snap(self) -> Snapshot:
        return self.run(snapshot(self.book))

    def before(self) -> Snapshot:
        """The database as the invariant check read it right after the previous step."""
        assert self.last is not None
        return self.last

    def pick(self, data, phase: str) -> Claimant:
        ready = [c for c in self.claimants if c.phase == phase]
        return ready[data.draw(st.integers(0, len(ready) - 1), label="claimant")]

    def unchanged(self, before: Snapshot, did: str, what: str) -> None:
        after = self.snap()
        assert after.rows.get(did) == before.rows.get(did), f"{what} changed row {did}"
        assert after.fact_count(did) == before.fact_count(did), f"{what} wrote a fact for {did}"

    def in_mode(self, mode: str, step):  # noqa: ANN001
        """Run ``step(book)`` normally, committed-but-reported-failed, or rolled back."""
        if mode == "normal":
            return self.run(step(self.book))
        box: list[Any] = []

        async def wrapped():
            async with self.book.begin() as tx:
                box.append(await step(tx))
                if mode == "aborted":
                    raise Told
            raise Told  # committed, but the claimant hears of a failure

        with pytest.raises(Told):
            self.run(wrapped())
        return box[0] if box else None

    # -- producers -----------------------------------------------------------------------------

    def new_dispatch(self, **kwargs) -> str:
        did = self.run(enqueue_dispatch(self.book, kind="sm", deliver_to="seat", **kwargs))
        self.tokens.setdefault(did, self.run(read_row(self.book, "dispatch", did))["ack_token"])
        return did

    @initialize(target=dispatches, n=st.integers(1, 4), ack=st.booleans(), max_attempts=st.integers(1, 4))
    def some_work(self, n, ack, max_attempts):
        """A few dispatches up front, so claimants have work even when swarm testing disables enqueue."""
        return multiple(*(self.new_dispatch(ack_required=ack and i % 2 == 0, max_attempts=max_attempts)
                          for i in range(n)))

    @rule(target=dispatches, dedup=st.sampled_from([None, None, "k1", "k2"]), ack=st.booleans(),
          max_attempts=st.integers(1, 4), ttl=st.sampled_from([None, None, 1.0, 20.0, 100.0, 4000.0]),
          rolled_back=st.sampled_from([False] * 5 + [True]))
    def enqueue(self, dedup, ack, max_attempts, ttl, rolled_back):
        """O2, O3: a new row is pending, attempt 0, due now, with one creation fact; a dedup hit
        returns the live row's id and writes nothing; an enqueue in a caller's transaction that
        rolls back leaves nothing."""
        before, now = self.before(), self.clock.now()
        if rolled_back:
            async def step():
                async with self.book.begin() as tx:
                    await enqueue_dispatch(tx, kind="sm", deliver_to="seat", dedup_key=dedup)
                    raise Told

            with pytest.raises(Told):
                self.run(step())
            after = self.snap()
            assert after.rows == before.rows and len(after.facts) == len(before.facts)
            return multiple()
        did = self.new_dispatch(dedup_key=dedup, ack_required=ack, max_attempts=max_attempts,
                                expires_at=None if ttl is None else now + ttl)
        after = self.snap()
        if dedup in self.dedup:
            assert did == self.dedup[dedup]
            assert after.rows == before.rows and len(after.facts) == len(before.facts)
            return did
        row = after.rows[did]
        assert (row["status"], row["attempt"], row["next_attempt_at"]) == ("pending", 0, now)
        assert after.fact_count(did) == 1 and did not in before.facts
        assert (row["ack_token"] is not None) == ack
        if dedup is not None:
            self.dedup[dedup] = did
        return did

    # -- claimants, one step at a time -----------------------------------------------------------

    @precondition(lambda self: any(c.phase == "idle" for c in self.claimants))
    @rule(data=st.data(), limit=LIMITS)
    def scan_due(self, data, limit):
        self.do_scan(self.pick(data, "idle"), limit)

    def do_scan(self, c: Claimant, limit: int) -> None:
        """O11: exactly the due pending/delivering rows, ordered by (next_attempt_at, created_at, id), capped."""
        now, rows = self.clock.now(), self.before().rows
        c.candidates = self.run(scan(self.book, now=now, limit=limit))
        due = sorted((r["next_attempt_at"], r["created_at"], i) for i, r in rows.items()
                     if r["status"] in LIVE and r["next_attempt_at"] <= now)
        assert [x.dispatch_id for x in c.candidates] == [i for _, _, i in due[:limit]]
        c.phase = "scanned" if c.candidates else "idle"

    @precondition(lambda self: any(c.phase == "scanned" for c in self.claimants))
    @rule(target=leases, data=st.data(), settle_first=st.booleans(), mode=MODES)
    def claim_one(self, data, settle_first, mode):
        return self.do_claim(self.pick(data, "scanned"), data, settle_first, mode)

    def do_claim(self, c: Claimant, data, settle_first: bool, mode: str):  # noqa: ANN001
        """O5, O6, O9: settle finishes an expired or exhausted candidate; a claim wins only when
        the row is still what the scan read, due, unexpired and unexhausted (claim checks this
        itself when settle is skipped); it bumps the attempt by one and sets the lease as due time."""
        cand = c.candidates[data.draw(st.integers(0, len(c.candidates) - 1), label="candidate")]
        c.forget()
        did, now = cand.dispatch_id, self.clock.now()
        before = self.before()
        row = before.rows.get(did)
        if settle_first:
            settled = self.run(settle(self.book, cand, now=now))
            assert settled == expected_settle(row, cand, now), (settled, row, cand)
            event(f"settle: {settled}")
            if settled is not None:
                assert self.snap().rows[did]["status"] == settled
                return multiple()
            self.unchanged(before, did, "a settle that did nothing")
        lease = self.in_mode(mode, lambda b: claim(b, cand, now=now))
        if mode == "aborted":
            self.unchanged(before, did, "a rolled-back claim")
            return multiple()
        assert (lease is not None) == claimable(row, cand, now), (lease, row, cand, now)
        event(f"claim {mode}: {'won' if lease else 'lost'}{' (reclaim)' if cand.status == 'delivering' else ''}")
        if lease is None:
            self.unchanged(before, did, "a lost claim")
            return multiple()
        after = self.snap()
        new = after.rows[did]
        assert lease.attempt == row["attempt"] + 1 <= row["max_attempts"]
        assert (new["status"], new["attempt"]) == ("delivering", lease.attempt)
        assert new["next_attempt_at"] == lease.lease_until == now + CLAIM_LEASE_SECONDS
        held = Held(lease, epoch_of(after.facts[did]))
        assert claim_keys(after.facts[did])[-1] == held.key
        self.all_held.append(held)
        if mode == "normal":
            c.phase, c.held = "claimed", held
        return multiple(held)

    @precondition(lambda self: any(c.phase == "claimed" for c in self.claimants))
    @rule(data=st.data(), outcome=OUTCOMES)
    def run_transport(self, data, outcome):
        self.do_execute(self.pick(data, "claimed"), outcome)

    def do_execute(self, c: Claimant, outcome: str) -> None:
        """O5: the transport runs once per won claim; a raise or a timeout is a failed result."""
        held = c.held
        assert held is not None
        transport = scripted(outcome, lambda: self.runs.record(held.lease.dispatch_id, held.key))
        c.result = self.run(execute(held.lease, transport))
        assert c.result.ok == (outcome == "ok") and (c.result.ok or c.result.error)
        c.phase = "executed"

    @precondition(lambda self: any(c.phase == "executed" for c in self.claimants))
    @rule(data=st.data(), mode=MODES)
    def finalize_one(self, data, mode):
        c = self.pick(data, "executed")
        held, result = c.held, c.result
        c.forget()
        self.check_finalize(held, result, mode)

    @precondition(lambda self: any(c.phase == "claimed" for c in self.claimants))
    @rule(data=st.data(), mode=MODES)
    def skip_and_release(self, data, mode):
        """O21: a claimant's start check finds too little of its lease left; it releases the lease
        instead of sending."""
        c = self.pick(data, "claimed")
        held = c.held
        assert held is not None
        c.forget()
        self.check_release(held, mode)

    @precondition(lambda self: self.superseded())
    @rule(data=st.data(), mode=MODES)
    def superseded_release(self, data, mode):
        """O8, O21: a zombie's release must not hand back the live claim — after a reclaim, or under the
        same attempt number after a release or an operator retry."""
        self.check_release(data.draw(st.sampled_from(self.superseded()), label="lease"), mode)

    def check_release(self, held: Held, mode: str) -> None:
        """O21, O8: only the row's current claim is released — ONE transition to pending with the attempt
        given back and due now; any other lease gets "conflict" and writes nothing."""
        lease, did, now = held.lease, held.lease.dispatch_id, self.clock.now()
        before = self.before()
        row = before.rows.get(did)
        current = row is not None and row["status"] == "delivering" and claim_keys(before.facts[did])[-1] == held.key
        got = self.in_mode(mode, lambda b: release(b, lease, now=now))
        if mode == "aborted":
            self.unchanged(before, did, "a rolled-back release")
            return
        if not current:
            event("stale release")
            assert got == "conflict", (got, held, row)
            self.unchanged(before, did, "a stale release")
            return
        event(f"release {mode}")
        assert got == "released", (got, held, row)
        after = self.snap()
        new = after.rows[did]
        assert after.fact_count(did) == before.fact_count(did) + 1
        assert (new["status"], new["attempt"], new["next_attempt_at"]) == ("pending", lease.attempt - 1, now)
        assert after.facts[did][-1].reason_code == "dispatch.pending.released"

    @rule(target=leases, data=st.data())
    def advance(self, data):
        """The next step of any one claimant, whatever its phase."""
        c = self.claimants[data.draw(st.integers(0, CLAIMANTS - 1), label="claimant")]
        if c.phase == "idle":
            self.do_scan(c, data.draw(LIMITS, label="limit"))
        elif c.phase == "scanned":
            settle_first = data.draw(st.booleans(), label="settle_first")
            return self.do_claim(c, data, settle_first, data.draw(MODES, label="mode"))
        elif c.phase == "claimed":
            self.do_execute(c, data.draw(OUTCOMES, label="outcome"))
        else:
            held, result = c.held, c.result
            c.forget()
            self.check_finalize(held, result, data.draw(MODES, label="mode"))
        return multiple()

    @rule(target=leases, data=st.data())
    def advance_again(self, data):
        """Hypothesis picks rules uniformly: a second entry gives claimant steps more weight."""
        return self.advance(data)

    @precondition(lambda self: any(c.phase != "idle" for c in self.claimants))
    @rule(data=st.data())
    def crash(self, data):
        """A claimant dies between two steps: it forgets what it held; the database keeps it."""
        busy = [c for c in self.claimants if c.phase != "idle"]
        busy[data.draw(st.integers(0, len(busy) - 1), label="crashing")].forget()

    @rule(held=leases, outcome=OUTCOMES, mode=MODES)
    def zombie_finalize(self, held, outcome, mode):
        """O8: a finalization with any lease ever won, however late."""
        result = TransportResult(True) if outcome == "ok" else TransportResult(False, f"zombie {outcome}")
        self.check_finalize(held, result, mode)

    def superseded(self) -> list[Held]:
        """Leases whose row is delivering again under a later claim: the dangerous zombies."""
        snap = self.last
        if snap is None:
            return []
        return [h for h in self.all_held
                if (snap.rows.get(h.lease.dispatch_id) or {}).get("status") == "delivering"
                and claim_keys(snap.facts[h.lease.dispatch_id])[-1] != h.key]

    @precondition(lambda self: self.superseded())
    @rule(data=st.data(), outcome=OUTCOMES, mode=MODES)
    def superseded_finalize(self, data, outcome, mode):
        """O8: a zombie whose row is delivering under a reclaim, or under the same attempt number
        after an operator retry (ABA), must not settle the live claim."""
        self.zombie_finalize(data.draw(st.sampled_from(self.superseded()), label="lease"), outcome, mode)

    @precondition(lambda self: self.superseded())
    @rule(data=st.data(), outcome=OUTCOMES, mode=MODES)
    def superseded_finalize_again(self, data, outcome, mode):
        """A second entry: the window in which such a zombie exists is short."""
        self.superseded_finalize(data, outcome, mode)

    def check_finalize(self, held: Held, result: TransportResult, mode: str) -> None:
        """O7, O8, O9, O10: only the row's current claim settles it, with ONE transition from
        delivering carrying status, attempt, due time (now + backoff when pending again) and
        last_error together; any other lease gets "conflict" and writes nothing."""
        lease, did, now = held.lease, held.lease.dispatch_id, self.clock.now()
        before = self.before()
        row = before.rows.get(did)
        current = row is not None and row["status"] == "delivering" and claim_keys(before.facts[did])[-1] == held.key
        got = self.in_mode(mode, lambda b: finalize(b, lease, result, now=now))
        if mode == "aborted":
            self.unchanged(before, did, "a rolled-back finalization")
            return
        if not current:
            live = row is not None and row["status"] == "delivering"
            aba = live and row["attempt"] == lease.attempt  # same attempt number, earlier epoch
            event(f"stale finalize{' under a live claim' if live else ''}{' (ABA)' if aba else ''}")
            assert got == "conflict", (got, held, row)
            self.unchanged(before, did, "a stale finalization")
            return
        returned, status = expected_finalize(lease, result)
        event(f"finalize {mode}: {returned}")
        assert got == returned, (got, returned)
        after = self.snap()
        new = after.rows[did]
        assert after.fact_count(did) == before.fact_count(did) + 1
        assert (new["status"], new["attempt"]) == (status, lease.attempt)
        if status == "pending":
            assert new["next_attempt_at"] == now + backoff_seconds(lease.attempt)
        if not result.ok:
            assert new["last_error"] == result.error

    # -- whole passes, consumers, operators, time --------------------------------------------------

    @precondition(lambda self: self.steps % 5 == 0)  # a pass settles a lot: leave room for the claimants
    @rule(outcome=st.sampled_from(["ok", "fail", "mixed"]), batch=st.sampled_from([1, 3, 100]))
    def deliver_pass(self, outcome, batch):
        """O11: one deliver_due_dispatches pass; its counters equal the facts it wrote."""
        before = self.before()
        sent: list[str] = []

        async def send(deliver_to: str, payload: str) -> bool:
            did = json.loads(payload)["dispatch_id"]
            sent.append(did)
            return outcome == "ok" or (outcome == "mixed" and int(did[-1], 16) % 2 == 0)

        counts = self.run(deliver_due_dispatches(
            self.book, now=self.clock.now(), transport=CallableTransport(send), batch_size=batch))
        after = self.snap()
        new = [f for did, fs in after.facts.items() for f in fs[len(before.facts.get(did, ())):]]
        reasons = [f.reason_code for f in new]
        for did in sent:
            self.runs.record(did, claim_keys(after.facts[did])[-1])
        assert counts["attempted"] == sum(f.status == "delivering" for f in new) == len(sent) == len(set(sent))
        assert counts["expired"] == sum(f.status == "expired" for f in new)
        assert counts["dead_letter"] == sum(f.status == "dead_letter" for f in new)
        assert counts["retried"] == reasons.count("dispatch.pending.transport_failed")
        assert counts["delivered"] == reasons.count("dispatch.delivered.transport_ok") + reasons.count(
            "dispatch.pending.awaiting_ack")

    @rule(did=dispatches, action=st.sampled_from(["ack", "wrong ack", "retry", "purge"]))
    def outsider(self, did, action):
        """A consumer acks (right or wrong token) or an operator retries or purges. One rule for
        all four keeps them from crowding out the claimants."""
        if action.endswith("ack"):
            self.ack(did, right=action == "ack")
        else:
            self.operator(did, purge=action == "purge")

    def retryable(self) -> list[str]:
        rows = self.last.rows if self.last is not None else {}
        return sorted(i for i, r in rows.items() if r["status"] in ("dead_letter", "expired"))

    @precondition(lambda self: self.retryable())
    @rule(data=st.data())
    def operator_retries_a_failed_row(self, data):
        """An operator retries a dead-lettered or expired row: its old leases become the zombies
        of a new epoch that restarts at attempt 1 (the ABA case of O8)."""
        self.operator(data.draw(st.sampled_from(self.retryable()), label="dispatch"), purge=False)

    def waiting(self) -> list[str]:
        rows = self.last.rows if self.last is not None else {}
        now = self.clock.now()
        return sorted(i for i, r in rows.items() if r["status"] == "pending" and r["next_attempt_at"] > now)

    @precondition(lambda self: self.waiting())
    @rule(data=st.data())
    def operator_expedites_a_waiting_row(self, data):
        """O23: an operator makes a pending row waiting out its backoff due now: one fact, the due time alone
        changes (attempt, error and bound stay); candidates scanned before it are stale, their claims lose."""
        did = data.draw(st.sampled_from(self.waiting()), label="dispatch")
        before = self.before()
        row = before.rows[did]
        assert self.run(expedite_dispatch(self.book, did, actor=Actor("operator", "model"))) is True
        event("operator expedite")
        after = self.snap()
        moved = {"next_attempt_at", "version", "updated_at", "status_reason_code", "status_reason_summary",
                 "last_fact_id", "chain_hash"}
        assert {k: v for k, v in after.rows[did].items() if k not in moved} == {
            k: v for k, v in row.items() if k not in moved}
        assert (after.rows[did]["next_attempt_at"], after.rows[did]["version"]) == (self.clock.now(),
                                                                                   row["version"] + 1)
        assert after.rows[did]["status_reason_code"] == "dispatch.pending.operator_expedited"
        assert after.fact_count(did) == before.fact_count(did) + 1

    def ack(self, did, right):
        """O10: LookupError for a missing row; ValueError when no ack was requested or the token is
        wrong; the right token acks a live row (one fact), is a no-op success on an acked row and is
        refused for dead_letter/expired; a refusal writes nothing."""
        before = self.before()
        row = before.rows.get(did)
        try:
            # A row without a token is acked with "" (a token must be text, O22): still "none requested".
            got = self.run(ack_dispatch(self.book, did, (self.tokens[did] or "") if right else "0" * 32))
        except (EntityNotFound, AckRejected, TransitionRejected) as exc:
            if row is None:
                assert isinstance(exc, LookupError)
            elif not row["ack_required"] or not right:
                assert isinstance(exc, AckRejected) and isinstance(exc, ValueError)
            else:
                assert isinstance(exc, TransitionRejected) and row["status"] in ("dead_letter", "expired")
            self.unchanged(before, did, "a refused ack")
            return
        assert got is True and row is not None and row["ack_required"] and right
        event(f"ack from {row['status']}")
        after = self.snap()
        assert after.rows[did]["status"] == "acked"
        assert after.fact_count(did) == before.fact_count(did) + (row["status"] != "acked")

    def operator(self, did, purge):
        """O15: retry moves dead_letter/expired to pending (attempt 0, due now, no error) in one
        transition and refuses other statuses (TransitionRejected, nothing written). O16: purge deletes a terminal row with a
        tombstone fact and refuses a live one."""
        before = self.before()
        row = before.rows.get(did)
        if purge and row is not None and row["status"] in LIVE:
            with pytest.raises(TransitionRejected):
                self.run(purge_dispatch(self.book, did))
        elif purge:
            assert self.run(purge_dispatch(self.book, did)) == (row is not None)
            after = self.snap()
            assert did not in after.rows and (row is None or after.facts[did][-1].status is None)
            self.dedup = {k: v for k, v in self.dedup.items() if v != did}
            return
        elif row is None:
            with pytest.raises(LookupError):
                self.run(retry_dispatch(self.book, did))
        elif row["status"] not in ("dead_letter", "expired"):
            with pytest.raises(TransitionRejected, match="only dead_letter or expired"):
                self.run(retry_dispatch(self.book, did))
        elif self.run(retry_dispatch(self.book, did)):
            event("operator retry")
            assert row["status"] in ("dead_letter", "expired")
            new = self.snap().rows[did]
            assert (new["status"], new["attempt"], new["next_attempt_at"], new["last_error"]) == (
                "pending", 0, self.clock.now(), None)
            return
        self.unchanged(before, did, "a refused operator action")

    @rule(seconds=st.sampled_from([0.5, 5.0, 14.0, 16.0, 16.0, 61.0, 250.0, 1900.0]))
    def tick(self, seconds):
        self.clock.advance(seconds)

    # -- invariants and liveness -------------------------------------------------------------------

    @invariant()
    def outbox_invariants(self):
        """O3, O5, O7, O9 and L7/L8 (row == fold of facts, chain, edges): see outbox_model.problems."""
        self.steps += 1
        self.last = self.snap()
        found = problems(self.last, self.runs, self.book.policy("dispatch"))
        assert not found, "\n".join(found)

    def teardown(self):
        try:
            if sys.exc_info()[0] is None:  # a failing step already says what went wrong
                self.check_liveness()
        finally:
            enqueue_module.new_id = self._real_new_id
            self.run(self.book.engine.dispose())
            self.runner.close()

    def check_liveness(self):
        """O20: with crashes over and the clock past every lease and backoff, passes with a
        transport that always succeeds (acking ack-required rows with their tokens) bring every
        dispatch to a terminal status within a bounded number of rounds."""
        for c in self.claimants:
            c.forget()
        rows: dict[str, dict] = {}
        for _ in range(LIVENESS_ROUNDS):
            self.clock.advance(CLAIM_LEASE_SECONDS + 1800 + 1)
            self.outbox_invariants()
            self.deliver_pass("ok", 100)
            for did, row in self.snap().rows.items():
                if row["ack_required"] and row["status"] in LIVE:
                    assert self.run(ack_dispatch(self.book, did, row["ack_token"])) is True
            rows = self.snap().rows
            if all(r["status"] in TERMINAL for r in rows.values()):
                break
        stuck = {i: (r["status"], r["attempt"], r["max_attempts"])
                 for i, r in rows.items() if r["status"] not in TERMINAL}
        assert not stuck, f"O20: not terminal after {LIVENESS_ROUNDS} rounds: {stuck}"
        self.outbox_invariants()
        assert self.run(verify(self.book)).ok


def machine_for(backend: str, url_factory) -> type[OutboxMachine]:  # noqa: ANN001
    return type(f"OutboxMachine_{backend}", (OutboxMachine,), {"url": staticmethod(url_factory), "backend": backend})


def test_outbox_state_machine_sqlite(tmp_path_factory):
    """O2, O3, O5-O11, O15, O16, O20 under interleavings, crashes and zombies, on SQLite."""
    SEEN.clear()
    run_state_machine_as_test(
        machine_for("sqlite", lambda: f"sqlite:///{tmp_path_factory.mktemp('outbox_sm') / 'sm.db'}"), settings=SETTINGS)
    print("\nsqlite paths:", dict(sorted(SEEN.items())))


@pytest.mark.postgres
def test_outbox_state_machine_postgres(pg_url):
    """The same machine on PostgreSQL (schema reset per example)."""
    SEEN.clear()
    run_state_machine_as_test(machine_for("postgres", lambda: pg_url), settings=SETTINGS)
    print("\npostgres paths:", dict(sorted(SEEN.items())))


async def test_steps_on_a_purged_row_are_lost_races(book, clock):
    """O5, O8: a claim, settle or finalization whose row was purged after the claimant read it
    lost a race — None / "conflict", no exception — and writes nothing."""
    now = clock.now()
    did = await enqueue_dispatch(book, kind="sm", deliver_to="seat", ack_required=True, expires_at=now + 10)
    [stale] = await scan(book, now=now)
    lease = await claim(book, stale, now=now)
    assert lease is not None
    assert await ack_dispatch(book, did, (await snapshot(book)).rows[did]["ack_token"]) is True  # while delivering
    assert await purge_dispatch(book, did) is True
    clock.advance(20)
    assert await finalize(book, lease, TransportResult(True), now=clock.now()) == "conflict"
    assert await claim(book, stale, now=clock.now()) is None
    assert await settle(book, stale, now=clock.now()) is None
    snap = await snapshot(book)
    assert did not in snap.rows and [f.status for f in snap.facts[did]] == ["pending", "delivering", "acked", None]
