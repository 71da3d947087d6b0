"""Notification ownership as a Hypothesis state machine against a reference model (issue 13, "Tests that
must exist"; specs/notifications.md N13-N29, "Ownership state machine").

The book and ownership_model.Model are driven side by side: intakes over two recipients x two obligation keys
x both modes (and some without an obligation key), with few idempotency keys, repeated with the same or
other content; delivery passes (``deliver_due_notifications``) whose scripted channel succeeds or
rejects per notification, as the rule drew it; the fake clock moving windows and backoffs past; operators
replaying and resolving failures; 2-4 intakes at once on separate connections. After every step the
rows must be what the model says, and, read from the book alone: at most one live owner per obligation,
every pending follower linked to the claim's live owner at the claim's generation, no deduplicated
follower whose owner did not deliver first, the dead-letter view with the model's block reasons, every
row equal to the fold of its facts, ``verify`` clean. Retention (N30) is not built yet.
``HYPOTHESIS_PROFILE=deep`` runs far more.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from profiles import examples
import statebook.outbox.notifications.intake as intake_module
from statebook.adapters.db import connect, open_book, reset_schema
from statebook.lifecycle import Actor, Book, FakeClock, history, replay, verify
from statebook.lifecycle.facts import facts_table
from statebook.outbox.notifications import (
    apply_notification_retention,
    IdempotencyMismatch, RecoveryRefused, deliver_due_notifications, list_dead_letters, replay_notification,
    resolve_notification, send_notification,
)
from statebook.outbox.notifications.buckets import ensure_bucket, hold as hold_bucket
from statebook.outbox.notifications.ownership import dedup_claim_id
from statebook.outbox.notifications.schema import dedup_claims, notifications
from statebook.outbox.notifications.scripted import ScriptedChannel

from notification_model import SEEN, event
from ownership_model import BUCKET_RATE, LIVE, Model, Request

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
SETTINGS = settings(
    max_examples=examples(40),  # deep: 400
    stateful_step_count=80 if DEEP else 50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MAX_ROWS = 14
DEADLINE = 5.0
"""The adapter deadline in real seconds: scripted sends answer at once, so it never cuts one."""
ALICE = Actor("operator", "alice")
KEYS = (None, None, None, "k1", "k2", "k3")
REQUESTS = st.builds(
    lambda recipient, text, mode, key, dedup, window: Request(recipient, text, mode, key, dedup,
                                                              None if dedup is None else window),
    # Skewed towards one obligation, so followers, elections and blocked replays are common.
    st.sampled_from(("ops", "ops", "dev")), st.sampled_from(("a", "b")),
    st.sampled_from(("guaranteed", "guaranteed", "best_effort")), st.sampled_from(KEYS),
    st.sampled_from((None, "disk", "disk", "disk", "cpu")), st.sampled_from((0.0, 30.0, 300.0)),
)
STEPS = st.sampled_from(("success", "reject", "reject"))
STEP_SLOTS = st.lists(STEPS, min_size=8, max_size=8)


class OwnershipMachine(RuleBasedStateMachine):
    url: Any = None
    backend = ""

    def __init__(self) -> None:
        super().__init__()
        # Deterministic ids: the oldest follower is (created_at, id), and same-instant intakes tie on id.
        self.serial: dict[str, int] = {}
        self._real_new_id = intake_module.new_id
        intake_module.new_id = self.new_id
        self.runner = asyncio.Runner()
        self.clock = FakeClock()
        try:
            self.book = self.run(self._open())
            self.others = [Book(connect(self.url()), self.book.registry, self.clock) for _ in range(4)]
        except BaseException:
            intake_module.new_id = self._real_new_id
            self.runner.close()
            raise
        self.model = Model()
        self.steps: dict[str, str] = {}
        self.took: list[str] = []
        self.channels = {"email": ScriptedChannel("email", [self._step])}
        self.sent: list[Request] = []
        self.folded: dict[tuple[str, str], dict] = {}  # rows already found equal to their facts' fold
        self.verified: tuple | None = None  # (rows, claims, facts' count and last seq) when verify last passed

    async def _open(self) -> Book:
        book = await open_book(self.url(), clock=self.clock)
        if self.backend == "postgres":
            await reset_schema(book.engine)
        return book

    def run(self, coro):  # noqa: ANN001
        return self.runner.run(coro)

    def new_id(self) -> str:
        nid = hashlib.sha256(f"om-{len(self.serial)}".encode()).hexdigest()[:32]
        self.serial[nid] = len(self.serial)
        return nid

    def _step(self, delivery) -> str:  # noqa: ANN001
        self.took.append(delivery.notification_id)
        return self.steps.get(delivery.notification_id, "success")

    async def send(self, book: Book, req: Request):
        return await send_notification(
            book, recipient=req.recipient, content={"text": req.text}, mode=req.mode, channels=["email"],
            principal="p", source="s", idempotency_key=req.idempotency_key, obligation_key=req.obligation_key,
            obligation_window=req.window)

    async def fact_count(self) -> int:
        async with self.book.read() as conn:
            return (await conn.execute(sa.select(sa.func.count()).select_from(facts_table))).scalar_one()

    # -- intakes -----------------------------------------------------------------------------------

    @precondition(lambda self: len(self.model.notes) < MAX_ROWS)
    @rule(req=REQUESTS)
    def intake(self, req: Request) -> None:
        """N13, N15, N16, N18, N19, N21, N23: one intake, answered as the model says."""
        now = self.clock.now()
        want = self.model.expect_intake(req, now)
        before = self.run(self.fact_count())
        self.sent.append(req)
        try:
            got = self.run(self.send(self.book, req))
        except IdempotencyMismatch:
            assert want.kind == "conflict", f"N13: {req} conflicted; the model expected {want}"
            assert self.run(self.fact_count()) == before, "N13: a conflict wrote facts"
            event("intake: conflict")
            return
        if want.kind != "new":
            assert (want.kind, got.id, got.created) == ("existing", want.id, False), \
                f"N13: {req} returned {got}; the model expected {want}"
            assert self.run(self.fact_count()) == before, "N13: a repeated intake wrote facts"
            event("intake: same key and content")
        else:
            assert got.created, f"{req} returned existing {got.id}; the model expected a new notification ({want})"
            self.model.accept(req, got.id, now)
            event(f"intake: {want.role}")
        note = self.model.notes[got.id]
        assert got.obligation_owner_id == self.model.obligation_owner(got.id), \
            f"N15, N16, N24: {req} answered {got.id} with owner {got.obligation_owner_id}; the model says {note}"
        assert got.status == note.status, f"N18: {req} answered {got}; the model says {note}"

    @precondition(lambda self: self.sent and len(self.model.notes) < MAX_ROWS)
    @rule(data=st.data(), change=st.sampled_from((None, None, "text", "window", "mode")))
    def intake_again(self, data, change) -> None:
        """A request sent before, as it was or with one field changed: same key and content returns the
        original acceptance, other content is a conflict (N13)."""
        req = data.draw(st.sampled_from(self.sent), label="earlier request")
        if change == "text":
            req = Request(req.recipient, "b" if req.text == "a" else "a", req.mode, req.idempotency_key,
                          req.obligation_key, req.window)
        elif change == "window" and req.obligation_key is not None:
            req = Request(req.recipient, req.text, req.mode, req.idempotency_key, req.obligation_key,
                          30.0 if req.window != 30.0 else 300.0)
        elif change == "mode":
            req = Request(req.recipient, req.text, "guaranteed" if req.mode == "best_effort" else "best_effort",
                          req.idempotency_key, req.obligation_key, req.window)
        self.intake(req)

    @precondition(lambda self: len(self.model.notes) < MAX_ROWS - 4)
    @rule(data=st.data(), n=st.integers(2, 4))
    def concurrent_intakes(self, data, n) -> None:
        """N13, N15, N28: 2-4 intakes at once, each on its own connection. The model applies the
        notifications the book created in the order the book serialised them — the seq of each one's
        creation fact: intakes of one obligation queue on its claim row, so its facts are written in
        that order — then checks every intake that created nothing against the scopes it then holds."""
        reqs = [data.draw(st.sampled_from(self.sent) if self.sent and k % 2 else REQUESTS, label=f"intake {k}")
                for k in range(n)]
        now = self.clock.now()
        self.sent += reqs

        async def together() -> list[Any]:
            return await asyncio.gather(*(self.send(b, r) for b, r in zip(self.others, reqs, strict=False)),
                                        return_exceptions=True)

        got = self.run(together())
        for g in got:
            if isinstance(g, BaseException) and not isinstance(g, IdempotencyMismatch):
                raise g
        created = [(r, g) for r, g in zip(reqs, got, strict=True) if not isinstance(g, BaseException) and g.created]
        seqs = {g.id: self.run(history(self.book, "notification", g.id))[0].seq for _, g in created}
        for req, g in sorted(created, key=lambda item: seqs[item[1].id]):
            self.model.accept(req, g.id, now)
        for req, g in zip(reqs, got, strict=True):
            if not isinstance(g, BaseException) and g.created:
                assert g.obligation_owner_id == self.model.obligation_owner(g.id), \
                    f"N15, N16, N24: racing {req} answered {g}; the model says {self.model.notes[g.id]}"
                continue
            want = self.model.expect_intake(req, now)
            if isinstance(g, IdempotencyMismatch):
                assert want.kind == "conflict", f"N13: racing {req} conflicted; the model expected {want}"
            else:
                assert (want.kind, want.id) == ("existing", g.id), f"N13: racing {req} returned {g}; model: {want}"
        event(f"concurrent intakes: {len(created)} of {n} created")

    # -- delivery and time -------------------------------------------------------------------------

    def draw_steps(self, steps: list[str]) -> None:
        """What the channel answers to each live notification (followers too: one may be promoted),
        by the intake's serial number: racing intakes may make other ids owners from run to run, and
        what Hypothesis draws must not depend on that."""
        for nid in (n.id for n in self.model.notes.values() if n.status in LIVE):
            self.steps[nid] = steps[self.serial[nid] % len(steps)]

    def passes(self) -> None:
        """Passes at the current time until one claims nothing; the model takes the same due work."""
        now = self.clock.now()
        self.took = []
        for _ in range(20):
            counts = self.run(deliver_due_notifications(self.book, self.channels, deadline=DEADLINE))
            if counts["claimed"] == 0:
                break
        elected, limited = self.model.elections, self.model.limited
        expected = self.model.deliver(now, lambda nid: self.steps.get(nid, "success"))
        if self.model.elections > elected:
            event("pass: successor elected")
        if self.model.limited > limited:
            event("pass: rate_limited")
        assert sorted(self.took) == sorted(expected), (
            f"N15, N20: the passes attempted {sorted(self.took)}; the model's due work was {sorted(expected)} "
            "(a follower is never work; the oldest follower is the successor)")
        event(f"pass: {min(len(expected), 3)}{'+' if len(expected) >= 3 else ''} attempts")

    @rule(steps=STEP_SLOTS)
    def deliver(self, steps) -> None:
        """N17-N20: owners deliver or fail as drawn; followers are never work."""
        self.draw_steps(steps)
        self.passes()

    @rule(steps=STEP_SLOTS)
    def exhaust_cycle(self, steps) -> None:
        """N2, N19, N20: passes and backoffs until a GUARANTEED cycle is spent (two: a successor elected
        in the first is due at once and may spend its own)."""
        self.draw_steps(steps)
        for _ in range(6):
            self.passes()
            self.clock.advance(2.0)

    @rule(seconds=st.sampled_from((10.5, 40.5)))
    def empty_bucket(self, seconds) -> None:
        """N8, N27: the email channel's bucket is emptied until ``seconds`` from now (as a provider's
        Retry-After holds it, N42): owners due meanwhile wait in rate_limited, still holding their obligation."""
        now = self.clock.now()
        self.run(self.hold(seconds, now))
        self.model.hold(now, seconds)
        event("bucket held")
        self.passes()  # whatever is due now waits in rate_limited

    async def hold(self, seconds: float, now: float) -> None:
        await ensure_bucket(self.book, "email", "all", capacity=BUCKET_RATE, refill_per_second=BUCKET_RATE)
        async with self.book.begin() as tx:
            await hold_bucket(tx, "email", "all", seconds=seconds, now=now)

    @rule(seconds=st.sampled_from((1.0, 5.0, 30.0, 301.0)))
    def tick(self, seconds) -> None:
        """Windows (N16, N21) and backoffs pass."""
        self.clock.advance(seconds)

    # -- operators ---------------------------------------------------------------------------------

    def pick(self, data) -> str:  # noqa: ANN001
        """Mostly a failure, sometimes any notification; the draws have the same shape whatever the
        state (racing intakes make the state differ from run to run)."""
        by_serial = self.serial.__getitem__
        failed, every = sorted(self.model.failures(), key=by_serial), sorted(self.model.notes, key=by_serial)
        prefer = data.draw(st.integers(0, 4), label="failed?")
        index = data.draw(st.integers(0, 63), label="notification")
        pool = failed if failed and prefer else every
        return pool[index % len(pool)]

    @precondition(lambda self: self.model.notes)
    @rule(data=st.data())
    def replay(self, data) -> None:
        """N25-N28: accepted exactly when the model says; otherwise its reason and blocker."""
        nid = self.pick(data)
        now = self.clock.now()
        block = self.model.replay_block(nid, now)
        try:
            done = self.run(replay_notification(self.book, nid, actor=ALICE))
        except RecoveryRefused as refused:
            assert block is not None, f"N27: replay of {nid} refused ({refused.reason}); the model accepts it"
            assert (refused.reason, refused.blocked_by) == block, \
                f"N27: replay of {nid} refused as {(refused.reason, refused.blocked_by)}; the model says {block}"
            holder = self.model.notes.get(refused.blocked_by or "")
            event(f"replay refused: {block[0]}{' (rate_limited)' if holder and holder.status == 'rate_limited' else ''}")
            return
        assert block is None, f"N27: replay of {nid} accepted; the model refuses it: {block}"
        covered = self.model.replay(nid, now)
        assert (done.id, done.cycle, done.covered) == (nid, self.model.notes[nid].cycle, covered), \
            f"N25, N28: replay of {nid} gave {done}; the model: cycle {self.model.notes[nid].cycle}, covers {covered}"
        event(f"replay accepted{' (covering)' if covered else ''}")

    @precondition(lambda self: self.model.notes)
    @rule(data=st.data())
    def resolve(self, data) -> None:
        """N29: only an unresolved dead letter can be resolved."""
        nid = self.pick(data)
        ok = self.model.can_resolve(nid)
        try:
            self.run(resolve_notification(self.book, nid, reason="handled by phone", actor=ALICE))
        except RecoveryRefused as refused:
            assert not ok and refused.reason == "not_dead_letter", f"N29: resolve of {nid} refused: {refused.reason}"
            event("resolve refused")
            return
        assert ok, f"N29: resolve of {nid} accepted; the model refuses it"
        self.model.resolve(nid)
        event("resolve accepted")

    @precondition(lambda self: self.model.notes)
    @rule(horizon=st.sampled_from((1.0, 30.0, 400.0)))
    def retain(self, horizon) -> None:
        """N14, N30: a retention run at the youngest cutoff the horizon allows removes exactly what the
        model says may go, protects the rest, and frees the removed notifications' idempotency keys."""
        now = self.clock.now()
        rows, _ = self.run(self.read_all())
        notes, claims = self.model.retention(before=now - horizon, edge=now - horizon, now=now,
                                             updated={i: r["updated_at"] for i, r in rows.items()})
        report = self.run(apply_notification_retention(self.book, before=now - horizon, horizon=horizon))
        assert set(report.notifications) == notes, \
            f"N30: retention removed {sorted(report.notifications)}; the model removes {sorted(notes)}"
        self.model.forget(notes, claims)
        event(f"retention removed {'some' if notes else 'none'}")

    # -- invariants --------------------------------------------------------------------------------

    async def read_all(self) -> tuple[dict[str, dict], dict[str, dict]]:
        async with self.book.read() as conn:
            rows = {r.id: dict(r._mapping) for r in await conn.execute(sa.select(notifications))}
            claims = {r.id: dict(r._mapping) for r in await conn.execute(sa.select(dedup_claims))}
        return rows, claims

    @invariant()
    def the_book_holds(self) -> None:
        """The book is the model, ownership holds in it, and its rows are the fold of their facts: three checks of
        one read (each read of the two tables is a round trip per row batch; the checks only look)."""
        rows, claims = self.run(self.read_all())
        self.book_is_the_model(rows, claims)
        self.ownership_holds_in_the_book(rows, claims)
        self.rows_are_the_fold_of_their_facts(rows, claims)

    def book_is_the_model(self, rows: dict[str, dict], claims: dict[str, dict]) -> None:
        assert set(rows) == set(self.model.notes), \
            f"rows {sorted(rows)} but the model has {sorted(self.model.notes)}"
        for nid, row in rows.items():
            got = {k: row[k] for k in ("status", "obligation_owner_id", "generation", "dedup_successor_id", "cycle",
                                       "attempts", "cycle_attempts", "dead_letter", "replayed_in")}
            got["resolved"] = row["resolved_at"] is not None
            want = self.model.row(nid)
            if row["status"] in LIVE:
                got["next_attempt_at"] = row["next_attempt_at"]
            else:
                want.pop("next_attempt_at")
            assert got == want, f"notification {nid}: the book has\n  {got}\nthe model\n  {want}"
        expected = {dedup_claim_id(*ob): ob for ob in self.model.claims}
        assert set(claims) == set(expected), f"claims {sorted(claims)}; the model has {sorted(expected.values())}"
        for cid, c in claims.items():
            got = {k: c[k] for k in ("status", "owner_id", "generation", "window_until")}
            want = self.model.claim_row(expected[cid])
            assert got == want, f"claim of {expected[cid]}: the book has {got}, the model {want}"

    def ownership_holds_in_the_book(self, rows: dict[str, dict], claims: dict[str, dict]) -> None:
        """The issue's invariants, read from the book alone."""
        owners: dict[str, list[str]] = {}
        for r in rows.values():
            if r["dedup_claim_id"] is not None and r["status"] in LIVE and r["obligation_owner_id"] is None:
                owners.setdefault(r["dedup_claim_id"], []).append(r["id"])
        for cid, ids in owners.items():
            assert len(ids) == 1, f"N16: obligation {cid[:8]} has live owners {ids}"
            assert (claims[cid]["status"], claims[cid]["owner_id"]) == ("owned", ids[0]), \
                f"the claim {claims[cid]} does not name the live owner {ids[0]}"
        for r in rows.values():
            owner = r["obligation_owner_id"]
            if r["status"] == "pending" and owner is not None:
                c = claims[r["dedup_claim_id"]]
                assert (c["status"], c["owner_id"], c["generation"]) == ("owned", owner, r["generation"]), \
                    f"N15: follower {r['id']} links to {owner} at generation {r['generation']}; the claim is {c}"
                assert rows[owner]["status"] in LIVE, f"N15: follower {r['id']} follows {rows[owner]['status']} {owner}"
            if r["status"] == "deduplicated":
                assert rows[owner]["status"] == "delivered", \
                    f"N17: {r['id']} deduplicated by {owner}, which is {rows[owner]['status']}"
                delivered = [f.seq for f in self.run(history(self.book, "notification", owner))
                             if f.status == "delivered"]
                deduplicated = [f.seq for f in self.run(history(self.book, "notification", r["id"]))
                                if f.status == "deduplicated"]
                assert delivered and delivered[0] < deduplicated[0], \
                    f"N17: {r['id']} was deduplicated before its owner {owner} delivered"

    @invariant()
    def dead_letters_show_the_model_s_block(self) -> None:
        """N26, N27: the view lists the model's dead letters, each with the model's block reason."""
        now = self.clock.now()
        view = self.run(list_dead_letters(self.book, limit=1000))
        assert sorted(d.id for d in view) == self.model.dead_letters()
        for d in view:
            block = self.model.replay_block(d.id, now) or (None, None)
            if block[0] == "owner_pending" and self.model.notes[block[1]].status == "rate_limited":
                event("dead-letter view: owner_pending (rate_limited)")
            assert (d.replay_block_reason, d.replay_blocked_by) == block, \
                f"N26: dead letter {d['id']} shows {(d['replay_block_reason'], d['replay_blocked_by'])}; model {block}"

    def rows_are_the_fold_of_their_facts(self, rows: dict[str, dict], claims: dict[str, dict]) -> None:
        """Every row that changed since the last step is the fold of its facts (``replay``); ``verify``
        checks every entity of both lifecycles, so facts that moved under an unchanged row are caught too."""
        for etype, found in (("notification", rows), ("dedup_claim", claims)):
            for eid, row in found.items():
                if self.folded.get((etype, eid)) == row:
                    continue
                assert self.run(replay(self.book, etype, eid)) == row, f"{etype} {eid}: the row is not its facts' fold"
                self.folded[(etype, eid)] = row
        # verify reads every fact and row: a step that changed neither (no row differs from the last verified
        # state, no fact was added or removed: facts are only ever inserted or purged) cannot change its answer.
        state = (rows, claims, self.run(self.facts_mark()))
        if state == self.verified:
            return
        for etype in ("notification", "dedup_claim"):
            report = self.run(verify(self.book, etype))
            assert report.ok, report
        self.verified = state

    async def facts_mark(self) -> tuple[int, int | None]:
        async with self.book.read() as conn:
            count, last = (await conn.execute(sa.select(sa.func.count(), sa.func.max(facts_table.c.seq)))).one()
        return count, last

    def teardown(self) -> None:
        try:
            for b in self.others:
                self.run(b.engine.dispose())
            self.run(self.book.engine.dispose())
        finally:
            intake_module.new_id = self._real_new_id
            self.runner.close()


def machine_for(backend: str, url_factory) -> type[OwnershipMachine]:  # noqa: ANN001
    return type(f"OwnershipMachine_{backend}", (OwnershipMachine,),
                {"url": staticmethod(url_factory), "backend": backend})


def test_ownership_state_machine_sqlite(tmp_path_factory):
    """N13-N29 against the reference model, on SQLite (a file per example, shared by its connections)."""
    SEEN.clear()
    made: list[str | None] = []

    def url() -> str:
        if not made or made[-1] is None:
            made.append(f"sqlite:///{tmp_path_factory.mktemp('own_sm') / 'sm.db'}")
        return made[-1]  # type: ignore[return-value]

    class Machine(machine_for("sqlite", url)):
        def __init__(self) -> None:
            made.append(None)
            super().__init__()

    run_state_machine_as_test(Machine, settings=SETTINGS)
    print("\nsqlite paths:", dict(sorted(SEEN.items())))


@pytest.mark.postgres
def test_ownership_state_machine_postgres(pg_url):
    """The same machine on PostgreSQL (schema reset per example)."""
    SEEN.clear()
    run_state_machine_as_test(machine_for("postgres", lambda: pg_url), settings=SETTINGS)
    print("\npostgres paths:", dict(sorted(SEEN.items())))
