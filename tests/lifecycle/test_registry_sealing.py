"""L2: sealing, immutability, fingerprints, and extension before sealing."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import sqlalchemy as sa

from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Lifecycle, Registry, TransitionRejected, edges
from statebook.lifecycle.errors import PolicyError, RegistrySealed
from statebook.lifecycle.policy import Edge
from statebook.lifecycle import managed_table
from statebook.outbox import DISPATCH

META = sa.MetaData()
NOTES = managed_table(
    "sealing_notes",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("body", sa.Text),
    sa.Column("owner", sa.Text),
    meta=META,
)
OTHER_NOTES = managed_table("sealing_notes_v2", sa.Column("id", sa.String(32), primary_key=True),
                            sa.Column("body", sa.Text), sa.Column("owner", sa.Text), meta=META)


def note(**changes: object) -> Lifecycle:
    spec: dict[str, object] = dict(
        entity_type="note",
        table=NOTES,
        statuses=("draft", "published", "archived"),
        initial={"draft"},
        terminal={"archived"},
        edges=(*edges("draft", "published", "archived"), *edges("published", "archived", patch="body")),
        patch_fields={"body", "owner"},
        reason_prefixes={"note"},
        reasons={"note.draft.created", "note.published.ok", "note.archived.old"},
    )
    spec.update(changes)
    return Lifecycle(**spec)  # type: ignore[arg-type]


# -- sealing ------------------------------------------------------------------------------------


def test_sealed_registry_refuses_register_and_extend():
    """L2: after seal() nothing can be added or replaced; the message says to do it before sealing."""
    registry = Registry([note()]).seal()
    assert registry.sealed
    before = registry.get("note")
    with pytest.raises(RegistrySealed, match="before sealing"):
        registry.register(note(entity_type="memo", table=OTHER_NOTES, reason_prefixes={"memo"}, reasons=set()))
    with pytest.raises(RegistrySealed, match="sealed"):
        registry.extend("note", reasons={"note.draft.imported"})
    assert "memo" not in registry
    assert registry.get("note") is before
    assert len(registry) == 1


def test_sealed_error_is_a_policy_error():
    """L2: RegistrySealed belongs to the PolicyError family so callers can catch either."""
    with pytest.raises(PolicyError):
        Registry().seal().register(note())


def test_builtin_registry_is_sealed_by_default_and_independent_when_not():
    """L2: the default registry is sealed; unsealed copies do not share state."""
    assert builtin_registry().sealed
    a, b = builtin_registry(seal=False), builtin_registry(seal=False)
    a.extend("dispatch", reasons={"dispatch.pending.imported"})
    assert "dispatch.pending.imported" in a.get("dispatch").reasons
    assert "dispatch.pending.imported" not in b.get("dispatch").reasons
    assert "dispatch.pending.imported" not in DISPATCH.reasons


def test_iterating_a_sealed_registry_cannot_mutate_it():
    """L2: the registry hands out copies of its listing, not its storage."""
    registry = Registry([note()]).seal()
    listing = list(registry)
    listing.clear()
    assert len(registry) == 1 and "note" in registry


def test_policies_are_frozen():
    """L2: a Lifecycle and its Edges cannot be changed in place."""
    lc = note()
    with pytest.raises(dataclasses.FrozenInstanceError):
        lc.terminal = frozenset()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        lc.edges[0].actors = frozenset({"anyone"})  # type: ignore[misc]
    assert isinstance(lc.edges, tuple) and isinstance(lc.initial, frozenset)
    assert isinstance(lc.patch_fields, frozenset) and isinstance(lc.reasons, frozenset)
    with pytest.raises(TypeError):
        lc._index[("archived", "draft")] = Edge("archived", "draft")  # type: ignore[index]
    assert lc.edge("archived", "draft") is None


def test_builtin_policy_objects_are_frozen():
    """L2: the shipped DISPATCH policy is immutable too (a module-level object every registry shares)."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        DISPATCH.edges = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        DISPATCH.terminal.add("pending")  # type: ignore[attr-defined]


# -- fingerprints -------------------------------------------------------------------------------


def test_fingerprint_is_stable_for_equal_declarations():
    """L2: equal declarations hash equal, whatever the order edges and sets were written in."""
    a = note()
    b = note(
        edges=(*edges("published", "archived", patch="body"), *edges("draft", "archived", "published")),
        initial=["draft"],
        reasons=["note.archived.old", "note.published.ok", "note.draft.created"],
        patch_fields=("owner", "body"),
    )
    assert a.fingerprint == b.fingerprint
    assert len(a.fingerprint) == 16 and int(a.fingerprint, 16) >= 0


def test_fingerprint_does_not_depend_on_the_process():
    """L2: the fingerprint is a content hash, not Python's randomised hash(): equal across processes."""
    code = "from statebook.outbox import DISPATCH; print(DISPATCH.fingerprint)"
    seen = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed}).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert seen == {DISPATCH.fingerprint}


