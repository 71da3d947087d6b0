"""Export of lifecycles to a ``transitions`` machine, Mermaid and a spec page (L16, L10)."""

from __future__ import annotations

import itertools
import re

import pytest
import sqlalchemy as sa
from transitions import MachineError

from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Lifecycle, edges, managed_table
from statebook.lifecycle.policy import Edge
from statebook.lifecycle.diagram import (
    NEW, LifecycleModel, accepted_edges, conditions, spec_page, to_machine, to_mermaid, trigger_name,
)

BUILTINS = sorted(builtin_registry(), key=lambda lc: lc.entity_type)
ids = [lc.entity_type for lc in BUILTINS]

_meta = sa.MetaData()
_review_table = managed_table("diagram_reviews", sa.Column("id", sa.String(32), primary_key=True),
                              sa.Column("note", sa.Text), meta=_meta)
REVIEW = Lifecycle(
    entity_type="review",
    table=_review_table,
    statuses=("draft", "review", "merged", "dropped"),
    initial={"draft"},
    terminal={"merged", "dropped"},
    edges=(
        *edges("draft", "review", "dropped"),
        *edges("review", "merged", patch="note"),
        *edges("review", "draft"),
        *edges("dropped", "draft", actors=("operator", "admin")),
    ),
    patch_fields={"note"},
    reason_prefixes={"review"},
    reasons={"review.draft.opened"},
)


def satisfying(edge: Edge) -> dict[str, object]:
    """Keyword arguments that meet every requirement of ``edge``."""
    return {
        "actor_type": sorted(edge.actors)[0] if edge.actors else "system",
        "patch": {f: 1 for f in edge.requires_patch},
        "guards": {f: 0 for f in edge.requires_guard},
    }


@pytest.mark.parametrize("lc", BUILTINS, ids=ids)
def test_machine_has_a_trigger_exactly_for_each_accepted_edge(lc):
    """L16: for every (source, target) pair the trigger exists from source iff the policy accepts the edge."""
    machine = to_machine(lc)
    for source, target in itertools.product(lc.statuses, repeat=2):
        declared = lc.edge(source, target) is not None
        name = trigger_name(source, target)
        assert (name in machine.get_triggers(source)) == declared, (source, target)
        if declared:
            assert set(machine.events[name].transitions) == {source}
            assert [t.dest for t in machine.events[name].transitions[source]] == [target]


@pytest.mark.parametrize("lc", BUILTINS, ids=ids)
def test_machine_moves_along_each_edge_and_refuses_the_rest(lc):
    """L16: firing a trigger from its source with the edge's requirements met lands on the target; fired
    from any other status it raises and the state stays; an undeclared pair has no trigger at all."""
    machine = to_machine(lc)
    model = machine.model
    for source, target in itertools.product(lc.statuses, repeat=2):
        edge = lc.edge(source, target)
        name = trigger_name(source, target)
        if edge is None:
            assert not hasattr(model, name), name
            continue
        for elsewhere in lc.statuses:
            machine.set_state(elsewhere)
            if elsewhere == source:
                assert getattr(model, name)(**satisfying(edge)) is True
                assert model.state == target
            else:
                with pytest.raises(MachineError):
                    getattr(model, name)(**satisfying(edge))
                assert model.state == elsewhere


@pytest.mark.parametrize("lc", BUILTINS, ids=ids)
def test_terminal_states_are_final_and_initial_states_are_entered(lc):
    """L16: terminal statuses are final states; the machine starts in the initial status (or NEW with one
    create_<status> trigger per initial status)."""
    machine = to_machine(lc)
    for status in lc.statuses:
        assert machine.get_state(status).final == (status in lc.terminal), status
    if len(lc.initial) == 1:
        assert machine.initial == next(iter(lc.initial))
    else:
        assert machine.initial == NEW
        assert sorted(machine.get_triggers(NEW)) == sorted(f"create_{s}" for s in lc.initial)
        for status in lc.initial:
            machine.set_state(NEW)
            getattr(machine.model, f"create_{status}")()
            assert machine.model.state == status


@pytest.mark.parametrize("lc", [*BUILTINS, REVIEW], ids=[*ids, "review"])
def test_gated_edges_refuse_a_non_operator(lc):
    """L10: every exit from a terminal status is gated; its conditions refuse a system actor even when
    every field is supplied, and accept a permitted actor."""
    machine = to_machine(lc)
    gated = [e for e in lc.edges if e.gated]
    assert all(e.gated for e in lc.edges if e.source in lc.terminal)
    for edge in gated:
        machine.set_state(edge.source)
        trigger = getattr(machine.model, trigger_name(edge.source, edge.target))
        assert trigger(**{**satisfying(edge), "actor_type": "system"}) is False
        assert trigger() is False
        assert machine.model.state == edge.source
        for actor in edge.actors:
            machine.set_state(edge.source)
            assert trigger(**{**satisfying(edge), "actor_type": actor}) is True
            assert machine.model.state == edge.target
    if lc.entity_type == "review":
        assert "actor_is_admin_or_operator" in conditions(lc)


