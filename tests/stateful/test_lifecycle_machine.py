"""The lifecycle engine against a reference model, as a Hypothesis state machine (L3–L11).

Several actors, each with its own and possibly stale view of the entities, issue transitions —
declared and undeclared edges, the wrong actor type, missing patch or guard fields, stale expected
statuses, stale guard values, undeclared reason codes — on entities of a test lifecycle (``ticket``)
and of the built-in ``dispatch`` and ``schedule_run`` lifecycles. The oracle (lifecycle_model.py)
predicts every answer from a ``transitions`` machine built from the registry; after every step the
invariants compare the database with the model and with the facts.

Each machine instance owns one ``asyncio.Runner``: rules are synchronous and an async engine is
bound to the loop that created it. SQLite gets a fresh file per example; PostgreSQL shares the
session database, emptied before each example.

Profiles (``HYPOTHESIS_PROFILE``): ``ci`` and the default — 25 examples of up to 25 steps;
``deep`` — 300 examples of up to 80 steps.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from lifecycle_model import (
    ACTORS,
    ENTITY_TYPES,
    PURGE_REASONS,
    TEST_META,
    Entity,
    Prediction,
    ReferenceModel,
    TransitionCmd,
    column_values,
    creation_values,
    guardable,
    make_registry,
    tickets,
)

from statebook.adapters.db import connect, create_schema, reset_schema
from statebook.lifecycle import (
    Actor,
    Book,
    EntityNotFound,
    Fact,
    FakeClock,
    Lifecycle,
    Outcome,
    Reason,
    StatebookError,
    TransitionRejected,
    create,
    purge,
    replay,
    transition,
    verify,
)
from statebook.lifecycle.errors import DuplicateEntity, IdempotencyMismatch
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.replay import read_row
from statebook.lifecycle.schema import LIFECYCLE_COLUMNS
from statebook.lifecycle.facts import GENESIS, fact_hash

if os.environ.get("HYPOTHESIS_PROFILE") == "deep":
    MAX_EXAMPLES, STEPS = 300, 80
else:  # "ci" and the everyday default
    MAX_EXAMPLES, STEPS = 25, 25

MACHINE_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

REGISTRY = make_registry()
MAX_MOVING, MAX_ENTITIES = 3, 10  # few entities, so each one travels far along its lifecycle
Key = tuple[str, str]


# -- callers that lose track of a commit ------------------------------------------------------


class AmbiguousCommit(Exception):
    """The transaction committed, but the caller got an error instead of the outcome."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("connection lost after COMMIT")
        self.outcome = outcome


class CallerAborted(Exception):
    """The caller's own work failed inside the transaction it shared with the engine."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("caller failed before COMMIT")
        self.outcome = outcome


async def commit_then_fail(book: Book, op: Callable[[Book], Awaitable[Outcome]]) -> Outcome:
    async with book.begin() as tx:
        out = await op(tx)
    raise AmbiguousCommit(out)


async def join_then_abort(book: Book, op: Callable[[Book], Awaitable[Outcome]]) -> Outcome:
    async with book.begin() as tx:
        out = await op(tx)
        raise CallerAborted(out)


def send(cmd: TransitionCmd) -> Callable[[Book], Awaitable[Outcome]]:
    """The engine call for a model command, on whatever book it is given."""

    def op(book: Book) -> Awaitable[Outcome]:
        return transition(
            book, cmd.entity_type, cmd.entity_id, cmd.target, reason=Reason(cmd.reason_code, cmd.reason_summary),
            actor=cmd.actor, expected=cmd.expected, guards=dict(cmd.guards), patch=dict(cmd.patch),
            idempotency_key=cmd.idempotency_key,
        )

    return op


def reasons_for(lc: Lifecycle, status: str) -> list[str]:
    """Declared codes about ``status`` (any declared code when there is none)."""
    return sorted(r for r in lc.reasons if r.split(".")[1] == status) or sorted(lc.reasons)


def bogus_reasons(lc: Lifecycle, status: str) -> list[str]:
    prefix = sorted(lc.reason_prefixes)[0]
    return [f"{prefix}.{status}.made_up", "ticket.open.created" if prefix != "ticket" else "dispatch.pending.enqueued",
            "Not A Code"]


@dataclass
class Snapshot:
    """What the database holds for the model's entities after one step."""

    rows: dict[Key, dict[str, Any] | None]
    folds: dict[Key, dict[str, Any] | None]
    facts: dict[Key, list[Fact]]
    strays: list[Fact]
    """Facts of entities the model never created."""
    total_facts: int
    table_rows: dict[str, int]


