"""``LifecycleMachine``: a Hypothesis state machine for your registry, your book and your code.

It creates entities of every lifecycle it tracks, moves them along random edges (declared and not,
by allowed and forbidden actor types, with and without the required patch and guard fields, with
stale expectations, undeclared reason codes, shared idempotency keys and unique values another entity
holds), races several claimants on one entity as concurrent tasks on separate connections, retries
keyed commands, rolls back callers' transactions, drops connections mid-transaction and purges
terminal entities. The
reference model (:mod:`.model`) predicts every answer; after every step the invariants
(:mod:`.checks`) compare the database with the model and with the facts: row == fold of facts,
versions, the hash chain, no move outside the policy, idempotency, terminal statuses left only by
gated edges, and ``verify`` finds nothing.

Subclass it, give it your registry and a book factory, add your own rules (your application code
driving the lifecycle through ``self.book``) and your own ``@invariant``\\ s. The machine notices
what your rules wrote — new entities, new facts — checks every fact against the policy and lets
its model follow, so its own commands stay predictable afterwards::

    from hypothesis import strategies as st
    from hypothesis.stateful import invariant, rule
    from statebook.adapters.db import open_book
    from statebook.lifecycle.testing import LifecycleMachine

    import shop  # registry + place / pay / ship

    class ShopMachine(LifecycleMachine):
        registry = shop.registry

        async def make_book(self):                      # a fresh, empty book per example
            return await open_book(f"sqlite:///{tmp}/shop-{next(n)}.db", registry=shop.registry)

        @rule(data=st.data())
        def customer_pays(self, data):                  # your code, any of its outcomes
            order = data.draw(st.sampled_from(self.entities("order")))
            self.run(shop.pay(self.book, order.entity_id))

        @invariant()
        def shipped_orders_were_paid(self):
            for key, facts in self.snapshot().facts.items():
                if facts[-1].status == "shipped":
                    assert "paid" in [f.status for f in facts], key

    def test_shop():
        ShopMachine.run_as_test()                       # profile from HYPOTHESIS_PROFILE: ci | deep
                                                        # (ci: a failure is shrunk for 30 s at most)

Class attributes: ``registry`` (required), ``entity_types`` (the lifecycles tracked; default all),
``actors``, ``max_entities``/``max_moving`` (how many entities the machine's own rules make).
Override ``make_book`` (or set it to a zero-argument async function with ``staticmethod``),
``close_book`` (default: dispose the engine) and ``creation_values`` (data columns for a new entity
of a lifecycle, for tables :func:`.strategies.creation_values` cannot fill, e.g. foreign keys).
Your rules must not call the machine's ``_step``; raise an ``AssertionError`` for a broken domain rule.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from ..book import Book
from ..clock import FakeClock
from ..engine import Outcome, create, purge
from ..errors import (
    ConstraintViolation, DuplicateEntity, EntityNotFound, IdempotencyMismatch, StatebookError, StorageUnavailable,
    TransitionRejected,
)
from ..policy import Lifecycle, Registry
from ..reasons import Actor, Reason
from ..replay import read_row, verify
from . import strategies as sbst
from .checks import Checks, Snapshot, read_snapshot
from .faults import AmbiguousCommit, CallerAborted, ConnectionDropped, commit_then_fail, drop_connection, \
    join_then_abort, send
from .model import Entity, KeyUse, Prediction, ReferenceModel, TransitionCmd
from .runner import PROFILES, SHRINK_SECONDS, machine_settings, register_profiles, run_machine

__all__ = ["PROFILES", "SHRINK_SECONDS", "LifecycleMachine", "judge", "machine_settings", "register_profiles"]

Key = tuple[str, str]

_ERRORS = {"rejected": TransitionRejected, "not_found": EntityNotFound, "mismatch": IdempotencyMismatch,
           "duplicate": DuplicateEntity, "unique": ConstraintViolation}


def judge(pred: Prediction, out: Outcome | None, exc: BaseException | None) -> str | None:
    """Why the engine's answer (``out`` or ``exc``) is not the one predicted; None when it is."""
    if pred.kind in _ERRORS:
        if not isinstance(exc, _ERRORS[pred.kind]):
            return f"the model predicts {pred}, the engine gave {out or exc!r}"
        if pred.kind == "rejected" and getattr(exc, "rule", None) not in pred.rules:
            return f"rejected by rule {getattr(exc, 'rule', None)!r}, the model expects one of {sorted(pred.rules)}: {exc}"
        if pred.kind == "unique" and not getattr(exc, "unique", False):
            return f"the model predicts {pred} (a unique key), the database refused another constraint: {exc}"
        return None
    if exc is not None:
        return f"the model predicts {pred}, the engine raised {exc!r}"
    if out is None:
        return f"the model predicts {pred}, the engine answered nothing"
    got = (out.kind, out.status, out.version, out.replayed)
    if pred.kind == "conflict":
        return None if got == ("conflict", pred.status, pred.version, False) else f"predicted {pred}, got {out}"
    if pred.kind == "applied":
        if got != ("applied", pred.status, pred.version, False):
            return f"predicted {pred}, got {out}"
        return None if out.fact_id else f"an applied outcome names its fact: {out}"
    if got != ("applied", pred.status, pred.version, True):
        return f"predicted {pred}, got {out}"
    return None if out.fact_id == pred.fact_id else f"a replay returns the original fact {pred.fact_id}, got {out.fact_id}"


