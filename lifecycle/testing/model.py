"""The reference model: what the engine must answer, derived from the registry alone.

Every lifecycle becomes a ``transitions.Machine`` whose states are its statuses, with one trigger per
allowed move (``<source>__to__<target>``, implicit same-status moves included); an edge's actor gate
and its required patch and guard fields are the trigger's conditions. :class:`ReferenceModel` holds
those machines plus the entities and idempotency keys seen so far, and predicts the engine's answer
to a command — rejected (by which rules), conflict, applied, replayed, idempotency mismatch, not found,
or refused by a unique key of the table that another entity holds (:mod:`.uniques`). It never looks at
the engine, so it is an independent oracle for users' own properties::

    model = ReferenceModel(registry)
    model.allowed("order", "placed", "paid", actor_type="customer")            # -> True / False
    entity = model.apply_create("order", "o-1", "placed", values, "order.placed.new", "", fact_id, now)
    model.predict_transition(TransitionCmd("order", "o-1", "paid", "order.paid.card", "",
                                           Actor("customer", "c"), ("placed",)))
    # -> Prediction(kind='applied', status='paid', version=2)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from transitions import Machine
from transitions.core import Condition, EventData

from ..facts import Fact
from ..policy import Edge, Lifecycle, Registry
from ..reasons import Actor
from ..schema import row_defaults
from .uniques import UniqueKey, unique_keys

__all__ = [
    "Entity", "KeyUse", "Prediction", "ReferenceModel", "TransitionCmd", "build_machine", "trigger_name",
]

_MISSING = object()


def trigger_name(source: str, target: str) -> str:
    """The trigger of the move ``source -> target`` in a lifecycle's machine."""
    return f"{source}__to__{target}"


@dataclass(frozen=True)
class Gate:
    """One condition of an edge's trigger; ``rule`` is the TransitionRejected rule it stands for."""

    rule: str
    edge: Edge

    def __call__(self, event: EventData) -> bool:
        kw = event.kwargs
        if self.rule == "actor":
            return kw["actor_type"] in self.edge.actors
        if self.rule == "patch":
            return self.edge.requires_patch <= set(kw["patch"])
        return self.edge.requires_guard <= set(kw["guards"])


def _gates(edge: Edge) -> list[str | Callable[..., bool | None]]:  # the type add_transition takes
    gates: list[str | Callable[..., bool | None]] = [Gate("actor", edge)] if edge.actors else []
    if edge.requires_patch:
        gates.append(Gate("patch", edge))
    if edge.requires_guard:
        gates.append(Gate("guard", edge))
    return gates


def _rule(condition: Condition) -> str:
    """The rule of a condition :func:`_gates` made (every condition of the model's machines is a Gate)."""
    gate = condition.func
    assert isinstance(gate, Gate)
    return gate.rule


def build_machine(lc: Lifecycle) -> Machine:
    """A ``transitions.Machine`` for one lifecycle: statuses as states, one trigger per allowed move.

    Triggers take ``actor_type``, ``patch`` and ``guards`` keyword arguments (the gates' inputs).
    """
    machine = Machine(model=None, states=list(lc.statuses), initial=None, auto_transitions=False,
                      send_event=True, name=lc.entity_type)
    declared = set()
    for edge in lc.edges:
        declared.add((edge.source, edge.target))
        machine.add_transition(trigger_name(edge.source, edge.target), edge.source, edge.target,
                               conditions=_gates(edge))
    if lc.same_status == "allow":
        for status in lc.statuses:
            if status not in lc.terminal and (status, status) not in declared:
                machine.add_transition(trigger_name(status, status), status, status)
    return machine