CHANGES = {
    "edge_added": dict(edges=(*note().edges, *edges("draft", "draft"))),
    "edge_gated": dict(edges=(*edges("draft", "published"), *edges("draft", "archived", actors="operator"),
                              *edges("published", "archived", patch="body"))),
    "edge_requirement": dict(edges=(*edges("draft", "published", "archived"), *edges("published", "archived"))),
    "edge_guard": dict(edges=(*edges("draft", "published", "archived"),
                              *edges("published", "archived", patch="body", guard="owner"))),
    "status_added": dict(statuses=("draft", "published", "archived", "hidden"),
                         edges=(*note().edges, *edges("draft", "hidden"))),
    "initial": dict(initial={"draft", "published"}),
    "terminal": dict(terminal={"archived", "published"}, edges=edges("draft", "published", "archived")),
    "patch_field": dict(patch_fields={"body"}),
    "reason": dict(reasons={"note.draft.created", "note.published.ok", "note.archived.old", "note.draft.copied"}),
    "prefix": dict(reason_prefixes={"note", "memo"}),
    "table": dict(table=OTHER_NOTES),
    "same_status": dict(same_status="allow"),
    "purgeable": dict(purgeable={"archived", "draft"}),
}


@pytest.mark.parametrize("change", list(CHANGES.values()), ids=list(CHANGES))
def test_fingerprint_changes_when_the_declaration_changes(change):
    """L2: any change to what the policy allows gives a new fingerprint (facts record which one they obeyed)."""
    changed = note(**change)
    assert changed.canonical() != note().canonical()
    assert changed.fingerprint != note().fingerprint


# -- extension ----------------------------------------------------------------------------------


def test_lifecycle_extend_adds_and_never_removes():
    """L2: extend() returns a new policy with more; the original is untouched."""
    base = note()
    extended = base.extend(
        statuses=["hidden"],
        terminal=["hidden"],
        edges=edges("draft", "hidden"),
        reasons=["note.hidden.spam"],
        patch_fields=["owner"],
    )
    assert extended is not base
    assert base.edge("draft", "hidden") is None and "hidden" not in base.statuses
    assert extended.statuses == ("draft", "published", "archived", "hidden")
    assert extended.edge("draft", "hidden") is not None
    assert set(base.edges) <= set(extended.edges)
    assert base.reasons < extended.reasons
    assert extended.terminal == {"archived", "hidden"}
    assert extended.purgeable == {"archived", "hidden"}, "a new terminal status is purgeable like the others"
    assert extended.fingerprint != base.fingerprint


def test_extend_cannot_loosen_an_existing_edge():
    """L2: re-declaring an existing (source, target) in extend() does not replace it, so a gate stays a gate."""
    extended = DISPATCH.extend(edges=edges("dead_letter", "pending"))
    edge = extended.edge("dead_letter", "pending")
    assert edge is not None and edge.actors == {"operator"}
    assert edge.requires_patch == {"attempt", "next_attempt_at", "last_error"}
    assert extended.fingerprint == DISPATCH.fingerprint


def test_registry_extend_of_a_builtin_before_sealing():
    """L2: an application extends the built-in dispatch policy, then seals; the module's DISPATCH is unchanged."""
    registry = builtin_registry(seal=False)
    extended = registry.extend(
        "dispatch",
        edges=edges("pending", "dead_letter", actors="operator"),
        reasons={"dispatch.dead_letter.operator_cancel"},
    )
    assert registry.get("dispatch") is extended
    assert extended.fingerprint != DISPATCH.fingerprint
    assert DISPATCH.edge("pending", "dead_letter") is None
    registry.seal()
    extended.check_command(["pending"], "dead_letter", actor_type="operator",
                           reason_code="dispatch.dead_letter.operator_cancel")
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["pending"], "dead_letter", actor_type="operator",
                               reason_code="dispatch.dead_letter.max_attempts")
    assert excinfo.value.rule == "edge"
    with pytest.raises(RegistrySealed):
        registry.extend("dispatch", reasons={"dispatch.pending.late"})
    assert "dispatch.pending.late" not in registry.get("dispatch").reasons


def test_extending_a_builtin_with_a_status_is_accepted():
    """L1/L2: a new dispatch status registers; the table's CHECK follows the registry (built when the schema is)."""
    registry = builtin_registry(seal=False)
    extended = registry.extend("dispatch", statuses=["held"], edges=edges("pending", "held") + edges("held", "pending"))
    assert registry.get("dispatch") is extended and "held" in extended.statuses
    assert "held" not in DISPATCH.statuses


def test_actor_type_cannot_hold_the_separator():
    """L3: actor gates compare actor types, parsed back from 'type:id', so a type may not contain ':'."""
    assert Actor.parse("operator:alice") == Actor("operator", "alice")
    assert str(Actor("system")) == "system"
    with pytest.raises(ValueError, match="':'"):
        Actor("op:erator")
    with pytest.raises(ValueError):
        Actor("")