class LifecycleMachine(Checks, RuleBasedStateMachine):
    """Random commands on your registry's lifecycles, checked against the reference model (L3–L11).

    See the module docstring for how to subclass it.
    """

    registry: ClassVar[Registry]
    """Your sealed registry (required: a subclass sets it)."""
    entity_types: ClassVar[tuple[str, ...] | None] = None
    actors: tuple[Actor, ...] = ()
    """The actors the rules draw from (empty: one of each type an edge of the tracked lifecycles is gated on,
    and a system and a user actor)."""
    max_entities: ClassVar[int] = 10
    max_moving: ClassVar[int] = 3  # few entities, so each one travels far along its lifecycle
    shared_keys: ClassVar[tuple[str, ...]] = ("kit-k1", "kit-k2")
    creator: ClassVar[Actor] = Actor("system", "kit")

    def __init__(self) -> None:
        super().__init__()
        if getattr(self, "registry", None) is None:
            raise TypeError(f"{type(self).__name__}: set the class attribute `registry` to your sealed Registry")
        self.runner = asyncio.Runner()
        try:
            book = self.run(self.make_book())
            if not isinstance(book, Book):
                raise TypeError(f"{type(self).__name__}.make_book() returned {book!r}; it must return a Book")
        except BaseException:
            self.runner.close()
            raise
        self.clock = book.clock if isinstance(book.clock, FakeClock) else FakeClock()
        self.book = book.with_clock(self.clock)
        self.model = ReferenceModel(self.registry, self.entity_types)
        self.tracked: tuple[Lifecycle, ...] = tuple(self.model.lifecycles.values())
        if not self.actors:
            self.actors = sbst.actors_of(self.tracked)
        self.views: dict[Actor, dict[Key, dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.snap: Snapshot | None = None
        self.before: Snapshot | None = None
        self.writes: dict[Key, int] = {}
        self._tracked_step = False
        # Entities and keys a real race touched: which claimant won is the database's choice, so what
        # Hypothesis draws next must not depend on them (it needs the same draws for the same choices).
        # They stay checked by every invariant; the machine's own rules just stop drawing them.
        self.raced: set[Key] = set()
        self.raced_keys: set[str] = set()

    # -- what subclasses provide ----------------------------------------------------------------
    async def make_book(self) -> Book:
        """A fresh, empty book over ``registry`` for one example (tables created, no entities)."""
        raise TypeError(f"{type(self).__name__}: define `async def make_book(self)` returning a fresh Book "
                        "over your registry (e.g. statebook.adapters.db.open_book on a temporary SQLite file)")

    async def close_book(self, book: Book) -> None:
        """Release the example's book (default: dispose its engine)."""
        await book.engine.dispose()

    def creation_values(self, data: st.DataObject, lc: Lifecycle) -> dict[str, Any]:
        """The data columns of a new entity of ``lc`` (default: drawn from the table's columns, now and then
        with the values of a unique key another entity holds)."""
        return data.draw(sbst.creation_values(lc, self.peers(lc)), label=f"{lc.entity_type} values")

    def peers(self, lc: Lifecycle, besides: Entity | None = None) -> list[dict[str, Any]]:
        """The rows (as the model has them) of the live entities of ``lc`` the rules draw from (but
        ``besides``): whose unique values a drawn create or patch may copy."""
        return [e.data for e in self.drawable() if e.lc is lc and not e.purged and e is not besides]

    # -- running --------------------------------------------------------------------------------
    @classmethod
    def run_as_test(cls, profile: str | None = None) -> None:
        """Run the machine as one test with :func:`machine_settings`, shrinking a failure within the profile's
        :data:`SHRINK_SECONDS` (:func:`.runner.run_machine`); raises the failure."""
        run_machine(cls, profile)

    def teardown(self) -> None:
        try:
            self.run(self.close_book(self.book))
        finally:
            self.runner.close()

    def run(self, coro: Awaitable[Any]) -> Any:
        """Run a coroutine on the machine's event loop (rules are synchronous)."""
        return self.runner.run(coro)  # type: ignore[arg-type]

    def entities(self, entity_type: str, *, live: bool = True) -> list[Entity]:
        """The model's entities of one lifecycle (live ones unless ``live=False``), for your rules."""
        return [e for e in self.model.entities.values()
                if e.lc.entity_type == entity_type and (not live or not e.purged)]

    def attempt(self, coro: Awaitable[Outcome]) -> tuple[Outcome | None, BaseException | None]:
        """Run ``coro`` to its outcome; an expected kind of failure is returned as the second item instead of
        raised.
        """
        try:
            return self.run(coro), None
        except (StatebookError, LookupError, AmbiguousCommit, CallerAborted, ConnectionDropped) as exc:
            return None, exc

    # -- steps ----------------------------------------------------------------------------------
    def _step(self) -> None:
        """Start one of the machine's own steps: keep the database as it was, expect no writes until
        a rule says so."""
        self.before = self.snapshot()
        self.snap = None
        self.writes = {}
        self._tracked_step = True

    def snapshot(self) -> Snapshot:
        """The database after the current step (read once per step)."""
        if self.snap is None:
            self.snap = self.run(read_snapshot(self.book, self.model))
        return self.snap

    def check_invariants(self, *args: Any, **kwargs: Any) -> None:
        # Hypothesis calls this after every step: a step the machine did not drive (your rule) is
        # taken in first, so every invariant — yours too — sees the model caught up.
        """Bring the model up to date with steps the machine did not drive, then run every invariant."""
        self._settle()
        super().check_invariants(*args, **kwargs)

    def _settle(self) -> None:
        if self._tracked_step:
            self._tracked_step = False
            return
        self.before, self.snap = self.snap, None
        now = self.snapshot()
        old = self.before.facts if self.before is not None else {}
        self.writes = {}
        new = [f for key, facts in now.facts.items() for f in facts[len(old.get(key, [])):]]
        for fact in sorted(new, key=lambda f: (f.seq or 0)):
            key = (fact.entity_type, fact.entity_id)
            self.model.absorb(fact, now.rows.get(key))
            self.writes[key] = self.writes.get(key, 0) + 1
            event(f"your rule wrote: {fact.entity_type} {fact.previous_status} -> {fact.status}")
        now.strays = []

    def expect(self, what: str, pred: Prediction, out: Outcome | None, exc: BaseException | None) -> None:
        """The engine's answer must be the one the model predicted."""
        event(f"{what}: {pred.kind}")
        wrong = judge(pred, out, exc)
        if wrong is not None:
            raise AssertionError(f"{what}: {wrong}") from exc

    # -- actors and commands --------------------------------------------------------------------
    def observe_now(self, actor: Actor, entity: Entity) -> dict[str, Any]:
        """Read the entity's row now and remember it as what ``actor`` last saw."""
        row = self.run(read_row(self.book, *entity.key))
        # A purged entity is seen as it last was: the actor has not noticed yet.
        self.views.setdefault(actor, {})[entity.key] = dict(row) if row is not None else dict(entity.data)
        return self.views[actor][entity.key]

    def view(self, actor: Actor, entity: Entity) -> dict[str, Any]:
        """What ``actor`` last saw of the entity (read now if it never looked)."""
        seen = self.views.get(actor, {}).get(entity.key)
        return seen if seen is not None else self.observe_now(actor, entity)

    def drawable(self) -> list[Entity]:
        """The entities the machine's rules draw from: every one but those a race settled."""
        return [e for e in self.model.entities.values() if e.key not in self.raced]

    def stable_keys(self) -> list[KeyUse]:
        """The applied keyed commands the rules may retry: not those of a race."""
        return [use for key, use in self.model.keys.items() if key[2] not in self.raced_keys]

    def pick(self, data: st.DataObject, prefer: str) -> Entity:
        """Any entity (purged ones too), but mostly a live non-terminal one (or a terminal one to purge)."""
        every = self.drawable()
        live = [e for e in every if not e.purged and (e.state in e.lc.terminal) == (prefer == "terminal")]
        if live and data.draw(st.integers(0, 99)) < 75:
            return data.draw(st.sampled_from(live))
        return data.draw(st.sampled_from(every))

    def new_id(self, entity_type: str) -> str:
        """A fresh entity id for ``entity_type``, e.g. ``ticket-007``."""
        return f"{entity_type}-{next(self.ids):03d}"

    def fresh_key(self) -> str:
        """A fresh idempotency key."""
        return f"kit-{next(self.ids)}"

    def draw_command(self, data: st.DataObject, actor: Actor, entity: Entity, key: str | None, *,
                     careful: bool = False, racing: bool = False) -> TransitionCmd:
        """A command as ``actor`` would write it from its view (see :func:`.strategies.commands`). A
        ``racing`` command copies no other entity's unique values: which racer wins is the database's
        choice, and what Hypothesis draws next must not depend on it through a unique key."""
        others = [lc for lc in self.tracked if lc is not entity.lc]
        actors = [actor, *(a for a in self.actors or () if a != actor)]
        peers = () if racing else self.peers(entity.lc, entity)
        cmd = data.draw(sbst.commands(entity.lc, self.view(actor, entity), actors=[actor], key=key,
                                      careful=careful, others=others, peers=peers))
        edge = entity.lc.edge(self.view(actor, entity)["status"], cmd.target)
        if edge is not None and edge.actors and actor.type not in edge.actors:
            allowed = [a for a in actors if a.type in edge.actors]
            if allowed and data.draw(st.integers(0, 99)) < (80 if careful else 50):
                # Handed to someone allowed to take the edge, who acts on this actor's view.
                cmd = replace(cmd, actor=data.draw(st.sampled_from(allowed)))
        return cmd

    def keyless(self, cmd: TransitionCmd, first: TransitionCmd | None) -> TransitionCmd:
        """A claimant's command whose effect on the table's unique keys is the same whichever claimant wins:
        it patches no column a unique key reads, and when a key reads the status, it takes the first
        claimant's transition (target and reason). Otherwise a later create or patch of another entity could
        collide with the raced one in one run and not in the next, and Hypothesis needs the same draws for
        the same choices."""
        keys = self.model.unique.get(cmd.entity_type, ())
        read = {c for k in keys for c in (*k.columns, *(t.column for t in k.where))}
        patch = {f: v for f, v in cmd.patch.items() if f not in read}
        if first is not None and "status" in read:
            cmd = replace(cmd, target=first.target, reason_code=first.reason_code)
        return replace(cmd, patch=patch)

    def draw_key(self, data: st.DataObject) -> str | None:
        """Draw an idempotency key (none, fresh, or one shared with earlier commands)."""
        return data.draw(sbst.idempotency_keys(self.fresh_key, self.shared_keys))

    def issue(self, what: str, cmd: TransitionCmd) -> Outcome | None:
        """Send one command, check the answer against the model, move the model."""
        pred = self.model.predict_transition(cmd)
        out, exc = self.attempt(send(cmd)(self.book))
        self.expect(what, pred, out, exc)
        self.record(cmd, pred, out)
        return out

    def record(self, cmd: TransitionCmd, pred: Prediction, out: Outcome | None) -> None:
        """Update the model and the actor's view after a transition with prediction ``pred`` returned ``out``."""
        if pred.kind == "applied":
            assert out is not None and out.fact_id
            self.model.apply_transition(cmd, out.fact_id, self.clock.now())
            self.writes[cmd.key] = self.writes.get(cmd.key, 0) + 1
            self.views.setdefault(cmd.actor, {})[cmd.key] = dict(self.model.entities[cmd.key].data)
        elif pred.kind == "conflict" and cmd.key in self.views.get(cmd.actor, {}):
            self.views[cmd.actor][cmd.key]["status"] = pred.status  # the answer tells the current status

    def create_one(self, lc: Lifecycle, entity_id: str, status: str, code: str, values: dict[str, Any]) -> None:
        """Create an entity, check the outcome against the model's prediction and record it."""
        pred = self.model.predict_create(lc.entity_type, entity_id, status, code, values)
        out, exc = self.attempt(
            create(self.book, lc.entity_type, values=values, status=status, reason=Reason(code, "created"),
                   actor=self.creator, entity_id=entity_id)
        )
        self.expect("create", pred, out, exc)
        if pred.writes:
            assert out is not None and out.fact_id
            self.model.apply_create(lc.entity_type, entity_id, status, values, code, "created", out.fact_id,
                                    self.clock.now())
            self.writes[(lc.entity_type, entity_id)] = 1

    def linearize(self, what: str, cmds: Sequence[TransitionCmd],
                  results: Sequence[tuple[Outcome | None, BaseException | None]]) -> None:
        """Concurrent commands on one entity: their answers must be those of some serial order. The
        winners apply in version order; every other answer must be the model's at some point of it."""
        won = sorted(((c, o) for c, (o, e) in zip(cmds, results) if o is not None and o.kind == "applied"
                      and not o.replayed), key=lambda co: co[1].version or 0)  # an applied outcome has one
        rest = [(c, o, e) for c, (o, e) in zip(cmds, results) if not (o is not None and o.kind == "applied"
                                                                       and not o.replayed)]
        waiting = list(range(len(rest)))

        def settle() -> None:
            for i in list(waiting):
                c, o, e = rest[i]
                pred = self.model.predict_transition(c)
                if judge(pred, o, e) is None:
                    waiting.remove(i)
                    event(f"{what}: {pred.kind}")
                    self.record(c, pred, o)

        settle()
        for c, o in won:
            pred = self.model.predict_transition(c)
            self.expect(f"{what}: a winner", pred, o, None)
            self.record(c, pred, o)
            settle()
        unexplained = [f"{rest[i][0]} -> {rest[i][1] or rest[i][2]!r} (the model now: "
                       f"{self.model.predict_transition(rest[i][0])})" for i in waiting]
        assert not unexplained, f"{what}: answers no serial order explains: {unexplained}"

    # -- rules ----------------------------------------------------------------------------------
    @initialize(data=st.data())
    def seed(self, data: st.DataObject) -> None:
        """One entity of each tracked lifecycle to start from."""
        self._step()
        for lc in self.tracked:
            status = data.draw(st.sampled_from(sorted(lc.initial)), label=f"{lc.entity_type} starts")
            self.create_one(lc, self.new_id(lc.entity_type), status, sbst.reasons_for(lc, status)[0],
                            self.creation_values(data, lc))

    @precondition(lambda self: len(self.drawable()) < self.max_entities
                  and sum(not e.purged and e.state not in e.lc.terminal for e in self.drawable()) < self.max_moving)
    @rule(data=st.data())
    def create_entity(self, data: st.DataObject) -> None:
        """L3, L5, L11: create starts an entity in an initial status with one creation fact; a
        non-initial or unknown status, an undeclared reason or a taken id (a purged one too) is
        refused and writes nothing."""
        self._step()
        lc = data.draw(st.sampled_from(self.tracked))
        status, code = data.draw(sbst.creations(lc, [o for o in self.tracked if o is not lc]))
        # Ids stay taken after a purge: the history keeps them.
        taken = [e.entity_id for e in self.model.entities.values() if e.lc is lc]
        if taken and data.draw(st.integers(0, 99)) < 8:
            entity_id = data.draw(st.sampled_from(taken))
        else:
            entity_id = self.new_id(lc.entity_type)
        self.create_one(lc, entity_id, status, code, self.creation_values(data, lc))

    @precondition(lambda self: self.drawable())
    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        """L3, L4, L9: an actor moves an entity as it last saw it; policy violations are rejected,
        stale expectations conflict, both without writing; a purged entity is not found."""
        self._step()
        actor = data.draw(st.sampled_from(self.actors))
        entity = self.pick(data, "moving")
        self.issue("transition", self.draw_command(data, actor, entity, self.draw_key(data)))

    @precondition(lambda self: self.drawable())
    @rule(data=st.data())
    def act_on_fresh_view(self, data: st.DataObject) -> None:
        """L3, L4, L10: an actor rereads an entity and moves it at once (mostly valid commands, so
        entities travel deep into their lifecycles, terminal exits included)."""
        self._step()
        actor = data.draw(st.sampled_from(self.actors))
        entity = self.pick(data, "moving")
        self.observe_now(actor, entity)
        self.issue("fresh transition", self.draw_command(data, actor, entity, self.draw_key(data), careful=True))

    @precondition(lambda self: self.drawable())
    @rule(data=st.data())
    def race_two_actors(self, data: st.DataObject) -> None:
        """L4: two actors read the same entity, then both write; the second one, guarding the fields
        the first one changed, must conflict when the first applied (a lost update is impossible)."""
        self._step()
        first, second = data.draw(st.lists(st.sampled_from(self.actors), min_size=2, max_size=2, unique=True))
        entity = self.pick(data, "moving")
        self.observe_now(first, entity)
        self.observe_now(second, entity)
        a = self.draw_command(data, first, entity, self.draw_key(data), careful=True)
        b = self.draw_command(data, second, entity, self.draw_key(data), careful=True)
        seen = self.views[second][entity.key]
        relied_on = {f: seen.get(f) for f in a.patch if f in sbst.guardable(entity.lc)}
        b = replace(b, guards={**b.guards, **relied_on})
        self.issue("race: first writer", a)
        self.issue("race: second writer", b)

    @precondition(lambda self: self.drawable())
    @rule(data=st.data(), claimants=st.integers(2, 4))
    def race_claimants(self, data: st.DataObject, claimants: int) -> None:
        """L4, L9: several claimants read one entity and write at once — concurrent tasks, each in its
        own transaction on its own connection. Their answers must be those of some serial order: a
        lost update is impossible (each guards what it read), and copies of one keyed command apply
        once and replay for the others."""
        self._step()
        entity = self.pick(data, "moving")
        if data.draw(st.integers(0, 99)) < 30:
            actor = data.draw(st.sampled_from(self.actors))
            self.observe_now(actor, entity)
            cmd = self.draw_command(data, actor, entity, f"kit-dup-{next(self.ids)}", careful=True, racing=True)
            cmds = [cmd] * claimants
            label = "race: duplicate submissions"
        else:
            cmds = []
            for actor in data.draw(st.lists(st.sampled_from(self.actors), min_size=claimants, max_size=claimants)):
                seen = self.observe_now(actor, entity)
                cmd = self.draw_command(data, actor, entity, f"kit-race-{next(self.ids)}", careful=True,
                                        racing=True)
                cmd = self.keyless(cmd, cmds[0] if cmds else None)
                relied_on = {f: seen.get(f) for f in cmd.patch if f in sbst.guardable(entity.lc)}
                cmds.append(replace(cmd, guards={**relied_on, **cmd.guards}))
            label = "race: claimants"

        async def one(cmd: TransitionCmd) -> tuple[Outcome | None, BaseException | None]:
            try:
                return await send(cmd)(self.book), None
            except (StatebookError, LookupError) as exc:
                return None, exc

        async def race() -> list[tuple[Outcome | None, BaseException | None]]:
            return list(await asyncio.gather(*(one(c) for c in cmds)))

        self.linearize(label, cmds, self.run(race()))
        self.raced.add(entity.key)
        self.raced_keys.update(c.idempotency_key for c in cmds if c.idempotency_key is not None)

    @precondition(lambda self: self.drawable())
    @rule(data=st.data())
    def observe(self, data: st.DataObject) -> None:
        """An actor rereads an entity: its view becomes current; reading writes nothing."""
        self._step()
        actor = data.draw(st.sampled_from(self.actors))
        self.observe_now(actor, data.draw(st.sampled_from(self.drawable())))

    @precondition(lambda self: self.stable_keys())
    @rule(data=st.data())
    def retry_applied_command(self, data: st.DataObject) -> None:
        """L9: a committed command retried with its idempotency key returns the original outcome
        (replayed=True, same fact) and writes nothing — also after the entity moved on or was purged."""
        self._step()
        use = data.draw(st.sampled_from(self.stable_keys()))
        assert self.model.predict_transition(use.cmd).kind == "replayed"
        self.issue("retry", use.cmd)

    @precondition(lambda self: self.stable_keys())
    @rule(data=st.data(), change=st.sampled_from(["summary", "patch", "actor", "target", "expected"]))
    def reuse_key_for_another_command(self, data: st.DataObject, change: str) -> None:
        """L9: the same key with a different command raises IdempotencyMismatch (or the policy
        refuses it first) and writes nothing."""
        self._step()
        cmd = data.draw(st.sampled_from(self.stable_keys())).cmd
        lc = self.model.lifecycles[cmd.entity_type]
        other_actors = [a for a in self.actors or () if a != cmd.actor]
        extra = [s for s in lc.statuses if s not in cmd.expected]
        if change == "patch" and lc.patch_fields:
            f = data.draw(st.sampled_from(sorted(lc.patch_fields)))
            value = data.draw(sbst.column_values(lc.table.c[f]).filter(lambda v: v != cmd.patch.get(f, object())))
            other = replace(cmd, patch={**cmd.patch, f: value})
        elif change == "actor" and other_actors:
            other = replace(cmd, actor=data.draw(st.sampled_from(other_actors)))
        elif change == "target":
            other = replace(cmd, target=data.draw(st.sampled_from([s for s in lc.statuses if s != cmd.target])))
        elif change == "expected" and extra:
            other = replace(cmd, expected=(*cmd.expected, data.draw(st.sampled_from(extra))))
        else:
            other = replace(cmd, reason_summary=cmd.reason_summary + " (again)")
        assert other.signature() != cmd.signature()
        assert self.model.predict_transition(other).kind in ("mismatch", "rejected")
        self.issue("key reuse", other)

    @precondition(lambda self: self.drawable())
    @rule(data=st.data())
    def ambiguous_commit_then_retry(self, data: st.DataObject) -> None:
        """L5, L9: the transaction commits but the caller sees an error; retrying the same command
        with the same key returns the committed outcome (replayed=True) and writes no second fact."""
        self._step()
        actor = data.draw(st.sampled_from(self.actors))
        entity = self.pick(data, "moving")
        self.observe_now(actor, entity)
        cmd = self.draw_command(data, actor, entity, f"kit-ambiguous-{next(self.ids)}", careful=True)
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

    @precondition(lambda self: self.drawable())
    @rule(data=st.data(), what=st.sampled_from(["transition", "create"]))
    def caller_rolls_back(self, data: st.DataObject, what: str) -> None:
        """L5: an operation joined to the caller's transaction rolls back with it: nothing is
        written, so redoing it afterwards applies afresh (its id and idempotency key stay unused)."""
        self._step()
        op: Callable[[Book], Awaitable[Outcome]]
        if what == "create":
            lc = data.draw(st.sampled_from(self.tracked))
            status = data.draw(st.sampled_from(sorted(lc.initial)))
            entity_id, code = self.new_id(lc.entity_type), sbst.reasons_for(lc, status)[0]
            values = self.creation_values(data, lc)
            pred = self.model.predict_create(lc.entity_type, entity_id, status, code, values)

            def op(tx: Book) -> Awaitable[Outcome]:
                return create(tx, lc.entity_type, values=values, status=status, reason=Reason(code, "created"),
                              actor=self.creator, entity_id=entity_id)

            def redo() -> None:
                if len(self.drawable()) < self.max_entities:
                    self.create_one(lc, entity_id, status, code, values)
        else:
            actor = data.draw(st.sampled_from(self.actors))
            entity = self.pick(data, "moving")
            self.observe_now(actor, entity)
            cmd = self.draw_command(data, actor, entity, f"kit-aborted-{next(self.ids)}")
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

    @precondition(lambda self: self.drawable())
    @rule(data=st.data(), before=st.booleans())
    def drop_connection_mid_transaction(self, data: st.DataObject, before: bool) -> None:
        """L5: the connection of a ``book.begin()`` block is closed before COMMIT (after the engine's
        statements, or before them): the block fails, nothing is written, and the book goes on
        working — the same keyed command then applies afresh."""
        self._step()
        actor = data.draw(st.sampled_from(self.actors))
        entity = self.pick(data, "moving")
        self.observe_now(actor, entity)
        cmd = self.draw_command(data, actor, entity, f"kit-dropped-{next(self.ids)}", careful=True)
        pred = self.model.predict_transition(cmd)
        _, exc = self.attempt(drop_connection(self.book, send(cmd), before=before))
        assert isinstance(exc, ConnectionDropped), f"a dropped connection gave {exc!r}"
        event(f"dropped connection ({'before' if before else 'after'} the write): {type(exc.error).__name__}")
        assert exc.error is not None, f"COMMIT on a closed connection raised nothing (engine answered {exc.outcome})"
        # The command's own refusal, or the lost connection as StorageUnavailable: never the driver's or
        # SQLAlchemy's error leaking out of statebook's family.
        assert isinstance(exc.error, StatebookError), (
            f"a lost connection raised {type(exc.error).__name__}, outside statebook's errors: {exc.error}")
        if not isinstance(exc.error, StorageUnavailable):
            event(f"dropped connection: the command's own answer came first ({type(exc.error).__name__})")
        if not before:
            if exc.outcome is not None:
                self.expect("inside the dropped transaction", pred, exc.outcome, None)
            else:
                self.expect("inside the dropped transaction", pred, None, exc.error)
        # The model does not move: nothing committed (checked by the invariants); the book still works.
        self.issue("redo after a dropped connection", cmd)

    @precondition(lambda self: self.drawable())
    @rule(data=st.data())
    def purge_entity(self, data: st.DataObject) -> None:
        """L11: purging a purgeable (terminal) entity deletes its row and appends a tombstone; a
        non-terminal one is refused without force; a stale expectation conflicts; both write nothing."""
        self._step()
        actor = data.draw(st.sampled_from(self.actors))
        entity = self.pick(data, "terminal")
        lc = entity.lc
        roll = data.draw(st.integers(0, 99))
        expected = None if roll < 60 else self.view(actor, entity)["status"] if roll < 90 else data.draw(
            st.sampled_from(lc.statuses))
        force = data.draw(st.integers(0, 99)) < 25
        codes = sbst.purge_reasons(lc)
        code = codes[0] if codes and data.draw(st.integers(0, 99)) < 92 else f"{lc.entity_type}.purged.unknown"
        pred = self.model.predict_purge(lc.entity_type, entity.entity_id, code, expected, force)
        out, exc = self.attempt(
            purge(self.book, lc.entity_type, entity.entity_id, reason=Reason(code, "cleanup"), actor=actor,
                  expected=expected, force=force, on_conflict="return")
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