@pytest.mark.parametrize("lc", [*BUILTINS, REVIEW], ids=[*ids, "review"])
def test_required_patch_and_guard_fields_are_conditions(lc):
    """L16 (mirrors L3): an edge requiring patch or guard fields refuses a command missing one of them."""
    machine = to_machine(lc)
    checked = 0
    for edge in lc.edges:
        for kind, fields in (("patch", edge.requires_patch), ("guards", edge.requires_guard)):
            for missing in fields:
                kwargs = satisfying(edge)
                kwargs[kind] = {f: 1 for f in fields if f != missing}
                machine.set_state(edge.source)
                assert getattr(machine.model, trigger_name(edge.source, edge.target))(**kwargs) is False
                assert machine.model.state == edge.source
                checked += 1
    assert checked > 0 or not any(e.requires_patch or e.requires_guard for e in lc.edges)


def test_a_model_of_your_own_gets_the_missing_conditions():
    """L16: to_machine installs the condition methods a caller's model lacks and keeps its own."""

    class Strict:
        def actor_is_admin_or_operator(self, **_):
            return False

    model = Strict()
    machine = to_machine(REVIEW, model)
    assert machine.model is model and model.state == "draft"
    assert callable(model.patch_has_note)
    machine.set_state("dropped")
    assert model.dropped__to__draft(actor_type="operator") is False  # the model's own condition wins
    assert isinstance(to_machine(REVIEW).model, LifecycleModel)


@pytest.mark.parametrize("lc", [*BUILTINS, REVIEW], ids=[*ids, "review"])
def test_mermaid_shows_every_edge_and_the_entry_and_exit_points(lc):
    """L16: the Mermaid diagram has one transition line per accepted edge, [*] entries for initial and
    [*] exits for terminal statuses, and labels Mermaid can parse (no ':' or ';' inside a label)."""
    text = to_mermaid(lc)
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2"
    moves = [re.match(r"^    (\S+) --> (\S+?)(?:: (.*))?$", line) for line in lines[1:]]
    assert all(moves), lines
    pairs = [(m[1], m[2]) for m in moves if "[*]" not in (m[1], m[2])]
    assert sorted(pairs) == sorted((e.source, e.target) for e in accepted_edges(lc))
    assert sorted(m[2] for m in moves if m[1] == "[*]") == sorted(lc.initial)
    assert sorted(m[1] for m in moves if m[2] == "[*]") == sorted(lc.terminal)
    for m in moves:
        assert m[3] is None or not re.search("[:;]", m[3]), m[0]
    for edge in lc.edges:
        line = next(m for m in moves if (m[1], m[2]) == (edge.source, edge.target))
        for actor in edge.actors:
            assert actor in line[3]
        for f in edge.requires_patch | edge.requires_guard:
            assert f in line[3]


def test_spec_page_is_deterministic_and_complete():
    """L16: the page does not depend on declaration order of edges/sets and names everything declared."""
    shuffled = Lifecycle(
        entity_type=REVIEW.entity_type, table=REVIEW.table, statuses=REVIEW.statuses,
        initial=REVIEW.initial, terminal=REVIEW.terminal, edges=tuple(reversed(REVIEW.edges)),
        patch_fields=REVIEW.patch_fields, reason_prefixes=REVIEW.reason_prefixes, reasons=REVIEW.reasons,
    )
    page = spec_page(REVIEW)
    assert page == spec_page(shuffled)
    assert page.endswith("\n") and not page.endswith("\n\n")
    assert "python -m statebook.adapters.specgen" in page
    assert REVIEW.fingerprint in page
    assert "```mermaid\n" + to_mermaid(REVIEW) + "```" in page
    for name in (*REVIEW.statuses, *REVIEW.patch_fields, *REVIEW.reasons):
        assert f"`{name}`" in page
    assert "| `dropped` | `draft` | `dropped__to__draft` | admin or operator only |" in page


def test_spec_page_changes_when_the_policy_changes():
    """L16 with L2: a new edge changes the fingerprint and therefore the page."""
    wider = REVIEW.extend(edges=edges("draft", "merged", patch="note"))
    assert spec_page(wider) != spec_page(REVIEW)
    assert wider.fingerprint in spec_page(wider)
