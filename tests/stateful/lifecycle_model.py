"""Reference model for the lifecycle state-machine test (tests/stateful/test_lifecycle_machine.py).

The oracle is built from the registry, not from the engine: every lifecycle becomes a
``transitions.Machine`` whose states are its statuses and which has one trigger per accepted edge
(``<source>__to__<target>``). An edge's actor gate and its required patch and guard fields are the
trigger's conditions. ``ReferenceModel.predict_*`` says what the engine must answer to a command —
rejected (and by which rules), conflict, applied, replayed, idempotency mismatch, not found — and
``apply_*`` moves the model when the engine applied it.

Also here: the ``ticket`` test lifecycle (its own table on its own MetaData), the registry that
holds it next to the built-ins, and value strategies for every patchable column.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from hypothesis import strategies as st
from transitions import Machine
from transitions.core import EventData

from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Lifecycle, Registry, edges, managed_table
from statebook.lifecycle.policy import Edge

# -- the test lifecycle ------------------------------------------------------------------------

TEST_META = sa.MetaData()
"""Kept apart from statebook's MetaData so the schema helpers never see the test table."""

TICKET_STATUSES = ("draft", "open", "review", "done", "rejected")

tickets = managed_table(
    "stateful_tickets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("assignee", sa.Text, nullable=True),
    sa.Column("revision", sa.Integer, nullable=False, server_default="0"),
    sa.Column("notes", sa.JSON, nullable=True),
    sa.Column("score", sa.Float, nullable=True),
    meta=TEST_META,
)

TICKET = Lifecycle(
    entity_type="ticket",
    table=tickets,
    statuses=TICKET_STATUSES,
    initial={"draft", "open"},
    terminal={"done", "rejected"},
    edges=(
        *edges("draft", "open"),
        *edges("draft", "rejected", actors="operator"),
        *edges("open", "review", patch="assignee"),
        *edges("open", "rejected"),
        # A declared self-edge wins over the implicit one same_status="allow" gives.
        *edges("review", "review", guard="revision"),
        *edges("review", "open"),
        *edges("review", "done", actors="reviewer", guard="revision", patch="revision"),
        *edges("review", "rejected", actors="reviewer"),
        *edges("done", "open", actors="operator", patch="revision"),
        *edges("rejected", "draft", actors="operator"),
    ),
    patch_fields={"assignee", "revision", "notes", "score"},
    reason_prefixes={"ticket"},
    reasons={
        "ticket.draft.created", "ticket.open.created", "ticket.draft.edited", "ticket.open.submitted",
        "ticket.open.edited", "ticket.review.requested", "ticket.review.revised", "ticket.open.returned",
        "ticket.done.approved", "ticket.rejected.declined", "ticket.open.reopened", "ticket.draft.revived",
        "ticket.purged.operator",
    },
    same_status="allow",
    description="Test lifecycle: gated terminal exits, a declared self-edge, implicit same-status moves.",
)

ENTITY_TYPES = ("ticket", "dispatch", "schedule_run")

PURGE_REASONS = {
    "ticket": "ticket.purged.operator",
    "dispatch": "dispatch.purged.operator",
    "schedule_run": "schedule_run.purged.operator",
}

ACTORS = (
    Actor("system", "delivery"),
    Actor("system", "launcher"),
    Actor("operator", "alice"),
    Actor("reviewer", "bob"),
    Actor("consumer", "hook"),
)


def make_registry() -> Registry:
    """The built-ins plus ``ticket``, sealed."""
    registry = builtin_registry(seal=False)
    registry.register(TICKET)
    return registry.seal()




def creation_values(entity_type: str, now: float) -> dict[str, Any]:
    """Realistic data columns for a new entity of each lifecycle."""
    if entity_type == "dispatch":
        return {
            "kind": "webhook", "deliver_to": "https://hooks.example.test/in", "payload": {},
            "next_attempt_at": now, "created_at": now, "attempt": 0, "max_attempts": 8, "ack_required": 0,
        }
    if entity_type == "schedule_run":
        return {
            "schedule_id": None, "trigger_context": {}, "action_kind": "command", "action_args": [],
            "fired_at": now, "created_at": now, "chain_depth": 0,
        }
    return {"title": "fix the flaky test", "revision": 0, "notes": {}}


# -- column values -----------------------------------------------------------------------------


def is_json(column: sa.Column) -> bool:
    return isinstance(column.type, sa.JSON)


def guardable(lc: Lifecycle) -> list[str]:
    """Patch fields a guard may compare: JSON columns have no equality operator on PostgreSQL."""
    return sorted(f for f in lc.patch_fields if not is_json(lc.table.c[f]))


def column_values(column: sa.Column) -> st.SearchStrategy[Any]:
    """Values the column accepts on both backends (exact floats, int4 integers, plain text)."""
    kind = column.type
    if isinstance(kind, sa.JSON):
        base: st.SearchStrategy[Any] = st.sampled_from([{}, {"n": 1}, ["a", "b"], []])
    elif isinstance(kind, sa.Integer):
        base = st.integers(-3, 12)
    elif isinstance(kind, sa.Float):
        base = st.integers(0, 4_000).map(lambda i: 1_700_000_000.0 + i / 4)
    else:
        base = st.text(alphabet="abxyz-", max_size=5)
    return st.one_of(st.none(), base) if column.nullable else base