@dataclass(frozen=True)
class TransitionCmd:
    """One transition command as a caller would issue it (the arguments of ``transition``)."""

    entity_type: str
    entity_id: str
    target: str
    reason_code: str
    reason_summary: str
    actor: Actor
    expected: tuple[str, ...]
    guards: Mapping[str, Any] = field(default_factory=dict)
    patch: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """The (entity type, entity id) the command moves."""
        return (self.entity_type, self.entity_id)

    def signature(self) -> str:
        """What the engine's command digest covers (everything but the key and metadata)."""
        return json.dumps(
            [self.entity_type, self.entity_id, self.target, self.reason_code, self.reason_summary,
             self.actor.type, self.actor.id, sorted(self.expected), dict(self.guards), dict(self.patch)],
            sort_keys=True,
        )


@dataclass(frozen=True)
class Prediction:
    """What the engine must answer.

    ``kind``: rejected | conflict | applied | replayed | mismatch | not_found | duplicate | unique.
    ``rules``: for rejected, every rule the command breaks (the engine names one of them).
    ``key``: for duplicate (a create) and unique (a transition), the unique key another entity already
    holds (a duplicate id leaves it None).
    """

    kind: str
    rules: frozenset[str] = frozenset()
    status: str | None = None
    version: int | None = None
    fact_id: str | None = None
    key: str | None = None

    @property
    def writes(self) -> bool:
        """Whether the command writes a fact."""
        return self.kind == "applied"


class Entity:
    """The model of one entity; also the ``transitions`` model object (its status is ``state``)."""

    def __init__(self, lc: Lifecycle, entity_id: str) -> None:
        self.lc = lc
        self.entity_id = entity_id
        self.state: str | None = None
        self.version = 0
        self.data: dict[str, Any] = {}
        self.purged = False

    @property
    def key(self) -> tuple[str, str]:
        """The (entity type, entity id) of the entity."""
        return (self.lc.entity_type, self.entity_id)

    def __repr__(self) -> str:
        gone = " purged" if self.purged else ""
        return f"<{self.lc.entity_type} {self.entity_id} {self.state} v{self.version}{gone}>"


@dataclass(frozen=True)
class KeyUse:
    """An idempotency key that committed: the command and its original outcome."""

    cmd: TransitionCmd
    status: str
    version: int
    fact_id: str