# -- the machine -------------------------------------------------------------------------------


class LifecycleMachine(RuleBasedStateMachine):
    """Random commands by several actors, checked against the reference model (L3–L11).

    Subclasses set ``make_url`` (a database URL per example) and ``shared_database`` (PostgreSQL:
    empty the tables first).
    """

    make_url: Callable[[], str] | None = None
    shared_database = False

    def __init__(self) -> None:
        super().__init__()
        if self.make_url is None:
            raise RuntimeError("run a subclass of LifecycleMachine that sets make_url")
        self.url = self.make_url()
        self.clock = FakeClock()
        self.runner = asyncio.Runner()
        self.book = self.runner.run(self._open())
        self.model = ReferenceModel(REGISTRY)
        self.views: dict[Actor, dict[Key, dict[str, Any]]] = {a: {} for a in ACTORS}
        self.ids = itertools.count(1)
        self.snap: Snapshot | None = None
        self.before: Snapshot | None = None
        self.writes: dict[Key, int] = {}

    async def _open(self) -> Book:
        engine = connect(self.url)
        await create_schema(engine, self.clock, registry=REGISTRY)  # the ticket table's CHECK from it
        if self.shared_database:
            await reset_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(TEST_META.create_all)
            await conn.execute(sa.delete(tickets))
        return Book(engine, REGISTRY, self.clock)

    def teardown(self) -> None:
        try:
            self.runner.run(self.book.engine.dispose())
        finally:
            self.runner.close()
        if self.url.startswith("sqlite:///"):
            for suffix in ("", "-wal", "-shm"):
                Path(self.url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)

    # -- plumbing -----------------------------------------------------------------------------
    def run(self, coro: Awaitable[Any]) -> Any:
        return self.runner.run(coro)  # type: ignore[arg-type]

    def attempt(self, coro: Awaitable[Outcome]) -> tuple[Outcome | None, BaseException | None]:
        try:
            return self.run(coro), None
        except (StatebookError, LookupError, AmbiguousCommit, CallerAborted) as exc:
            return None, exc

    def _step(self) -> None:
        """Start a step: keep the database as it was, expect no writes until a rule says so."""
        self.before = self.snapshot()
        self.snap = None
        self.writes = {}

    def snapshot(self) -> Snapshot:
        if self.snap is None:
            self.snap = self.run(self._read_all())
        return self.snap

    async def _read_all(self) -> Snapshot:
        rows, folds = {}, {}
        for key in self.model.entities:
            folds[key] = await replay(self.book, *key)
            rows[key] = await read_row(self.book, *key)
        count = sa.func.count()
        tables = {t: REGISTRY.get(t).table for t in ENTITY_TYPES}
        async with self.book.read() as conn:
            every = (await conn.execute(sa.select(facts_table).order_by(facts_table.c.seq))).fetchall()
            sizes = (await conn.execute(sa.select(
                *(sa.select(count).select_from(table).scalar_subquery().label(t) for t, table in tables.items())
            ))).one()
        facts: dict[Key, list[Fact]] = {key: [] for key in self.model.entities}
        strays = []
        for record in every:
            fact = Fact.from_row(record)
            facts.get((fact.entity_type, fact.entity_id), strays).append(fact)
        return Snapshot(rows, folds, facts, strays, len(every), dict(sizes._mapping))

    def expect(self, what: str, pred: Prediction, out: Outcome | None, exc: BaseException | None) -> None:
        """The engine's answer must be the one the model predicted."""
        event(f"{what}: {pred.kind}")
        errors = {"rejected": TransitionRejected, "not_found": EntityNotFound, "mismatch": IdempotencyMismatch,
                  "duplicate": DuplicateEntity}
        if pred.kind in errors:
            assert isinstance(exc, errors[pred.kind]), (
                f"{what}: the model predicts {pred}, the engine gave {out or exc!r}"
            )
            if pred.kind == "rejected":
                assert exc.rule in pred.rules, (
                    f"{what}: rejected by rule {exc.rule!r}, the model expects one of {sorted(pred.rules)}: {exc}"
                )
            return
        if exc is not None:
            raise AssertionError(f"{what}: the model predicts {pred}, the engine raised {exc!r}") from exc
        assert out is not None
        got = (out.kind, out.status, out.version, out.replayed)
        if pred.kind == "conflict":
            assert got == ("conflict", pred.status, pred.version, False), f"{what}: predicted {pred}, got {out}"
        elif pred.kind == "applied":
            assert got == ("applied", pred.status, pred.version, False), f"{what}: predicted {pred}, got {out}"
            assert out.fact_id, f"{what}: an applied outcome names its fact: {out}"
        else:
            assert got == ("applied", pred.status, pred.version, True), f"{what}: predicted {pred}, got {out}"
            assert out.fact_id == pred.fact_id, (
                f"{what}: a replay returns the original fact {pred.fact_id}, got {out.fact_id}"
            )

    # -- actors and commands ------------------------------------------------------------------
    def observe_now(self, actor: Actor, entity: Entity) -> dict[str, Any]:
        row = self.run(read_row(self.book, *entity.key))
        # A purged entity is seen as it last was: the actor has not noticed yet.
        self.views[actor][entity.key] = dict(row) if row is not None else dict(entity.data)
        return self.views[actor][entity.key]

    def view(self, actor: Actor, entity: Entity) -> dict[str, Any]:
        seen = self.views[actor].get(entity.key)
        return seen if seen is not None else self.observe_now(actor, entity)

    def pick(self, data: st.DataObject, prefer: str) -> Entity:
        """Any entity (purged ones too), but mostly a live non-terminal one (or a terminal one to purge)."""
        every = list(self.model.entities.values())
        live = [e for e in every if not e.purged and (e.state in e.lc.terminal) == (prefer == "terminal")]
        if live and data.draw(st.integers(0, 99)) < 75:
            return data.draw(st.sampled_from(live))
        return data.draw(st.sampled_from(every))

    def new_id(self, entity_type: str) -> str:
        return f"{entity_type}-{next(self.ids):03d}"

    def draw_command(
        self, data: st.DataObject, actor: Actor, entity: Entity, key: str | None, *, careful: bool = False
    ) -> TransitionCmd:
        """A command as ``actor`` would write it from its view: mostly plausible, sometimes not.

        A ``careful`` actor breaks the policy less often, so its entities travel further.
        """

        def chance(percent: int, careless_percent: int) -> bool:
            return data.draw(st.integers(0, 99)) < (percent if careful else careless_percent)

        lc = entity.lc
        seen = self.view(actor, entity)
        status = seen["status"]
        targets = lc.targets(status)
        if lc.same_status == "allow" and status not in lc.terminal and status not in targets:
            targets.append(status)
        if targets and chance(95, 70):
            target = data.draw(st.sampled_from(targets))
        elif chance(97, 90):
            target = data.draw(st.sampled_from(lc.statuses))
        else:
            target = "limbo"
        edge = lc.edge(status, target)
        if edge is not None and edge.actors and actor.type not in edge.actors and chance(80, 50):
            # Handed to someone allowed to take the edge, who acts on this actor's view.
            actor = data.draw(st.sampled_from([a for a in ACTORS if a.type in edge.actors]))

        if chance(97, 85):
            expected: tuple[str, ...] = (status,)
        elif chance(50, 50):
            expected = (status, data.draw(st.sampled_from(lc.statuses)))
        elif chance(95, 90):
            expected = (data.draw(st.sampled_from(lc.statuses)),)
        else:
            expected = ()

        patch_fields: set[str] = set(data.draw(st.sets(st.sampled_from(sorted(lc.patch_fields)), max_size=2)))
        if edge is not None and chance(97, 85):
            patch_fields |= edge.requires_patch
        if not chance(99, 97):
            outside = [c for c in lc.table.c.keys() if c not in lc.patch_fields]
            patch_fields.add(data.draw(st.sampled_from(outside)))
        patch = {f: data.draw(column_values(lc.table.c[f]), label=f"patch {f}") for f in sorted(patch_fields)}

        guard_fields: set[str] = set(data.draw(st.sets(st.sampled_from(guardable(lc)), max_size=1)))
        if edge is not None and chance(97, 85):
            guard_fields |= edge.requires_guard
        guards = {}
        for g in sorted(guard_fields):
            if chance(95, 65):
                guards[g] = seen.get(g)  # what the actor saw, possibly stale
            else:
                guards[g] = data.draw(column_values(lc.table.c[g]), label=f"guard {g}")

        if chance(97, 90):
            code = data.draw(st.sampled_from(reasons_for(lc, target)))
        else:
            code = data.draw(st.sampled_from(bogus_reasons(lc, target)))
        summary = data.draw(st.sampled_from(["", "as seen", "retry"]))
        return TransitionCmd(lc.entity_type, entity.entity_id, target, code, summary, actor, expected, guards,
                             patch, key)

    def draw_key(self, data: st.DataObject) -> str | None:
        roll = data.draw(st.integers(0, 99))
        if roll < 50:
            return None
        if roll < 85:
            return f"fresh-{next(self.ids)}"
        return data.draw(st.sampled_from(["k1", "k2"]))  # shared by actors and entities on purpose

    def issue(self, what: str, cmd: TransitionCmd) -> Outcome | None:
        """Send one command, check the answer against the model, move the model."""
        pred = self.model.predict_transition(cmd)
        out, exc = self.attempt(send(cmd)(self.book))
        self.expect(what, pred, out, exc)
        self.record(cmd, pred, out)
        return out

    def record(self, cmd: TransitionCmd, pred: Prediction, out: Outcome | None) -> None:
        if pred.kind == "applied":
            assert out is not None and out.fact_id
            self.model.apply_transition(cmd, out.fact_id, self.clock.now())
            self.writes[cmd.key] = self.writes.get(cmd.key, 0) + 1
            self.views[cmd.actor][cmd.key] = dict(self.model.entities[cmd.key].data)
        elif pred.kind == "conflict" and cmd.key in self.views[cmd.actor]:
            self.views[cmd.actor][cmd.key]["status"] = pred.status  # the answer tells the current status

    # -- rules --------------------------------------------------------------------------------
    @initialize(data=st.data())
    def seed(self, data: st.DataObject) -> None:
        """One entity of each lifecycle to start from."""
        self._step()
        for entity_type in ENTITY_TYPES:
            lc = REGISTRY.get(entity_type)
            status = data.draw(st.sampled_from(sorted(lc.initial)), label=f"{entity_type} starts")
            self.create_one(entity_type, self.new_id(entity_type), status, reasons_for(lc, status)[0])

    def create_one(self, entity_type: str, entity_id: str, status: str, code: str) -> None:
        values = creation_values(entity_type, self.clock.now())
        pred = self.model.predict_create(entity_type, entity_id, status, code)
        out, exc = self.attempt(
            create(self.book, entity_type, values=values, status=status, reason=Reason(code, "created"),
                   actor=Actor("system", "test"), entity_id=entity_id)
        )
        self.expect("create", pred, out, exc)
        if pred.writes:
            assert out is not None and out.fact_id
            self.model.apply_create(entity_type, entity_id, status, values, code, "created", out.fact_id,
                                    self.clock.now())
            self.writes[(entity_type, entity_id)] = 1

    @precondition(
        lambda self: len(self.model.entities) < MAX_ENTITIES
        and sum(e.state not in e.lc.terminal for e in self.model.live()) < MAX_MOVING
    )
    @rule(data=st.data())
    def create_entity(self, data: st.DataObject) -> None:
        """L3, L5, L11: create starts an entity in an initial status with one creation fact; a
        non-initial or unknown status, an undeclared reason or a taken id (a purged one too) is
        refused and writes nothing."""
        self._step()
        entity_type = data.draw(st.sampled_from(ENTITY_TYPES))
        lc = REGISTRY.get(entity_type)
        roll = data.draw(st.integers(0, 99))
        if roll < 75:
            status = data.draw(st.sampled_from(sorted(lc.initial)))
        elif roll < 95:
            status = data.draw(st.sampled_from([s for s in lc.statuses if s not in lc.initial]))
        else:
            status = "limbo"
        bogus = data.draw(st.integers(0, 99)) < 8
        code = data.draw(st.sampled_from(bogus_reasons(lc, status) if bogus else reasons_for(lc, status)))
        # Ids stay taken after a purge: the history keeps them.
        taken = [e.entity_id for e in self.model.entities.values() if e.lc.entity_type == entity_type]
        if taken and data.draw(st.integers(0, 99)) < 8:
            entity_id = data.draw(st.sampled_from(taken))
        else:
            entity_id = self.new_id(entity_type)
        self.create_one(entity_type, entity_id, status, code)

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        """L3, L4, L9: an actor moves an entity as it last saw it; policy violations are rejected,
        stale expectations conflict, both without writing; a purged entity is not found."""
        self._step()
        actor = data.draw(st.sampled_from(ACTORS))
        entity = self.pick(data, "moving")
        self.issue("transition", self.draw_command(data, actor, entity, self.draw_key(data)))

    @rule(data=st.data())
    def act_on_fresh_view(self, data: st.DataObject) -> None:
        """L3, L4, L10: an actor rereads an entity and moves it at once (mostly valid commands, so
        entities travel deep into their lifecycles, terminal exits included)."""
        self._step()
        actor = data.draw(st.sampled_from(ACTORS))
        entity = self.pick(data, "moving")
        self.observe_now(actor, entity)
        self.issue("fresh transition", self.draw_command(data, actor, entity, self.draw_key(data), careful=True))

    @rule(data=st.data())
    def race_two_actors(self, data: st.DataObject) -> None:
        """L4: two actors read the same entity, then both write; the second one, guarding the fields
        the first one changed, must conflict when the first applied (a lost update is impossible)."""
        self._step()
        first, second = data.draw(st.lists(st.sampled_from(ACTORS), min_size=2, max_size=2, unique=True))
        entity = self.pick(data, "moving")
        self.observe_now(first, entity)
        self.observe_now(second, entity)
        a = self.draw_command(data, first, entity, self.draw_key(data), careful=True)
        b = self.draw_command(data, second, entity, self.draw_key(data), careful=True)
        seen = self.views[second][entity.key]
        relied_on = {f: seen.get(f) for f in a.patch if f in guardable(entity.lc)}
        b = replace(b, guards={**b.guards, **relied_on})
        self.issue("race: first writer", a)
        self.issue("race: second writer", b)

    @rule(data=st.data())
    def observe(self, data: st.DataObject) -> None:
        """An actor rereads an entity: its view becomes current; reading writes nothing."""
        self._step()
        actor = data.draw(st.sampled_from(ACTORS))
        self.observe_now(actor, data.draw(st.sampled_from(list(self.model.entities.values()))))

    @precondition(lambda self: self.model.keys)
    @rule(data=st.data())
    def retry_applied_command(self, data: st.DataObject) -> None:
        """L9: a committed command retried with its idempotency key returns the original outcome
        (replayed=True, same fact) and writes nothing — also after the entity moved on or was purged."""
        self._step()
        use = data.draw(st.sampled_from(list(self.model.keys.values())))
        assert self.model.predict_transition(use.cmd).kind == "replayed"
        self.issue("retry", use.cmd)

    @precondition(lambda self: self.model.keys)
    @rule(data=st.data(), change=st.sampled_from(["summary", "patch", "actor", "target", "expected"]))
    def reuse_key_for_another_command(self, data: st.DataObject, change: str) -> None:
        """L9: the same key with a different command raises IdempotencyMismatch (or the policy
        refuses it first) and writes nothing."""
        self._step()
        cmd = data.draw(st.sampled_from(list(self.model.keys.values()))).cmd
        lc = self.model.lifecycles[cmd.entity_type]
        if change == "summary":
            other = replace(cmd, reason_summary=cmd.reason_summary + " (again)")
        elif change == "patch":
            f = data.draw(st.sampled_from(sorted(lc.patch_fields)))
            value = data.draw(column_values(lc.table.c[f]).filter(lambda v: v != cmd.patch.get(f, object())))
            other = replace(cmd, patch={**cmd.patch, f: value})
        elif change == "actor":
            other = replace(cmd, actor=data.draw(st.sampled_from([a for a in ACTORS if a != cmd.actor])))
        elif change == "target":
            other = replace(cmd, target=data.draw(st.sampled_from([s for s in lc.statuses if s != cmd.target])))
        else:
            extra = data.draw(st.sampled_from([s for s in lc.statuses if s not in cmd.expected]))
            other = replace(cmd, expected=(*cmd.expected, extra))
        assert other.signature() != cmd.signature()
        assert self.model.predict_transition(other).kind in ("mismatch", "rejected")
        self.issue("key reuse", other)

    @rule(data=st.data())
    def ambiguous_commit_then_retry(self, data: st.DataObject) -> None:
        """L5, L9: the transaction commits but the caller sees an error; retrying the same command
        with the same key returns the committed outcome (replayed=True) and writes no second fact."""
        self._step()
        actor = data.draw(st.sampled_from(ACTORS))
        entity = self.pick(data, "moving")
        self.observe_now(actor, entity)
        cmd = self.draw_command(data, actor, entity, f"ambiguous-{next(self.ids)}", careful=True)
        pred = self.model.predict_transition(cmd)
        out, exc = self.attempt(commit_then_fail(self.book, send(cmd)))
        if isinstance(exc, AmbiguousCommit):
            out, exc = exc.outcome, None
        self.expect("ambiguous commit", pred, out, exc)
        self.record(cmd, pred, out)
        retried = self.issue("retry after ambiguous commit", cmd)
        if pred.kind == "applied":
            assert retried is not None and out is not None
            assert retried.replayed and retried.fact_id == out.fact_id, (out, retried)

    @rule(data=st.data(), what=st.sampled_from(["transition", "create"]))
    def caller_rolls_back(self, data: st.DataObject, what: str) -> None:
        """L5: an operation joined to the caller's transaction rolls back with it: nothing is
        written, so redoing it afterwards applies afresh (its id and idempotency key stay unused)."""
        self._step()
        if what == "create":
            entity_type = data.draw(st.sampled_from(ENTITY_TYPES))
            lc = REGISTRY.get(entity_type)
            status = data.draw(st.sampled_from(sorted(lc.initial)))
            entity_id, code = self.new_id(entity_type), reasons_for(lc, status)[0]
            pred = self.model.predict_create(entity_type, entity_id, status, code)

            def op(tx: Book) -> Awaitable[Outcome]:
                return create(tx, entity_type, values=creation_values(entity_type, self.clock.now()),
                              status=status, reason=Reason(code, "created"), actor=Actor("system", "test"),
                              entity_id=entity_id)

            def redo() -> None:
                if len(self.model.entities) < MAX_ENTITIES:
                    self.create_one(entity_type, entity_id, status, code)
        else:
            actor = data.draw(st.sampled_from(ACTORS))
            entity = self.pick(data, "moving")
            self.observe_now(actor, entity)
            cmd = self.draw_command(data, actor, entity, f"aborted-{next(self.ids)}")
            pred = self.model.predict_transition(cmd)
            op = send(cmd)

            def redo() -> None:
                self.issue("redo after rollback", cmd)
        out, exc = self.attempt(join_then_abort(self.book, op))
        if isinstance(exc, CallerAborted):
            out, exc = exc.outcome, None
        self.expect(f"{what} in an aborted transaction", pred, out, exc)
        # The model does not move: the transaction never committed (checked by the invariants).
        if pred.writes:
            redo()

    @rule(data=st.data())
    def purge_entity(self, data: st.DataObject) -> None:
        """L11: purging a purgeable (terminal) entity deletes its row and appends a tombstone; a
        non-terminal one is refused without force; a stale expectation conflicts; both write nothing."""
        self._step()
        actor = data.draw(st.sampled_from(ACTORS))
        entity = self.pick(data, "terminal")
        lc = entity.lc
        roll = data.draw(st.integers(0, 99))
        expected = None if roll < 60 else self.view(actor, entity)["status"] if roll < 90 else data.draw(
            st.sampled_from(lc.statuses))
        force = data.draw(st.integers(0, 99)) < 25
        code = PURGE_REASONS[lc.entity_type] if data.draw(st.integers(0, 99)) < 92 else "ticket.purged.unknown"
        pred = self.model.predict_purge(lc.entity_type, entity.entity_id, code, expected, force)
        out, exc = self.attempt(
            purge(self.book, lc.entity_type, entity.entity_id, reason=Reason(code, "cleanup"), actor=actor,
                  expected=expected, force=force)
        )
        self.expect("purge", pred, out, exc)
        if pred.writes:
            self.model.apply_purge(lc.entity_type, entity.entity_id)
            self.writes[entity.key] = 1

    @rule(seconds=st.sampled_from([0.25, 1.0, 60.0, 3600.0]))
    def advance_clock(self, seconds: float) -> None:
        """Facts take their time from the injected clock (``updated_at`` is checked by the model
        invariant after the next write)."""
        self._step()
        self.clock.advance(seconds)

    @rule()
    def audit(self) -> None:
        """L8, L11: verify finds nothing wrong in an untampered book — chains, edges, tombstones."""
        self._step()
        report = self.run(verify(self.book))
        assert report.ok, report.to_json()

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def row_is_fold_of_facts(self) -> None:
        """L7: every row equals the fold of its facts (status, version, lifecycle and patched columns);
        a purged entity folds to nothing and has no row."""
        snap = self.snapshot()
        for key, folded in snap.folds.items():
            row = snap.rows[key]
            if folded is None:
                assert row is None, f"{key}: the facts end in a tombstone but the row exists: {row}"
                continue
            assert row is not None, f"{key}: the facts describe a row that does not exist: {folded}"
            assert set(LIFECYCLE_COLUMNS) <= set(folded), f"{key}: the fold lacks lifecycle columns: {folded}"
            differ = {c: (row.get(c), v) for c, v in folded.items() if row.get(c) != v}
            assert not differ, f"{key}: row != fold(facts) on (row, fold): {differ}"

    @invariant()
    def facts_follow_declared_edges(self) -> None:
        """L3: a creation fact starts in an initial status; every other fact (tombstones aside)
        follows a trigger of the reference machine, its actor gate and required patch fields met."""
        for key, facts in self.snapshot().facts.items():
            lc = self.model.lifecycles[key[0]]
            for f in facts:
                if f.is_creation:
                    assert f.status in lc.initial, f"{key}: created in non-initial status {f.status!r}"
                elif not f.is_tombstone:
                    assert self.model.accepts(key[0], f.previous_status, f.status, f.actor_type, f.patch), (
                        f"{key}: fact {f.previous_status} -> {f.status} by {f.actor_type} with patch "
                        f"{sorted(f.patch)} follows no declared edge"
                    )

    @invariant()
    def step_wrote_what_the_model_predicted(self) -> None:
        """L3, L4, L5: a rejected, conflicting, rolled-back, replayed or mismatched command wrote
        nothing — fact count and row unchanged; an applied one wrote exactly one fact, earlier facts
        untouched."""
        now = self.snapshot()
        assert not now.strays, f"facts of entities nobody created: {now.strays}"
        if self.before is None:
            return
        before = self.before
        for key, facts in now.facts.items():
            old = before.facts.get(key, [])
            wrote = self.writes.get(key, 0)
            added = len(facts) - len(old)
            assert added == wrote, f"{key}: {added} new fact(s), the model expects {wrote}"
            assert facts[: len(old)] == old, f"{key}: earlier facts changed"
            if not wrote:
                assert now.rows[key] == before.rows.get(key), f"{key}: the row changed although nothing applied"
        total = sum(self.writes.values())
        assert now.total_facts - before.total_facts == total, (
            f"{now.total_facts - before.total_facts} fact(s) written in this step, the model expects {total}"
        )

    @invariant()
    def versions_step_by_one(self) -> None:
        """L6: versions run 1, 2, 3, ... along an entity's facts, a live row's version is its number
        of facts, and a step moves a version by exactly the number of transitions it applied."""
        now = self.snapshot()
        for key, facts in now.facts.items():
            versions = [f.version for f in facts]
            assert versions == list(range(1, len(facts) + 1)), f"{key}: versions {versions}"
            row = now.rows[key]
            if row is not None:
                assert row["version"] == len(facts), f"{key}: version {row['version']} with {len(facts)} facts"
                old = self.before.rows.get(key) if self.before else None
                if old is not None:
                    moved = row["version"] - old["version"]
                    assert moved == self.writes.get(key, 0), f"{key}: version {old['version']} -> {row['version']}"

    @invariant()
    def facts_form_a_hash_chain(self) -> None:
        """L8: each fact links to the previous fact of its entity and its hash; hashes recompute;
        the row's chain_hash is the last fact's hash; time never runs backwards."""
        now = self.snapshot()
        for key, facts in now.facts.items():
            prev_id, prev_hash, prev_at = GENESIS, GENESIS, float("-inf")
            for f in facts:
                assert (f.prev_fact_id, f.prev_hash) == (prev_id, prev_hash), f"{key}: fact {f.id} breaks the chain"
                assert fact_hash(f.content(), f.prev_hash) == f.hash, f"{key}: fact {f.id} does not match its hash"
                assert f.at >= prev_at, f"{key}: fact {f.id} is older than its predecessor"
                prev_id, prev_hash, prev_at = f.id, f.hash, f.at
            row = now.rows[key]
            if row is not None:
                at_head = (row["chain_hash"], row["last_fact_id"]) == (prev_hash, prev_id)
                assert at_head, f"{key}: row is not at the chain's head"

    @invariant()
    def terminal_statuses_left_only_by_gated_edges(self) -> None:
        """L10: every fact leaving a terminal status (tombstones aside) went along an actor-gated edge
        by an actor of an allowed type."""
        for key, facts in self.snapshot().facts.items():
            lc = self.model.lifecycles[key[0]]
            for f in facts:
                if f.previous_status in lc.terminal and not f.is_tombstone:
                    edge = lc.edge(f.previous_status, f.status or "")
                    assert edge is not None and edge.gated and f.actor_type in edge.actors, (
                        f"{key}: left terminal {f.previous_status!r} for {f.status!r} as {f.actor_type!r}"
                    )

    @invariant()
    def model_matches_database(self) -> None:
        """L4, L6, L7, L11: the database holds what the model predicts — status, version, patched
        and lifecycle columns (updated_at from the FakeClock); a purged entity has no row and a
        history ending in its tombstone; no table holds rows the model does not know."""
        now = self.snapshot()
        for key, entity in self.model.entities.items():
            row, facts = now.rows[key], now.facts[key]
            assert len(facts) == entity.version, f"{key}: {len(facts)} facts, the model counts {entity.version}"
            if entity.purged:
                assert row is None, f"{key}: purged but the row is still there"
                assert facts[-1].is_tombstone, f"{key}: purged but the history does not end in a tombstone"
                continue
            assert row is not None, f"{key}: the row is missing; the model has it {entity.state!r}"
            assert row["status"] == entity.state, (
                f"{key}: the database says {row['status']!r}, the model {entity.state!r}"
            )
            differ = {c: (row.get(c), v) for c, v in entity.data.items() if row.get(c) != v}
            assert not differ, f"{key}: (database, model) differ: {differ}"
        for entity_type in ENTITY_TYPES:
            live = sum(1 for e in self.model.live() if e.lc.entity_type == entity_type)
            rows = now.table_rows[entity_type]
            assert rows == live, f"{entity_type}: {rows} rows, {live} live in the model"