def column_default(column: sa.Column) -> Any:
    """The value a row gets for a column its creation did not mention."""
    default = column.server_default
    if default is None:
        return None
    text = str(getattr(default, "arg", default))
    return int(text) if isinstance(column.type, sa.Integer) else text


# -- the machine -------------------------------------------------------------------------------


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


def trigger_name(source: str, target: str) -> str:
    return f"{source}__to__{target}"


def _gates(edge: Edge) -> list[Gate]:
    gates = [Gate("actor", edge)] if edge.actors else []
    if edge.requires_patch:
        gates.append(Gate("patch", edge))
    if edge.requires_guard:
        gates.append(Gate("guard", edge))
    return gates


def build_machine(lc: Lifecycle) -> Machine:
    """A ``transitions.Machine`` for one lifecycle: statuses as states, one trigger per edge."""
    machine = Machine(
        model=None, states=list(lc.statuses), initial=None, auto_transitions=False, send_event=True,
        name=lc.entity_type,
    )
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


# -- commands and predictions -----------------------------------------------------------------


@dataclass(frozen=True)
class TransitionCmd:
    """One transition command as a caller would issue it."""

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

    ``kind``: rejected | conflict | applied | replayed | mismatch | not_found | duplicate.
    ``rules``: for rejected, every rule the command breaks (the engine names one of them).
    """

    kind: str
    rules: frozenset[str] = frozenset()
    status: str | None = None
    version: int | None = None
    fact_id: str | None = None

    @property
    def writes(self) -> bool:
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
    """The oracle: lifecycles as machines, plus the entities and idempotency keys seen so far."""

    def __init__(self, registry: Registry, entity_types: tuple[str, ...] = ENTITY_TYPES) -> None:
        self.lifecycles = {t: registry.get(t) for t in entity_types}
        self.machines = {t: build_machine(lc) for t, lc in self.lifecycles.items()}
        self.entities: dict[tuple[str, str], Entity] = {}
        self.keys: dict[tuple[str, str, str], KeyUse] = {}

    # -- reading ------------------------------------------------------------------------------
    def live(self) -> list[Entity]:
        return [e for e in self.entities.values() if not e.purged]

    def accepts(self, entity_type: str, source: str | None, target: str | None, actor_type: str,
                patch: Mapping[str, Any]) -> bool:
        """Whether a recorded fact follows an edge the machine has (guards are not recorded)."""
        if source is None or target is None:
            return False
        machine = self.machines[entity_type]
        found = machine.get_transitions(trigger_name(source, target), source=source, dest=target)
        probe = EventData(None, None, machine, None, (), {"actor_type": actor_type, "patch": patch,
                                                          "guards": ()})
        return bool(found) and all(
            c.check(probe) for c in found[0].conditions if c.func.rule != "guard"
        )

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
        if "status" in rules:
            return frozenset(rules)
        probe = EventData(None, None, machine, None, (),
                          {"actor_type": cmd.actor.type, "patch": cmd.patch, "guards": cmd.guards})
        for source in cmd.expected:
            found = machine.get_transitions(trigger_name(source, cmd.target), source=source, dest=cmd.target)
            if not found:
                rules.add("edge")
                continue
            rules.update(c.func.rule for c in found[0].conditions if not c.check(probe))
        return frozenset(rules)

    # -- transitions --------------------------------------------------------------------------
    def predict_transition(self, cmd: TransitionCmd) -> Prediction:
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
        return Prediction("applied", status=cmd.target, version=entity.version + 1)

    def apply_transition(self, cmd: TransitionCmd, fact_id: str, at: float) -> None:
        entity = self.entities[cmd.key]
        moved = self.machines[cmd.entity_type].events[trigger_name(entity.state, cmd.target)].trigger(
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
    def predict_create(self, entity_type: str, entity_id: str, status: str, reason_code: str) -> Prediction:
        lc = self.lifecycles[entity_type]
        rules = {"reason"} if reason_code not in lc.reasons else set()
        if status not in lc.initial:
            rules.add("initial")
        if rules:
            return Prediction("rejected", frozenset(rules))
        if (entity_type, entity_id) in self.entities:
            return Prediction("duplicate")
        return Prediction("applied", status=status, version=1)

    def apply_create(self, entity_type: str, entity_id: str, status: str, values: Mapping[str, Any],
                     reason_code: str, reason_summary: str, fact_id: str, at: float) -> Entity:
        lc = self.lifecycles[entity_type]
        entity = Entity(lc, entity_id)
        entity.version = 1
        entity.data = {f: column_default(lc.table.c[f]) for f in lc.patch_fields}
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
        entity = self.entities[(entity_type, entity_id)]
        self.machines[entity_type].remove_model(entity)
        entity.purged = True
        entity.version += 1


_MISSING = object()