class ReferenceModel:
    """The oracle: lifecycles as machines, plus the entities and idempotency keys seen so far.

    ``entity_types`` limits it to some lifecycles of ``registry`` (default: all of them). The unique keys
    of their tables are read from the tables (:mod:`.uniques`); a key the model cannot read raises
    ``ValueError`` naming it.
    """

    def __init__(self, registry: Registry, entity_types: tuple[str, ...] | None = None) -> None:
        types = entity_types if entity_types is not None else tuple(lc.entity_type for lc in registry)
        self.lifecycles = {t: registry.get(t) for t in types}
        self.machines = {t: build_machine(lc) for t, lc in self.lifecycles.items()}
        self.unique: dict[str, tuple[UniqueKey, ...]] = {t: unique_keys(lc) for t, lc in self.lifecycles.items()}
        self.entities: dict[tuple[str, str], Entity] = {}
        self.keys: dict[tuple[str, str, str], KeyUse] = {}

    # -- reading ------------------------------------------------------------------------------
    def live(self) -> list[Entity]:
        """The entities not purged."""
        return [e for e in self.entities.values() if not e.purged]

    def allowed(self, entity_type: str, source: str | None, target: str | None, *, actor_type: str,
                patch: Mapping[str, Any] | tuple[str, ...] = (), guards: Mapping[str, Any] | tuple[str, ...] = (),
                check_guards: bool = True) -> bool:
        """Whether the machine has the move ``source -> target`` for this actor type, patch and guards."""
        if source is None or target is None:
            return False
        machine = self.machines[entity_type]
        found = machine.get_transitions(trigger_name(source, target), source=source, dest=target)
        probe = EventData(None, None, machine, None, (), {"actor_type": actor_type, "patch": patch, "guards": guards})
        return bool(found) and all(
            c.check(probe) for c in found[0].conditions if check_guards or _rule(c) != "guard"
        )

    def taken(self, entity_type: str, row: Mapping[str, Any], besides: str | None = None) -> str | None:
        """The name of a unique key whose value in ``row`` another live entity (not ``besides``) holds."""
        for key in self.unique[entity_type]:
            mine = key.of(row)
            if mine is not None and any(
                e.lc.entity_type == entity_type and e.entity_id != besides and key.of(e.data) == mine
                for e in self.live()
            ):
                return key.name
        return None

    def accepts(self, fact: Fact) -> bool:
        """Whether a recorded (non-creation, non-tombstone) fact follows an allowed move; guards are
        not recorded, so they are not judged."""
        return self.allowed(fact.entity_type, fact.previous_status, fact.status, actor_type=fact.actor_type,
                            patch=fact.patch, check_guards=False)

    def violations(self, cmd: TransitionCmd) -> frozenset[str]:
        """Every policy rule the command breaks, whatever the entity's current status."""
        lc = self.lifecycles[cmd.entity_type]
        machine = self.machines[cmd.entity_type]
        rules: set[str] = set()
        if cmd.reason_code not in lc.reasons:
            rules.add("reason")
        if any(s not in lc.statuses for s in (cmd.target, *cmd.expected)) or not cmd.expected:
            rules.add("status")
        if (set(cmd.patch) | set(cmd.guards)) - lc.patch_fields:
            rules.add("patch")
        elif any(isinstance(lc.table.c[g].type, sa.JSON) for g in cmd.guards):
            rules.add("guard")
        if "status" in rules:
            return frozenset(rules)
        probe = EventData(None, None, machine, None, (),
                          {"actor_type": cmd.actor.type, "patch": cmd.patch, "guards": cmd.guards})
        for source in cmd.expected:
            found = machine.get_transitions(trigger_name(source, cmd.target), source=source, dest=cmd.target)
            if not found:
                rules.add("edge")
                continue
            rules.update(_rule(c) for c in found[0].conditions if not c.check(probe))
        return frozenset(rules)

    # -- transitions --------------------------------------------------------------------------
    def predict_transition(self, cmd: TransitionCmd) -> Prediction:
        """What ``transition`` must answer to ``cmd`` now."""
        rules = self.violations(cmd)
        if rules:
            return Prediction("rejected", rules)
        if cmd.idempotency_key is not None:
            used = self.keys.get((*cmd.key, cmd.idempotency_key))
            if used is not None:
                if used.cmd.signature() != cmd.signature():
                    return Prediction("mismatch")
                return Prediction("replayed", status=used.status, version=used.version, fact_id=used.fact_id)
        entity = self.entities.get(cmd.key)
        if entity is None or entity.purged:
            return Prediction("not_found")
        stale = entity.state not in cmd.expected or any(
            entity.data.get(g, _MISSING) != v for g, v in cmd.guards.items()
        )
        if stale:
            return Prediction("conflict", status=entity.state, version=entity.version)
        key = self.taken(cmd.entity_type, {**entity.data, **cmd.patch, "status": cmd.target}, besides=cmd.entity_id)
        if key is not None:  # the UPDATE is refused by the database: ConstraintViolation, nothing written
            return Prediction("unique", status=entity.state, version=entity.version, key=key)
        return Prediction("applied", status=cmd.target, version=entity.version + 1)

    def apply_transition(self, cmd: TransitionCmd, fact_id: str, at: float) -> None:
        """Move the model: the engine applied ``cmd`` as fact ``fact_id`` at time ``at``."""
        entity = self.entities[cmd.key]
        moved = self.machines[cmd.entity_type].events[trigger_name(entity.state or "", cmd.target)].trigger(
            entity, actor_type=cmd.actor.type, patch=cmd.patch, guards=cmd.guards
        )
        assert moved, f"the reference machine refused {cmd} although the oracle predicted it applies"
        entity.version += 1
        entity.data.update(cmd.patch)
        entity.data.update(
            status=cmd.target, version=entity.version, updated_at=at, status_reason_code=cmd.reason_code,
            status_reason_summary=cmd.reason_summary, last_fact_id=fact_id,
        )
        if cmd.idempotency_key is not None:
            self.keys[(*cmd.key, cmd.idempotency_key)] = KeyUse(cmd, cmd.target, entity.version, fact_id)

    # -- create and purge ---------------------------------------------------------------------
    def predict_create(self, entity_type: str, entity_id: str, status: str, reason_code: str,
                       values: Mapping[str, Any] | None = None) -> Prediction:
        """What ``create`` must answer; with ``values`` (the data columns given) a unique key another live
        entity holds is judged too (without them, only the id)."""
        lc = self.lifecycles[entity_type]
        rules = {"reason"} if reason_code not in lc.reasons else set()
        if status not in lc.initial:
            rules.add("initial")
        if rules:
            return Prediction("rejected", frozenset(rules))
        if (entity_type, entity_id) in self.entities:
            return Prediction("duplicate")
        if values is not None:
            key = self.taken(entity_type, {**row_defaults(lc.table), **values, "id": entity_id, "status": status})
            if key is not None:
                return Prediction("duplicate", key=key)
        return Prediction("applied", status=status, version=1)

    def apply_create(self, entity_type: str, entity_id: str, status: str, values: Mapping[str, Any],
                     reason_code: str, reason_summary: str, fact_id: str, at: float) -> Entity:
        """Add the entity ``create`` made: its row is the declared defaults, ``values`` and the lifecycle columns."""
        lc = self.lifecycles[entity_type]
        entity = Entity(lc, entity_id)
        entity.version = 1
        entity.data = dict(row_defaults(lc.table))
        entity.data.update(values, id=entity_id)
        entity.data.update(
            status=status, version=1, updated_at=at, status_reason_code=reason_code,
            status_reason_summary=reason_summary, last_fact_id=fact_id,
        )
        self.machines[entity_type].add_model(entity, initial=status)
        self.entities[entity.key] = entity
        return entity

    def predict_purge(self, entity_type: str, entity_id: str, reason_code: str, expected: str | None,
                      force: bool) -> Prediction:
        """What ``purge`` must answer."""
        lc = self.lifecycles[entity_type]
        if reason_code not in lc.reasons:
            return Prediction("rejected", frozenset({"reason"}))
        entity = self.entities.get((entity_type, entity_id))
        if entity is None or entity.purged:
            return Prediction("not_found")
        if expected is not None and entity.state != expected:
            return Prediction("conflict", status=entity.state, version=entity.version)
        if not force and entity.state not in (lc.purgeable or ()):
            return Prediction("rejected", frozenset({"purge"}))
        return Prediction("applied", status=None, version=entity.version + 1)

    def apply_purge(self, entity_type: str, entity_id: str) -> None:
        """Move the model: the entity was purged (its row deleted, a tombstone appended)."""
        entity = self.entities[(entity_type, entity_id)]
        self.machines[entity_type].remove_model(entity)
        entity.purged = True
        entity.version += 1

    # -- facts written by someone else --------------------------------------------------------
    def absorb(self, fact: Fact, row: Mapping[str, Any] | None) -> Entity:
        """Take in a fact the model did not predict — written by the application's own code — so the
        model follows it. ``row`` is the entity's row (or fold) after the fact. Whether the move was
        allowed is judged elsewhere (:meth:`accepts`); here the model only catches up."""
        key = (fact.entity_type, fact.entity_id)
        entity = self.entities.get(key)
        machine = self.machines[fact.entity_type]
        if entity is None:
            entity = Entity(self.lifecycles[fact.entity_type], fact.entity_id)
            self.entities[key] = entity
            if fact.status is not None:
                machine.add_model(entity, initial=fact.status)
        elif fact.status is None and not entity.purged:
            machine.remove_model(entity)
        entity.version = fact.version
        if fact.status is None:
            entity.purged = True
        else:
            entity.state = fact.status
        if row is not None:  # the chain hash is checked by the chain invariant, not predicted
            entity.data = {c: v for c, v in row.items() if c != "chain_hash"}
        return entity
