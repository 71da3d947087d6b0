"""Notification delivery as a Hypothesis state machine (issues 12, 25; specs/notifications.md N1, N2, N4-N10b).

Three workers — each a Book on its own engine; two share the FakeClock, the third's clock can be
skewed ahead — interleave the steps of attempts: scan and claim, ONE channel call of a held lease
(``attempt_channel`` with a ScriptedChannel whose next behaviour the rule draws: success, reject,
hang before/after admission under a tiny real deadline, provider 429, raise before/after), or a whole
``run_attempt``, then ``finalize``. A worker may crash between any two steps (it drops its lease),
right after an admission or a guarded retry, after its evidence was written and before it finalized,
and twice in a row on one notification (N10a, N10b);
evidence writes fail at random (``calls.create`` / ``calls.apply_many`` patched for one call
inside the rule); rate-limit buckets hold few tokens; the clock jumps past leases and deadlines.
Every lease ever won stays drawable, so stale finalizations come late and must be fenced.

After every step notification_model.problems reads the database back and checks the invariants;
teardown checks liveness (crashes and failures over, channels succeeding, time advanced: every
notification ends delivered or failed) and verify. ``HYPOTHESIS_PROFILE=deep`` runs far more.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from profiles import examples
import statebook.outbox.notifications.intake as intake_module
from statebook.adapters.db import connect, open_book, reset_schema
from statebook.lifecycle import Book, FakeClock, verify
from statebook.outbox.notifications import Delivery, LeaseLost, NoToken, ProviderOutcome, send_notification
from statebook.outbox.notifications import calls
from statebook.outbox.notifications.buckets import ensure_bucket
from statebook.outbox.notifications.channels import CHANNEL_NAMES, EPHEMERAL, PERSISTENT_ORDER
from statebook.outbox.notifications.attempts import AttemptResult, EvidenceLost, Lease, Recorded
from statebook.outbox.notifications.calls import attempt_channel, run_attempt
from statebook.outbox.notifications.delivery import claim, deliver_due_notifications, finalize, scan_due
from statebook.outbox.notifications.scripted import ScriptedChannel

from notification_model import SEEN, SETTLED, TERMINAL, Snapshot, event, problems, snapshot

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
SETTINGS = settings(
    max_examples=examples(40),  # deep: 400
    stateful_step_count=80 if DEEP else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
WORKERS = 3
DEADLINE = 5.0
"""The adapter deadline in real seconds: scripted sends answer at once and a hang ends itself as the deadline would
(:meth:`Checked.hang`), so no deadline ever cuts a database write: how long one takes on a busy machine would
make runs differ, which Hypothesis rejects. The channel contract tests cut real hangs with real deadlines."""
LEASE = 30.0
"""A lease shorter than the default, so clock jumps lapse it often; the deadline always fits."""
LIVENESS_ROUNDS = 16
BEHAVIOURS = st.sampled_from(("success", "success", "reject", "hang_before", "hang_after", "limited",
                              "raise_before", "raise_after", "retry_success"))
STORAGE = st.sampled_from(("ok",) * 8 + ("fail_started", "fail_result"))
SELECTIONS = st.lists(st.sampled_from(CHANNEL_NAMES), min_size=1, max_size=4, unique=True)


class StorageDown(OSError):
    """An evidence write that fails (the machine's stand-in for a lost database)."""


@dataclass
class Worker:
    book: Book
    clock: Any
    candidates: list = field(default_factory=list)
    lease: Lease | None = None
    seen: list[Recorded] = field(default_factory=list)  # this attempt's observations so far
    done: bool = False  # the attempt has nothing left to call

    def forget(self) -> None:
        self.candidates, self.lease, self.seen, self.done = [], None, [], False


class SkewedClock:
    """A worker's clock: the shared FakeClock plus a skew that only grows."""

    def __init__(self, base: FakeClock) -> None:
        self.base, self.skew = base, 0.0

    def now(self) -> float:
        return self.base.now() + self.skew


class CheckedGuard:
    """Wraps the runtime's guard: right after ``admit`` returns (right before the provider effect) the
    started fact must already be visible to another connection."""

    def __init__(self, inner: Any, machine: NotificationMachine) -> None:
        self.inner, self.machine = inner, machine

    async def admit(self) -> None:
        await self.inner.admit()
        aid = self.inner.attempt_id
        got = await snapshot_attempt(self.machine.book, aid)
        if got is not None and got["status"] == "started":
            lease = self.inner.lease
            self.machine.admitted_seen.add((lease.notification_id, self.inner.channel, lease.attempt))

    async def guard_provider_attempt(self) -> None:
        await self.inner.guard_provider_attempt()

    def remaining(self) -> float:
        return self.inner.remaining()


async def snapshot_attempt(book: Book, attempt_id: str | None) -> dict | None:
    from statebook.lifecycle.replay import read_row

    return None if attempt_id is None else await read_row(book, "channel_attempt", attempt_id)


class Checked(ScriptedChannel):
    machine: Any = None

    async def hang(self) -> None:
        raise TimeoutError("the adapter deadline, at once")

    async def send(self, d, guard):  # noqa: ANN001
        return await super().send(d, CheckedGuard(guard, self.machine))


class NotificationMachine(RuleBasedStateMachine):
    url: Any = None
    backend = ""

    def __init__(self) -> None:
        super().__init__()
        # Deterministic ids: the scan orders same-instant rows by id, and replays must not diverge.
        serial = itertools.count()
        self._real_new_id = intake_module.new_id
        intake_module.new_id = lambda: hashlib.sha256(f"nm-{next(serial)}".encode()).hexdigest()[:32]
        self.runner = asyncio.Runner()
        self.clock = FakeClock()
        self.skewed = SkewedClock(self.clock)
        try:
            self.book = self.run(self._open())
            self.workers = [Worker(self.book, self.clock)]
            for clock in (self.clock, self.skewed):
                self.workers.append(Worker(Book(connect(self.url()), self.book.registry, clock), clock))
        except BaseException:
            intake_module.new_id = self._real_new_id
            self.runner.close()
            raise
        self.channels: dict[str, Checked] = {}
        for name in CHANNEL_NAMES:
            ch = Checked(name, ["success"])
            ch.machine = self
            self.channels[name] = ch
        self.admitted_seen: set[tuple[str, str, int]] = set()
        self.written_by: dict[str, str] = {}
        self.leases: list[tuple[Lease, AttemptResult]] = []  # every lease won, with what it found
        self.last: Snapshot | None = None

    async def _open(self) -> Book:
        book = await open_book(self.url(), clock=self.clock)
        if self.backend == "postgres":
            await reset_schema(book.engine)
        return book

    def run(self, coro):  # noqa: ANN001
        return self.runner.run(coro)

    def snap(self) -> Snapshot:
        return self.run(snapshot(self.book))

    def effects(self) -> list[tuple[str, str, int]]:
        return [(d.notification_id, d.channel, d.attempt) for ch in self.channels.values() for d in ch.effects]

    # -- intake and buckets ----------------------------------------------------------------------

    @initialize(n=st.integers(1, 3), selection=SELECTIONS, best_effort=st.booleans(),
                limited=st.lists(st.sampled_from(CHANNEL_NAMES), max_size=3, unique=True))
    def some_work(self, n, selection, best_effort, limited):
        """A few notifications up front, and buckets of one token (refilled every 20 s) on some channels."""
        for name in limited:
            self.bucket(name, 1, 0.05)
        for _ in range(n):
            self.accept(selection, best_effort)

    @precondition(lambda self: len(self.last.rows) < 6 if self.last else True)
    @rule(selection=SELECTIONS, best_effort=st.booleans())
    def accept(self, selection, best_effort):
        """A valid selection: WebSocket alone is only accepted as BEST_EFFORT."""
        only_ws = all(n in EPHEMERAL for n in selection)
        mode = "best_effort" if best_effort or only_ws else "guaranteed"
        self.run(send_notification(self.book, recipient="ops", content={"n": 1}, mode=mode, channels=selection))

    @rule(channel=st.sampled_from(CHANNEL_NAMES), capacity=st.sampled_from((1, 1, 2)),
          refill=st.sampled_from((0.05, 0.5)))
    def bucket(self, channel, capacity, refill):
        self.run(ensure_bucket(self.book, channel, "all", capacity=capacity, refill_per_second=refill))

    # -- workers, one step at a time ---------------------------------------------------------------

    def pick(self, data, test) -> Worker:  # noqa: ANN001
        ready = [w for w in self.workers if test(w)]
        return ready[data.draw(st.integers(0, len(ready) - 1), label="worker")]

    @precondition(lambda self: any(w.lease is None for w in self.workers))
    @rule(data=st.data())
    def scan_and_claim(self, data):
        """N2, N5, N10a: a claim wins only when the row is still what the scan read; it writes a fresh token
        — or settles the notification from the success its lapsed claim recorded."""
        self.claim_with(self.pick(data, lambda w: w.lease is None), data)

    def claim_with(self, w: Worker, data) -> Lease | None:  # noqa: ANN001
        found = w.candidates or self.run(scan_due(w.book, now=w.clock.now()))
        w.forget()
        if not found:
            return None
        cand = found[data.draw(st.integers(0, len(found) - 1), label="candidate")]
        lease = self.run(claim(w.book, cand, now=w.clock.now(), lease_seconds=LEASE))
        event(f"claim: {'won' if lease else 'none'} from {cand.status}{' (lapsed)' if cand.claim_id else ''}"
              f"{' at risk' if lease and lease.duplicate_risk else ''}")
        if lease is None:
            facts = self.snap().notification_facts(cand.id)
            if facts[-1].reason_code == SETTLED and facts[-1].at == w.clock.now():
                event("claim: settled from the recorded success")
            return lease
        row = self.snap().rows[lease.notification_id]
        assert (row["claim_id"], row["cycle_attempts"]) == (lease.claim_id, lease.cycle_attempt)
        w.lease = lease
        return lease

    @precondition(lambda self: any(w.lease is None for w in self.workers))
    @rule(data=st.data())
    def scan_only(self, data):
        """A worker scans now and claims later (scan_and_claim): its candidates may be stale by then."""
        w = self.pick(data, lambda w: w.lease is None)
        w.candidates = self.run(scan_due(w.book, now=w.clock.now()))

    def next_channel(self, w: Worker) -> str | None:
        """What run_attempt would call next: GUARANTEED persistent channels in order until a success,
        then WebSocket; BEST_EFFORT every selected channel (here one after the other)."""
        lease = w.lease
        assert lease is not None
        called = {r.channel for r in w.seen}
        if lease.mode == "guaranteed":
            won = any(r.observation.outcome is ProviderOutcome.SUCCESS and r.channel in PERSISTENT_ORDER
                      for r in w.seen)
            for name in lease.channels:
                if name not in called and (name in EPHEMERAL or not won):
                    return name
            return None
        return next((n for n in lease.channels if n not in called), None)

    @contextlib.contextmanager
    def storage(self, mode: str):
        """Evidence writes fail for this rule: the started fact (``create`` with status started) or
        the result (the admitted observation's result through ``apply_many``, or a direct ``create``);
        a provider retry's record still succeeds, so a retried send can be left ``started``."""
        real_create, real_apply = calls.create, calls.apply_many

        async def create(book, entity_type, **kw):  # noqa: ANN001
            if entity_type == "channel_attempt" and (mode == "fail_result") != (kw.get("status") == "started"):
                raise StorageDown("disk full")
            return await real_create(book, entity_type, **kw)

        async def apply_many(book, commands, **kw):  # noqa: ANN001
            if mode == "fail_result" and any(c.entity_type == "channel_attempt" and c.target != "started"
                                             for c in commands):
                raise StorageDown("disk full")
            return await real_apply(book, commands, **kw)

        if mode != "ok":
            calls.create, calls.apply_many = create, apply_many
        try:
            yield
        finally:
            calls.create, calls.apply_many = real_create, real_apply

    @precondition(lambda self: any(w.lease is not None and not w.done for w in self.workers))
    @rule(data=st.data(), behaviour=BEHAVIOURS, storage=STORAGE)
    def call_one_channel(self, data, behaviour, storage):
        """N4-N7: one guarded channel call; a lost lease or lost evidence ends the attempt unfinalized."""
        w = self.pick(data, lambda w: w.lease is not None and not w.done)
        lease = w.lease
        name = self.next_channel(w)
        if name is None:
            w.done = True
            return
        ch = self.channels[name]
        ch.script = (behaviour,)
        before = self.snap()
        effects = len(ch.effects)
        risk = lease.duplicate_risk or any(r.observation.outcome is ProviderOutcome.UNKNOWN for r in w.seen)
        try:
            with self.storage(storage):
                recorded = self.run(attempt_channel(w.book, lease, ch, deadline=DEADLINE, duplicate_risk=risk))
        except LeaseLost:
            event(f"channel: lease lost ({behaviour})")
            w.forget()
            return
        except EvidenceLost:
            event(f"channel: evidence lost ({storage}, {behaviour})")
            after = self.snap()
            new = set(after.attempts) - set(before.attempts)
            assert not any(after.attempts[a]["status"] == "rejected" for a in new), "N7: a rejection was recorded"
            if storage == "fail_started":
                assert len(ch.effects) == effects, "N7: an effect after a failed admission"
            row = after.rows[lease.notification_id]
            assert row == before.rows[lease.notification_id], "N7: the notification changed"
            w.forget()  # N7: the claim is left to lapse
            return
        event(f"channel: {name} {recorded.observation.outcome.value}")
        w.seen.append(recorded)
        if self.next_channel(w) is None:
            w.done = True

    @precondition(lambda self: any(w.lease is not None and not w.done for w in self.workers))
    @rule(data=st.data(), behaviour=BEHAVIOURS, storage=STORAGE)
    def call_one_channel_again(self, data, behaviour, storage):
        """A second entry: Hypothesis picks rules uniformly, and channel calls are the heart of it."""
        self.call_one_channel(data, behaviour, storage)

    @precondition(lambda self: any(w.lease is not None and not w.seen for w in self.workers))
    @rule(data=st.data(), behaviours=st.fixed_dictionaries({n: BEHAVIOURS for n in CHANNEL_NAMES}))
    def whole_attempt(self, data, behaviours):
        """N1, N6-N8: run_attempt for a whole attempt; finalize is a separate step."""
        w = self.pick(data, lambda w: w.lease is not None and not w.seen)
        for name, ch in self.channels.items():
            ch.script = (behaviours[name],)
        result = self.run(run_attempt(w.book, w.lease, self.channels, deadline=DEADLINE))
        event(f"run_attempt: {result.outcome}")
        if result.outcome is None:
            w.forget()
            return
        w.seen, w.done = list(result.observations), True
        self.leases.append((w.lease, result))

    def outcome(self, lease: Lease, seen: list[Recorded]) -> AttemptResult:
        """What run_attempt would make of these observations."""
        result = AttemptResult(None, list(seen))
        wins = [r.channel for r in seen if r.observation.outcome is ProviderOutcome.SUCCESS
                and (lease.mode != "guaranteed" or r.channel in PERSISTENT_ORDER)]
        if wins:
            result.outcome, result.delivered_channel = "delivered", wins[0]
        elif seen and all(r.no_token for r in seen):
            result.outcome = "rate_limited"
            result.wait = min(r.observation.retry_after or 0.0 for r in seen)
        elif lease.mode != "guaranteed":
            result.outcome = "failed"
        else:
            result.outcome = "retry" if lease.cycle_attempt < lease.attempt_limit else "dead_letter"
        result.error = "machine" if not wins else None
        return result

    @precondition(lambda self: any(w.lease is not None and w.done and w.seen for w in self.workers))
    @rule(data=st.data())
    def finalize_lease(self, data):
        w = self.pick(data, lambda w: w.lease is not None and w.done and w.seen)
        lease, result = w.lease, self.outcome(w.lease, w.seen)
        w.forget()
        self.leases.append((lease, result))
        self.check_finalize(w, lease, result)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def stale_finalize(self, data):
        """N5: a finalization with any lease ever won, however late: only the current claim applies."""
        lease, result = data.draw(st.sampled_from(self.leases), label="lease")
        self.check_finalize(self.workers[data.draw(st.integers(0, WORKERS - 1), label="worker")], lease, result)

    def check_finalize(self, w: Worker, lease: Lease, result: AttemptResult) -> None:
        before = self.snap()
        row = before.rows[lease.notification_id]
        current = row["status"] == "pending" and row["claim_id"] == lease.claim_id
        got = self.run(finalize(w.book, lease, result, now=w.clock.now()))
        event(f"finalize: {got if current else 'stale ' + got}")
        after = self.snap()
        facts = after.notification_facts(lease.notification_id)
        if not current:
            assert got == "conflict", (got, lease, row)
            assert len(facts) == len(before.notification_facts(lease.notification_id))
            return
        assert got == result.outcome, (got, result)
        self.written_by[facts[-1].id] = lease.claim_id

    @precondition(lambda self: any(w.lease is not None for w in self.workers))
    @rule(data=st.data(), really=st.sampled_from((False, False, True)))
    def crash(self, data, really):
        """A worker dies between two steps: it drops its lease without finalizing."""
        if not really:
            return
        self.pick(data, lambda w: w.lease is not None).forget()
        event("crash")

    @precondition(lambda self: any(w.lease is not None and w.seen for w in self.workers))
    @rule(data=st.data())
    def crash_after_evidence(self, data):
        """N10a: a worker dies after its observations were written and before it finalized — perhaps after
        a success: the next claim must settle from that success rather than send again."""
        w = self.pick(data, lambda w: w.lease is not None and w.seen)
        event(f"crash after evidence ({', '.join(r.observation.outcome.value for r in w.seen)})")
        w.forget()

    def die(self, w: Worker, lease: Lease, how: str | None) -> None:
        """Worker ``w`` holding ``lease`` dies: before any admission (None), killed right after an
        admission and the provider effect (``admitted``), or after a guarded retry too (``retried``),
        or after its success was recorded (``success``)."""
        name = self.next_channel(w)
        if how is not None and name is not None:
            ch = self.channels[name]
            if how == "success":
                ch.script = ("success",)
                with contextlib.suppress(LeaseLost, EvidenceLost):
                    self.run(attempt_channel(w.book, lease, ch, deadline=DEADLINE, duplicate_risk=lease.duplicate_risk))
            else:
                with contextlib.suppress(LeaseLost, NoToken):
                    self.run(self.killed_after_admission(w, lease, ch, retries=int(how == "retried")))
        w.forget()

    async def killed_after_admission(self, w: Worker, lease: Lease, ch: Checked, *, retries: int) -> None:
        guard = CheckedGuard(calls.LeaseGuard(w.book, lease, ch.name, deadline_end=w.clock.now() + DEADLINE,
                                                 duplicate_risk=lease.duplicate_risk), self)
        sent = Delivery(lease.notification_id, lease.recipient, lease.content, lease.cycle, lease.attempt, ch.name)
        await guard.admit()
        ch.effects.append(sent)
        for _ in range(retries):
            await guard.guard_provider_attempt()
            ch.effects.append(sent)

    @precondition(lambda self: any(w.lease is None for w in self.workers))
    @rule(data=st.data(), how=st.sampled_from((None, "admitted", "retried", "success")))
    def claim_and_die(self, data, how):
        """N10a, N10b: a worker claims and dies at once — before any admission, right after one, after a
        guarded retry, or after a recorded success."""
        w = self.pick(data, lambda w: w.lease is None)
        w.candidates = []
        lease = self.claim_with(w, data)
        if lease is not None:
            event(f"claim and die ({how or 'before admission'}{', at risk' if lease.duplicate_risk else ''})")
            self.die(w, lease, how)

    @precondition(lambda self: any(w.lease is None for w in self.workers))
    @rule(data=st.data(), how=st.sampled_from(("admitted", "retried", "success")))
    def die_twice(self, data, how):
        """N10a, N10b: two crashes in a row on one notification: a worker is killed after an admission (or
        its recorded success), its lease lapses, the next claimant dies before admitting anything, and
        its lease lapses too. Whoever claims it next must still send it as a duplicate risk — or must
        have settled it from the success."""
        w = self.pick(data, lambda w: w.lease is None)
        w.candidates = []
        first = self.claim_with(w, data)
        if first is None:
            return
        self.die(w, first, how)
        self.clock.advance(self.skewed.skew + LEASE + 1)
        again = [c for c in self.run(scan_due(w.book, now=w.clock.now())) if c.id == first.notification_id]
        w.candidates = again
        second = self.claim_with(w, data) if again else None
        if second is not None:
            self.die(w, second, None)
            self.clock.advance(LEASE + 1)
        event(f"die twice ({how}; second {'claimed' if second else 'settled or not due'}"
              f"{', at risk' if second is not None and second.duplicate_risk else ''})")

    @rule(seconds=st.sampled_from((0.5, 2.0, 5.0, LEASE + 1, 120.0)))
    def tick(self, seconds):
        self.clock.advance(seconds)

    @rule(seconds=st.sampled_from((1.0, LEASE + 1)))
    def skew_ahead(self, seconds):
        """The third worker's clock runs ahead of the others."""
        self.skewed.skew += seconds

    # -- invariants and liveness ----------------------------------------------------------------------

    @invariant()
    def delivery_invariants(self):
        self.last = self.snap()
        found = problems(self.last, self.book.registry, self.written_by, self.effects(), self.admitted_seen)
        assert not found, "\n".join(found)

    def teardown(self):
        try:
            if sys.exc_info()[0] is None:
                self.check_liveness()
        finally:
            intake_module.new_id = self._real_new_id
            for w in self.workers[1:]:
                self.run(w.book.engine.dispose())
            self.run(self.book.engine.dispose())
            self.runner.close()

    def check_liveness(self):
        """With crashes and failures over, every channel succeeding and time advanced past every
        lease, backoff and bucket refill, passes bring every notification to delivered or failed."""
        for w in self.workers:
            w.forget()
        for ch in self.channels.values():
            ch.script = ("success",)
        self.clock.advance(self.skewed.skew)  # the skewed worker's leases lapse on the shared clock too
        rows: dict[str, dict] = {}
        for _ in range(LIVENESS_ROUNDS):
            self.clock.advance(LEASE + 60)
            self.run(deliver_due_notifications(self.book, self.channels, deadline=DEADLINE, lease_seconds=LEASE))
            self.delivery_invariants()
            rows = self.last.rows
            if all(r["status"] in TERMINAL for r in rows.values()):
                break
        stuck = {i[:8]: (r["status"], r["cycle_attempts"], r["channels"]) for i, r in rows.items()
                 if r["status"] not in TERMINAL}
        assert not stuck, f"liveness: not delivered or failed after {LIVENESS_ROUNDS} passes: {stuck}"
        assert self.run(verify(self.book)).ok


def machine_for(backend: str, url_factory) -> type[NotificationMachine]:  # noqa: ANN001
    return type(f"NotificationMachine_{backend}", (NotificationMachine,),
                {"url": staticmethod(url_factory), "backend": backend})


def test_notification_state_machine_sqlite(tmp_path_factory):
    """N1, N2, N4-N9 under interleaved workers, crashes, lost evidence and clock jumps, on SQLite."""
    SEEN.clear()
    made: list[str] = []

    def url() -> str:  # one file per example; the workers of an example share it
        if not made or made[-1] is None:
            made.append(f"sqlite:///{tmp_path_factory.mktemp('notify_sm') / 'sm.db'}")
        return made[-1]

    class Machine(machine_for("sqlite", url)):
        def __init__(self) -> None:
            made.append(None)  # type: ignore[arg-type]
            super().__init__()

    run_state_machine_as_test(Machine, settings=SETTINGS)
    print("\nsqlite paths:", dict(sorted(SEEN.items())))


@pytest.mark.postgres
def test_notification_state_machine_postgres(pg_url):
    """The same machine on PostgreSQL (schema reset per example)."""
    SEEN.clear()
    run_state_machine_as_test(machine_for("postgres", lambda: pg_url), settings=SETTINGS)
    print("\npostgres paths:", dict(sorted(SEEN.items())))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_stale_scan_of_a_rate_limited_notification_does_not_claim_it_before_it_is_due(book, clock):
    """N8 / N9: the machine's "claimed before due" invariant (notification_model) states the rule; its
    random runs rarely reach this interleaving, so it is shown here step by step. The stale claim also
    repeats the cumulative attempt number of the claim before it (attempts 2 twice)."""
    await ensure_bucket(book, "email", "all", capacity=1, refill_per_second=0.05)
    spent = await send_notification(book, recipient="ops", content={}, mode="guaranteed", channels=["email"])
    nid = (await send_notification(book, recipient="ops", content={}, mode="guaranteed", channels=["email"])).id
    chans = {"email": ScriptedChannel("email", ["success"])}
    await deliver_due_notifications(book, chans, deadline=DEADLINE, concurrency=1)  # one delivered, one rate_limited
    rows = (await snapshot(book)).rows
    [limited] = [i for i in (spent.id, nid) if rows[i]["status"] == "rate_limited"]
    clock.advance(20)  # due again: the bucket has its token back
    [stale] = [c for c in await scan_due(book, now=clock.now()) if c.id == limited]  # worker A scans
    # worker B claims, finds no token again (a rival took it), and finalizes rate_limited: due in 20 s
    async with book.begin() as tx:
        from statebook.outbox.notifications.buckets import draw
        assert await draw(tx, "email", "all", now=clock.now()) == 0.0
    lease = await claim(book, stale, now=clock.now())
    result = await run_attempt(book, lease, chans, deadline=DEADLINE)
    assert result.outcome == "rate_limited"
    assert await finalize(book, lease, result, now=clock.now()) == "rate_limited"
    row = (await snapshot(book)).rows[limited]
    assert row["next_attempt_at"] > clock.now()
    # worker A claims with its stale candidate: the row is not due, so the claim must not win
    assert await claim(book, stale, now=clock.now()) is None