# -- the tests ---------------------------------------------------------------------------------


def test_lifecycle_machine_sqlite(tmp_path_factory: pytest.TempPathFactory) -> None:
    """L3, L4, L5, L6, L7, L8, L9, L10, L11 on SQLite: a fresh database file per example."""
    folder = tmp_path_factory.mktemp("lifecycle_machine")
    numbers = itertools.count()

    class OnSqlite(LifecycleMachine):
        make_url = staticmethod(lambda: f"sqlite:///{folder}/book-{next(numbers)}.db")

    run_state_machine_as_test(OnSqlite, settings=MACHINE_SETTINGS)


async def _clean_postgres(url: str) -> None:
    engine = connect(url)
    try:
        await reset_schema(engine)
        async with engine.begin() as conn:
            await conn.run_sync(TEST_META.drop_all)
    finally:
        await engine.dispose()


@pytest.mark.postgres
def test_lifecycle_machine_postgres(pg_url: str) -> None:
    """L3, L4, L5, L6, L7, L8, L9, L10, L11 on PostgreSQL: the session database, emptied per example."""

    class OnPostgres(LifecycleMachine):
        make_url = staticmethod(lambda: pg_url)
        shared_database = True

    try:
        run_state_machine_as_test(OnPostgres, settings=MACHINE_SETTINGS)
    finally:
        asyncio.run(_clean_postgres(pg_url))
