"""The outbox as a Hypothesis state machine: producers, step-by-step claimants, consumers, operators.

Claimants advance deliveries one step per rule (scan, settle+claim, run the transport, finalize)
in any interleaving with each other, with whole ``deliver_due_dispatches`` passes, acks, operator
retries and purges, and jumps of a FakeClock. Any claimant may crash between two steps (it drops
what it held), a claim or finalization may commit while its claimant is told it failed
("ambiguous": it then behaves as crashed), or roll back inside its transaction ("aborted").
Every lease ever won stays drawable, so stale "zombie" finalizations are generated late.

Each rule checks its own step precisely against what the database held just before it; the
invariants in ``outbox_model.problems`` plus ``verify`` run after every step; teardown checks
liveness. Runs on SQLite (a fresh file per example) and PostgreSQL (schema reset per example).
``HYPOTHESIS_PROFILE=deep`` runs many more and longer examples.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from collections import Counter

from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, precondition, rule
from hypothesis.stateful import run_state_machine_as_test

import statebook.outbox.enqueue as enqueue_module
from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import EntityNotFound, FakeClock, TransitionRejected, verify
from statebook.lifecycle.replay import check_entity
from statebook.outbox import (
    CLAIM_LEASE_SECONDS,
    AckRejected,
    CallableTransport,
    TransportResult,
    ack_dispatch,
    backoff_seconds,
    claim,
    deliver_due_dispatches,
    enqueue_dispatch,
    execute,
    finalize,
    purge_dispatch,
    retry_dispatch,
    scan,
    settle,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from outbox_model import LIVE, TERMINAL, Runs, Snapshot, claim_keys, epoch_of, problems, snapshot  # noqa: E402

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
SETTINGS = settings(
    max_examples=300 if DEEP else 25,
    stateful_step_count=80 if DEEP else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CLAIMANTS = 3
LIVENESS_ROUNDS = 8  # max_attempts <= 4: a few passes must settle everything
OUTCOMES = ("ok", "fail", "timeout", "raise")
MODES = ("normal", "normal", "normal", "ambiguous", "aborted")
LIMITS = st.sampled_from([1, 2, 100])
TOLERATE_MISSING_ROW_RAISE = True  # see OutboxMachine.in_mode


SEEN: Counter[str] = Counter()
"""How often each interesting path ran (printed by the tests with ``-s``)."""


def event(what: str) -> None:
    SEEN[what] += 1


class Told(Exception):
    """The claimant is told its step failed (whether or not the transaction committed)."""


@dataclass(eq=False)
class Held:
    """A lease a claimant won, with the epoch (operator retries so far) it was won in."""

    lease: Any
    epoch: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.epoch, self.lease.attempt)

    def __repr__(self) -> str:
        return f"Held({self.lease.dispatch_id[:6]}, epoch={self.epoch}, attempt={self.lease.attempt})"


@dataclass
class Claimant:
    phase: str = "idle"  # idle -> scanned -> claimed -> executed -> idle
    candidates: list[Any] = field(default_factory=list)
    held: Held | None = None
    result: TransportResult | None = None


def scripted(outcome: str, on_run) -> CallableTransport:  # noqa: ANN001
    async def send(deliver_to: str, payload: str):
        on_run()
        if outcome == "raise":
            raise RuntimeError("transport crashed")
        if outcome == "timeout":
            return TransportResult.failed("timeout: the transport ran longer than 10s", timed_out=True)
        return TransportResult(outcome == "ok", None if outcome == "ok" else "exit 3")

    return CallableTransport(send)


def matches(row: dict | None, cand: Any) -> bool:
    """The row is still exactly what the scan read (claim's compare-and-set would pass)."""
    return row is not None and (row["status"], row["attempt"], row["next_attempt_at"]) == (
        cand.status, cand.attempt, cand.next_attempt_at)


class OutboxMachine(RuleBasedStateMachine):
    url: str = ""
    backend: str = ""

    dispatches = Bundle("dispatches")
    leases = Bundle("leases")  # never consumed: every lease stays drawable for zombie finalizations

    def __init__(self) -> None:
        super().__init__()
        # Dispatch ids decide scan order among rows due at the same instant; random ids would make
        # replays (and shrinking) diverge, so this machine's ids are a deterministic sequence.
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
        self.all_held: list[Held] = []  # every lease ever won (the bundle holds the same)
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

    def pick(self, data, phase: str) -> Claimant:
        ready = [c for c in self.claimants if c.phase == phase]
        return ready[data.draw(st.integers(0, len(ready) - 1), label="claimant")]

    def unchanged(self, before: Snapshot, did: str, what: str) -> None:
        after = self.snap()
        assert after.rows.get(did) == before.rows.get(did), f"{what} changed row {did}"
        assert after.fact_count(did) == before.fact_count(did), f"{what} wrote a fact for {did}"

    def in_mode(self, mode: str, step, *, row_missing: bool = False):  # noqa: ANN001
        """Run ``step(book)`` normally, committed-but-reported-failed, or rolled back.

        ``row_missing``: the row was purged since the claimant read it. The contract makes that a
        lost race (None / "conflict"); the outbox currently raises EntityNotFound, which
        ``test_steps_on_a_purged_row_are_lost_races`` pins down, so here it is tolerated.
        """
        box: list[Any] = []

        async def wrapped():
            if mode == "normal":
                box.append(await step(self.book))
                return
            async with self.book.begin() as tx:
                box.append(await step(tx))
                if mode == "aborted":
                    raise Told
            raise Told

        try:
            self.run(wrapped())
        except Told:
            assert mode != "normal"
        except EntityNotFound:
            if not (row_missing and TOLERATE_MISSING_ROW_RAISE):
                raise
            return None
        else:
            assert mode == "normal"
        return box[0] if box else None

    # -- producers ---------------------------------------------------------------------------

    @initialize(target=dispatches, n=st.integers(1, 4), ack=st.booleans(), max_attempts=st.integers(1, 4))
    def some_work(self, n, ack, max_attempts):
        """Start with a few dispatches so claimants have work even when swarm testing turns
        the enqueue rule off."""
        ids = [self.run(enqueue_dispatch(
            self.book, kind="sm", deliver_to="seat", ack_required=ack and i % 2 == 0, max_attempts=max_attempts))
            for i in range(n)]
        rows = self.snap().rows
        self.tokens.update((did, rows[did]["ack_token"]) for did in ids)
        return multiple(*ids)

    @rule(target=dispatches, dedup=st.sampled_from([None, None, "k1", "k2"]), ack=st.booleans(),
          max_attempts=st.integers(1, 4), ttl=st.sampled_from([None, None, 1.0, 20.0, 100.0, 4000.0]),
          rolled_back=st.sampled_from([False] * 5 + [True]))
    def enqueue(self, dedup, ack, max_attempts, ttl, rolled_back):
        """O-enqueue, O-dedup: a new row is pending, attempt 0, due now, with one creation fact; a
        dedup hit returns the live row's id and writes nothing. O-atomic (L5): an enqueue joined
        to a caller's transaction that rolls back leaves nothing."""
        before = self.snap()
        if rolled_back:
            return self.enqueue_rolled_back(before, dedup)
        now = self.clock.now()
        did = self.run(enqueue_dispatch(
            self.book, kind="sm", deliver_to="seat", dedup_key=dedup, ack_required=ack, max_attempts=max_attempts,
            expires_at=None if ttl is None else now + ttl))
        after = self.snap()
        event("enqueue")
        if dedup in self.dedup:
            assert did == self.dedup[dedup]
            assert len(after.facts) == len(before.facts) and after.rows == before.rows
            return did
        row = after.rows[did]
        assert (row["status"], row["attempt"], row["next_attempt_at"]) == ("pending", 0, now)
        assert after.fact_count(did) == 1 and did not in before.facts
        assert (row["ack_token"] is not None) == ack
        self.tokens[did] = row["ack_token"]
        if dedup is not None:
            self.dedup[dedup] = did
        return did

    def enqueue_rolled_back(self, before: Snapshot, dedup: str | None):
        async def step():
            async with self.book.begin() as tx:
                await enqueue_dispatch(tx, kind="sm", deliver_to="seat", dedup_key=dedup)
                raise Told

        with pytest.raises(Told):
            self.run(step())
        after = self.snap()
        assert after.rows == before.rows and len(after.facts) == len(before.facts)
        event("enqueue rolled back")
        return multiple()

    # -- claimants, one step at a time -------------------------------------------------------

    @precondition(lambda self: any(c.phase == "idle" for c in self.claimants))
    @rule(data=st.data(), limit=LIMITS)
    def scan_due(self, data, limit):
        self.do_scan(self.pick(data, "idle"), limit)

    def do_scan(self, c: Claimant, limit: int) -> None:
        """O-scan: exactly the due pending/delivering rows, ordered by (next_attempt_at, id), capped."""
        now = self.clock.now()
        rows = self.snap().rows
        c.candidates = self.run(scan(self.book, now=now, limit=limit))
        due = sorted((r["next_attempt_at"], i) for i, r in rows.items() if r["status"] in LIVE and r["next_attempt_at"] <= now)
        assert [x.dispatch_id for x in c.candidates] == [i for _, i in due[:limit]]
        c.phase = "scanned" if c.candidates else "idle"
        event(f"scan found {min(len(c.candidates), 2)}")

    @precondition(lambda self: any(c.phase == "scanned" for c in self.claimants))
    @rule(target=leases, data=st.data(), settle_first=st.booleans(), mode=st.sampled_from(MODES))
    def claim_one(self, data, settle_first, mode):
        return self.do_claim(self.pick(data, "scanned"), data, settle_first, mode)

    def do_claim(self, c: Claimant, data, settle_first: bool, mode: str):  # noqa: ANN001
        """O-expiry-wins, O-single-claim, O-due, O-bounded: settle finishes an expired or exhausted
        candidate; a claim wins only when the row is still what the scan read, due, not expired
        and not exhausted; it bumps the attempt by one and sets the lease as the due time."""
        cand = c.candidates[data.draw(st.integers(0, len(c.candidates) - 1), label="candidate")]
        c.phase, c.candidates = "idle", []
        now = self.clock.now()
        before = self.snap()
        row = before.rows.get(cand.dispatch_id)
        fresh = matches(row, cand)
        if settle_first:
            settled = self.in_mode("normal", lambda b: settle(b, cand, now=now), row_missing=row is None)
            after = self.snap().rows.get(cand.dispatch_id)
            expected = None
            if fresh and cand.expired(now):
                expected = "expired"
            elif fresh and cand.status == "delivering" and cand.attempt >= cand.max_attempts:
                expected = "dead_letter"
            assert settled == expected, (settled, expected, row, cand)
            event(f"settle: {settled}")
            if settled is not None:
                assert after["status"] == settled
                return multiple()
            self.unchanged(before, cand.dispatch_id, "a settle that did nothing")
        claimable = (fresh and not cand.expired(now) and cand.next_attempt_at <= now
                     and not (cand.status == "delivering" and cand.attempt >= cand.max_attempts))
        lease = self.in_mode(mode, lambda b: claim(b, cand, now=now), row_missing=row is None)
        if mode == "aborted":
            self.unchanged(before, cand.dispatch_id, "a rolled-back claim")
            return multiple()
        assert (lease is not None) == claimable, (lease, row, cand, now)
        event(f"claim {mode}: {'won' if lease else 'lost'}{' (reclaim)' if cand.status == 'delivering' else ''}")
        if lease is None:
            self.unchanged(before, cand.dispatch_id, "a lost claim")
            return multiple()
        after = self.snap()
        new = after.rows[cand.dispatch_id]
        assert lease.attempt == row["attempt"] + 1 <= row["max_attempts"]
        assert (new["status"], new["attempt"]) == ("delivering", lease.attempt)
        assert new["next_attempt_at"] == lease.lease_until == now + CLAIM_LEASE_SECONDS
        held = Held(lease, epoch_of(after.facts[cand.dispatch_id]))
        assert claim_keys(after.facts[cand.dispatch_id])[-1] == held.key
        self.all_held.append(held)
        if mode == "normal":
            c.phase, c.held = "claimed", held
        return multiple(held)

    @precondition(lambda self: any(c.phase == "claimed" for c in self.claimants))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def run_transport(self, data, outcome):
        self.do_execute(self.pick(data, "claimed"), outcome)

    def do_execute(self, c: Claimant, outcome: str) -> None:
        """O-runs: the transport runs once per won claim; a raise or timeout is a failed result."""
        held = c.held
        assert held is not None
        transport = scripted(outcome, lambda: self.runs.record(held.lease.dispatch_id, held.key))
        c.result = self.run(execute(held.lease, transport))
        assert c.result.ok == (outcome == "ok")
        assert c.result.ok or c.result.error
        c.phase = "executed"

    @precondition(lambda self: any(c.phase == "executed" for c in self.claimants))
    @rule(data=st.data(), mode=st.sampled_from(MODES))
    def finalize_one(self, data, mode):
        self.do_finalize(self.pick(data, "executed"), mode)

    def do_finalize(self, c: Claimant, mode: str) -> None:
        """O-atomic-outcome, O-fenced-finalize: see ``check_finalize``."""
        held, result = c.held, c.result
        c.phase, c.held, c.result = "idle", None, None
        self.check_finalize(held, result, mode)

    @rule(target=leases, data=st.data())
    def advance(self, data):
        """The next step of any one claimant, whatever its phase. The four rules above do the same
        per phase; this one doubles the pipeline's share of steps against the other rules."""
        c = self.claimants[data.draw(st.integers(0, CLAIMANTS - 1), label="claimant")]
        if c.phase == "idle":
            self.do_scan(c, data.draw(LIMITS, label="limit"))
        elif c.phase == "scanned":
            return self.do_claim(c, data, data.draw(st.booleans(), label="settle_first"), data.draw(
                st.sampled_from(MODES), label="mode"))
        elif c.phase == "claimed":
            self.do_execute(c, data.draw(st.sampled_from(OUTCOMES), label="outcome"))
        else:
            self.do_finalize(c, data.draw(st.sampled_from(MODES), label="mode"))
        return multiple()

    @rule(target=leases, data=st.data())
    def advance_again(self, data):
        """Hypothesis picks rules uniformly: a second entry gives claimant steps more weight."""
        return self.advance(data)

    @rule(held=leases, outcome=st.sampled_from(OUTCOMES), mode=st.sampled_from(MODES))
    def zombie_finalize(self, held, outcome, mode):
        """O-fenced-finalize: a finalization with any lease ever won, however late; only the
        current claim of a delivering row may settle it, every other one is a conflict."""
        result = {"ok": TransportResult(True)}.get(outcome, TransportResult(False, f"zombie {outcome}"))
        self.check_finalize(held, result, mode)

    def superseded(self) -> list[Held]:
        """Leases whose row is delivering under a different (later) claim: the dangerous zombies."""
        if self.last is None:
            return []
        found = []
        for held in self.all_held:
            row = self.last.rows.get(held.lease.dispatch_id)
            if row is not None and row["status"] == "delivering":
                if claim_keys(self.last.facts[held.lease.dispatch_id])[-1] != held.key:
                    found.append(held)
        return found

    @precondition(lambda self: self.superseded())
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES), mode=st.sampled_from(MODES))
    def superseded_finalize(self, data, outcome, mode):
        """O-fenced-finalize: the zombie that matters most — its row is delivering again under a
        later claim (a reclaim, or the same attempt number after an operator retry)."""
        held = data.draw(st.sampled_from(self.superseded()), label="superseded lease")
        self.zombie_finalize(held, outcome, mode)

    def check_finalize(self, held: Held, result: TransportResult, mode: str) -> None:
        """ONE transition from delivering, fenced by the lease: delivered / awaiting_ack (pending,
        due after the backoff) / retried (pending, due after the backoff, last_error set) /
        dead_letter at the attempt bound — status, due time and error together — or a conflict
        that writes nothing when the lease is not the row's current claim."""
        lease, did, now = held.lease, held.lease.dispatch_id, self.clock.now()
        before = self.snap()
        row = before.rows.get(did)
        current = (row is not None and row["status"] == "delivering"
                   and claim_keys(before.facts[did])[-1] == held.key)
        got = self.in_mode(mode, lambda b: finalize(b, lease, result, now=now), row_missing=row is None)
        if mode == "aborted":
            self.unchanged(before, did, "a rolled-back finalization")
            return
        event(f"finalize {mode}: {got if current else 'stale -> ' + str(got)}")
        if not current:
            if row is not None and row["status"] == "delivering":
                same = row["attempt"] == lease.attempt
                event(f"stale finalize while another claim is live{' (same attempt, ABA)' if same else ''}")
            assert got in (None, "conflict"), (got, held, row)
            self.unchanged(before, did, "a stale finalization")
            return
        a, bound = lease.attempt, lease.attempt >= lease.max_attempts
        if result.ok:
            expected = "delivered" if not lease.ack_required else "dead_letter" if bound else "awaiting_ack"
        else:
            expected = "dead_letter" if bound else "retried"
        assert got in (expected, None), (got, expected)
        after = self.snap()
        new = after.rows[did]
        assert after.fact_count(did) == before.fact_count(did) + 1
        status = {"awaiting_ack": "pending", "retried": "pending"}.get(expected, expected)
        assert (new["status"], new["attempt"]) == (status, a)
        if expected in ("awaiting_ack", "retried"):
            assert new["next_attempt_at"] == now + backoff_seconds(a)
        if not result.ok:
            assert new["last_error"] == result.error

    @precondition(lambda self: any(c.phase != "idle" for c in self.claimants))
    @rule(data=st.data())
    def crash(self, data):
        """A claimant dies between two steps: it forgets what it held; the database keeps it."""
        busy = [c for c in self.claimants if c.phase != "idle"]
        c = busy[data.draw(st.integers(0, len(busy) - 1), label="crashing")]
        c.phase, c.candidates, c.held, c.result = "idle", [], None, None
        event("crash")

    # -- whole passes, consumers, operators, time -----------------------------------------------

    @precondition(lambda self: self.steps % 4 == 0)  # a pass settles a lot: leave room for the claimants
    @rule(outcome=st.sampled_from(["ok", "fail", "mixed"]), batch=st.sampled_from([1, 3, 100]))
    def deliver_pass(self, outcome, batch):
        """O-counters: one deliver_due_dispatches pass; its counters equal the facts it wrote."""
        before = self.snap()
        sent: list[str] = []

        async def send(deliver_to: str, payload: str):
            did = __import__("json").loads(payload)["dispatch_id"]
            sent.append(did)
            return outcome == "ok" or (outcome == "mixed" and int(did[-1], 16) % 2 == 0)

        counts = self.run(deliver_due_dispatches(
            self.book, now=self.clock.now(), transport=CallableTransport(send), batch_size=batch))
        after = self.snap()
        new = [f for did, fs in after.facts.items() for f in fs[len(before.facts.get(did, ())):]]
        reasons = [f.reason_code for f in new]
        claimed = {f.entity_id: f for f in new if f.status == "delivering"}
        for did in sent:
            self.runs.record(did, claim_keys(after.facts[did])[-1])
        assert counts["attempted"] == len(claimed) == len(sent) == len(set(sent))
        event(f"deliver pass attempted>0: {counts['attempted'] > 0}")
        assert counts["expired"] == sum(f.status == "expired" for f in new)
        assert counts["dead_letter"] == sum(f.status == "dead_letter" for f in new)
        assert counts["retried"] == reasons.count("dispatch.pending.transport_failed")
        assert counts["delivered"] == reasons.count("dispatch.delivered.transport_ok") + reasons.count(
            "dispatch.pending.awaiting_ack")

    @rule(did=dispatches, right=st.booleans())
    def ack(self, did, right):
        """O-ack: LookupError for a missing row; ValueError when no ack was requested or the token
        is wrong; a right token acks a live row (one fact), is a no-op success on an acked row and
        is refused for dead_letter/expired; a refusal writes nothing."""
        before = self.snap()
        row = before.rows.get(did)
        token = self.tokens.get(did) if right else "0" * 32
        try:
            got = self.run(ack_dispatch(self.book, did, token))
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
        assert self.snap().rows[did]["status"] == "acked"
        assert self.snap().fact_count(did) == before.fact_count(did) + (row["status"] != "acked")

    @rule(did=dispatches, purge=st.booleans())
    def operator(self, did, purge):
        """An operator retries or purges a dispatch."""
        if purge:
            self.operator_purge(did)
        else:
            self.operator_retry(did)

    def operator_retry(self, did):
        """O-retry: dead_letter/expired go back to pending (attempt 0, due now, error cleared) in
        one operator transition; any other status is left alone."""
        before = self.snap()
        row = before.rows.get(did)
        if row is None:
            with pytest.raises(LookupError):
                self.run(retry_dispatch(self.book, did))
            return
        got = self.run(retry_dispatch(self.book, did))
        assert got == (row["status"] in ("dead_letter", "expired"))
        event(f"retry: {got}")
        if not got:
            self.unchanged(before, did, "a refused retry")
            return
        new = self.snap().rows[did]
        assert (new["status"], new["attempt"], new["next_attempt_at"], new["last_error"]) == (
            "pending", 0, self.clock.now(), None)

    def operator_purge(self, did):
        """O-purge: a terminal row is deleted with a tombstone fact; a live row is refused."""
        before = self.snap()
        row = before.rows.get(did)
        if row is not None and row["status"] in LIVE:
            with pytest.raises(TransitionRejected):
                self.run(purge_dispatch(self.book, did))
            self.unchanged(before, did, "a refused purge")
            return
        got = self.run(purge_dispatch(self.book, did))
        assert got == (row is not None)
        after = self.snap()
        assert did not in after.rows
        if row is not None:
            assert after.facts[did][-1].status is None
            self.dedup = {k: v for k, v in self.dedup.items() if v != did}

    @rule(seconds=st.sampled_from([0.5, 5.0, 14.0, 16.0, 61.0, 250.0, 1900.0]))
    def tick(self, seconds):
        event("tick")
        self.clock.advance(seconds)

    # -- invariants and liveness -------------------------------------------------------------

    @invariant()
    def outbox_invariants(self):
        """O-single-claim, O-runs, O-bounded, O-due, O-dedup, O-terminal, and L7 (row == fold)."""
        self.steps += 1
        self.last = snap = self.snap()
        found = problems(snap, self.runs)
        # verify's own per-entity check on the snapshot: row == fold(facts), chain, edges (L7, L8).
        lc = self.book.policy("dispatch")
        for did in snap.rows.keys() | snap.facts.keys():
            found += [f"L7 {f.kind}: {did} {f.detail}" for f in check_entity(lc, did, snap.facts.get(did, []), snap.rows.get(did))]
        assert not found, "\n".join(found)

    def teardown(self):
        try:
            if sys.exc_info()[0] is None:
                self.check_liveness()
        finally:
            enqueue_module.new_id = self._real_new_id
            self.run(self.book.engine.dispose())
            self.runner.close()

    def check_liveness(self):
        """O-liveness: with crashes over and the clock past every lease and backoff, repeated
        passes with a transport that always succeeds (and acks with the right tokens) bring
        every dispatch to a terminal status within a bounded number of rounds."""
        for c in self.claimants:
            c.phase, c.candidates, c.held, c.result = "idle", [], None, None
        for _ in range(LIVENESS_ROUNDS):
            self.clock.advance(CLAIM_LEASE_SECONDS + 1800 + 1)
            self.deliver_pass("ok", 100)
            for did, row in self.snap().rows.items():
                if row["ack_required"] and row["status"] in LIVE:
                    assert self.run(ack_dispatch(self.book, did, row["ack_token"])) is True
            rows = self.snap().rows
            if all(r["status"] in TERMINAL for r in rows.values()):
                break
        stuck = {i: (r["status"], r["attempt"], r["max_attempts"]) for i, r in rows.items() if r["status"] not in TERMINAL}
        assert not stuck, f"O-liveness: not terminal after {LIVENESS_ROUNDS} rounds: {stuck}"
        self.outbox_invariants()
        assert self.run(verify(self.book)).ok
        note(f"liveness reached with {len(rows)} rows")


def machine_for(backend: str, url_factory) -> type[OutboxMachine]:  # noqa: ANN001
    return type(f"OutboxMachine_{backend}", (OutboxMachine,), {"url": staticmethod(url_factory), "backend": backend})


def test_outbox_state_machine_sqlite(tmp_path_factory):
    """O-atomic-outcome, O-single-claim, O-fenced-finalize, O-liveness ... on SQLite (file per example)."""
    machine = machine_for("sqlite", lambda: f"sqlite:///{tmp_path_factory.mktemp('outbox_sm') / 'sm.db'}")
    SEEN.clear()
    run_state_machine_as_test(machine, settings=SETTINGS)
    print("\nsqlite paths:", dict(sorted(SEEN.items())))


@pytest.mark.postgres
def test_outbox_state_machine_postgres(pg_url):
    """The same machine on PostgreSQL (schema reset per example)."""
    machine = machine_for("postgres", lambda: pg_url)
    SEEN.clear()
    run_state_machine_as_test(machine, settings=SETTINGS)
    print("\npostgres paths:", dict(sorted(SEEN.items())))


async def test_steps_on_a_purged_row_are_lost_races(book, clock):
    """O-fenced-finalize, O-single-claim: a claim, settle or finalization whose row was purged
    after the claimant read it lost a race: None / "conflict", no exception, nothing written."""
    now = clock.now()
    did = await enqueue_dispatch(book, kind="sm", deliver_to="seat", ack_required=True, expires_at=now + 10)
    [stale] = await scan(book, now=now)
    lease = await claim(book, stale, now=now)
    assert lease is not None
    token = (await snapshot(book)).rows[did]["ack_token"]
    assert await ack_dispatch(book, did, token) is True  # acked while delivering
    assert await purge_dispatch(book, did) is True
    clock.advance(20)
    assert await finalize(book, lease, TransportResult(True), now=clock.now()) == "conflict"
    assert await claim(book, stale, now=clock.now()) is None
    assert await settle(book, stale, now=clock.now()) is None
    snap = await snapshot(book)
    assert did not in snap.rows and snap.facts[did][-1].status is None
