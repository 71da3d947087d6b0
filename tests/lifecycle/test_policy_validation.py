"""L1: the registry refuses a declaration it could not operate safely, naming what is wrong."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from statebook.lifecycle import Lifecycle, Registry, edges, managed_table
from statebook.lifecycle.errors import PolicyError, UnknownEntityType
from statebook.lifecycle.policy import Edge
from statebook.lifecycle.validation import validate
from statebook.lifecycle.reasons import check_reason_code

META = sa.MetaData()
WIDGETS = managed_table(
    "widgets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("size", sa.Integer),
    sa.Column("color", sa.Text),
    meta=META,
)
GADGETS = managed_table("gadgets", sa.Column("id", sa.String(32), primary_key=True), meta=META)
with pytest.deprecated_call(match="drop statuses="):  # the deprecated second list of statuses, kept working
    CHECKED = managed_table(
        "checked_widgets", sa.Column("id", sa.String(32), primary_key=True), statuses=("open", "done"), meta=META
    )
PLAIN = sa.Table("plain_widgets", META, sa.Column("id", sa.String(32), primary_key=True), sa.Column("status", sa.Text))


def widget(**changes: object) -> Lifecycle:
    """A valid lifecycle; each test breaks exactly one thing."""
    spec: dict[str, object] = dict(
        entity_type="widget",
        table=WIDGETS,
        statuses=("open", "working", "done"),
        initial={"open"},
        terminal={"done"},
        edges=(*edges("open", "working"), *edges("working", "done", "open")),
        patch_fields={"size", "color"},
        reason_prefixes={"widget"},
        reasons={"widget.open.created", "widget.working.started", "widget.done.finished"},
    )
    spec.update(changes)
    return Lifecycle(**spec)  # type: ignore[arg-type]


def gadget(**changes: object) -> Lifecycle:
    spec: dict[str, object] = dict(
        entity_type="gadget",
        table=GADGETS,
        statuses=("new", "gone"),
        initial={"new"},
        terminal={"gone"},
        edges=edges("new", "gone"),
        reason_prefixes={"gadget"},
        reasons={"gadget.new.created"},
    )
    spec.update(changes)
    return Lifecycle(**spec)  # type: ignore[arg-type]


def test_the_base_declaration_is_valid():
    """L1: the fixture lifecycle passes, so each refusal below is caused by its one change."""
    validate(widget())
    registry = Registry([widget(), gadget()])
    assert sorted(lc.entity_type for lc in registry) == ["gadget", "widget"]


# Each case: (what is broken, the change, fragments the message must contain).
REFUSALS = [
    ("unknown_initial", dict(initial={"open", "ghost"}), ["initial", "ghost"]),
    ("unknown_terminal", dict(terminal={"done", "ghost"}), ["terminal", "ghost"]),
    ("unknown_purgeable", dict(purgeable={"ghost"}), ["purgeable", "ghost"]),
    ("edge_to_unknown", dict(edges=(*widget().edges, *edges("working", "ghost"))), ["working -> ghost", "'ghost'"]),
    ("edge_from_unknown", dict(edges=(*widget().edges, *edges("ghost", "done"))), ["ghost -> done", "'ghost'"]),
    (
        "unreachable_status",
        dict(statuses=("open", "working", "done", "limbo"), edges=(*widget().edges, *edges("limbo", "done"))),
        ["limbo", "cannot be reached", "add an edge into it", "declare it initial"],
    ),
    (
        "trap_status",
        dict(statuses=("open", "working", "done", "stuck"), edges=(*widget().edges, *edges("working", "stuck"))),
        ["status 'stuck' is not terminal but has no edge out of it", "edges('stuck', <target>)", "declare it terminal"],
    ),
    (
        "trap_status_with_only_a_self_edge",
        dict(statuses=("open", "working", "done", "stuck"),
             edges=(*widget().edges, *edges("working", "stuck"), *edges("stuck", "stuck"))),
        ["status 'stuck' is not terminal but has no edge out of it"],
    ),
    (
        "trap_initial_status",
        dict(statuses=("open", "working", "done", "draft"), initial={"open", "draft"}),
        ["status 'draft' is not terminal"],
    ),
    (
        "terminal_ungated_exit",
        dict(edges=(*widget().edges, *edges("done", "open"))),
        ["terminal status 'done'", "ungated exit to 'open'", "actors="],
    ),
    (
        "required_patch_outside_patch_fields",
        dict(edges=(*edges("open", "working", patch="weight"), *edges("working", "done", "open"))),
        ["open -> working", "weight", "patch_fields"],
    ),
    (
        "required_guard_outside_patch_fields",
        dict(edges=(*edges("open", "working", guard="attempt"), *edges("working", "done", "open"))),
        ["open -> working", "attempt", "patch_fields"],
    ),
    ("malformed_reason_code", dict(reasons={"widget.open.created", "Widget.Open"}), ["'Widget.Open'", "malformed"]),
    ("reason_code_too_long", dict(reasons={"widget.open.created.again"}), ["'widget.open.created.again'"]),
    (
        "foreign_reason_code",
        dict(reasons={"widget.open.created", "gadget.new.created"}),
        ["'gadget.new.created'", "widget"],
    ),
    ("malformed_reason_prefix", dict(reason_prefixes={"Widget"}), ["Widget"]),
    ("no_reason_prefix", dict(reason_prefixes=set(), reasons=set()), ["reason prefix"]),
    ("entity_type_not_identifier", dict(entity_type="wid-get"), ["'wid-get'", "identifier"]),
    ("entity_type_empty", dict(entity_type=""), ["''", "identifier"]),
    ("no_statuses", dict(statuses=(), initial=set(), terminal=set(), edges=()), ["at least one status"]),
    ("duplicate_status", dict(statuses=("open", "working", "done", "open")), ["listed twice", "open"]),
    ("no_initial_status", dict(initial=set()), ["initial status"]),
    ("bad_same_status", dict(same_status="sometimes"), ["same_status", "'sometimes'"]),
    ("not_a_managed_table", dict(table=PLAIN), ["'plain_widgets'", "managed_table()"]),
    ("patch_field_not_a_column", dict(patch_fields={"size", "weight"}), ["weight", "'widgets'"]),
    ("patch_field_is_lifecycle_column", dict(patch_fields={"size", "status"}), ["status", "not data columns"]),
    ("patch_field_is_id", dict(patch_fields={"id"}), ["id", "not data columns"]),
    (
        "status_outside_deprecated_table_statuses",
        dict(table=CHECKED, patch_fields=set()),
        ["'checked_widgets'", "working", "drop statuses="],
    ),
]


@pytest.mark.parametrize("change, fragments", [pytest.param(c, f, id=i) for i, c, f in REFUSALS])
def test_validate_refuses_with_a_precise_message(change, fragments):
    """L1: every unsafe declaration is refused by validate() and by Registry.register, naming the culprit."""
    lc = widget(**change)
    with pytest.raises(PolicyError) as excinfo:
        validate(lc)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"
    registry = Registry()
    with pytest.raises(PolicyError, match="."):
        registry.register(lc)
    assert len(registry) == 0, "a refused declaration must not be half-registered"


def test_duplicate_entity_type_is_refused():
    """L1: two lifecycles cannot share an entity type."""
    registry = Registry([widget()])
    with pytest.raises(PolicyError, match=r"entity type 'widget' is already registered"):
        registry.register(widget(table=GADGETS, patch_fields=set(), reason_prefixes={"widget2"}, reasons=set()))
    assert registry.get("widget").table is WIDGETS


def test_duplicate_table_is_refused():
    """L1: two lifecycles cannot manage the same table."""
    registry = Registry([widget()])
    with pytest.raises(PolicyError) as excinfo:
        registry.register(gadget(table=WIDGETS))
    assert "table 'widgets' is already managed by 'widget'" in str(excinfo.value)
    assert "gadget" not in registry


def test_colliding_reason_prefixes_are_refused():
    """L1: a reason prefix belongs to one lifecycle, so a code always names its entity type."""
    registry = Registry([widget()])
    with pytest.raises(PolicyError) as excinfo:
        registry.register(gadget(reason_prefixes={"gadget", "widget"}))
    message = str(excinfo.value)
    assert "widget" in message and "already used by 'widget'" in message
    assert "gadget" not in registry


def test_extend_cannot_rename_the_entity_type():
    """L1: Registry.extend keeps the entity type; a rename is a new registration.

    (The signature already makes ``entity_type=`` a duplicate argument, so Python refuses it before
    the registry's own PolicyError check can run.)
    """
    original = widget()
    registry = Registry([original])
    with pytest.raises((TypeError, PolicyError)):
        registry.extend("widget", **{"entity_type": "sprocket"})  # type: ignore[misc]
    assert "sprocket" not in registry
    assert registry.get("widget") is original


def test_extend_that_breaks_a_rule_is_refused_and_keeps_the_original():
    """L1: an extension is validated like a registration; a refused one leaves the old policy in place."""
    original = widget()
    registry = Registry([original])
    with pytest.raises(PolicyError, match="terminal status 'done' has an ungated exit"):
        registry.extend("widget", edges=edges("done", "open"))
    assert registry.get("widget") is original


def test_extend_refuses_a_prefix_used_by_another_lifecycle():
    """L1: extending cannot steal another lifecycle's reason prefix."""
    registry = Registry([widget(), gadget()])
    with pytest.raises(PolicyError, match="already used by 'gadget'"):
        registry.extend("widget", reason_prefixes={"gadget"})
    assert registry.get("widget").reason_prefixes == frozenset({"widget"})


def test_unknown_entity_type_lists_the_known_ones():
    """L1: asking for an unregistered type says which types exist."""
    registry = Registry([widget(), gadget()])
    with pytest.raises(UnknownEntityType) as excinfo:
        registry.get("sprocket")
    assert "'sprocket'" in str(excinfo.value) and "gadget, widget" in str(excinfo.value)
    assert isinstance(excinfo.value, LookupError)


@pytest.mark.parametrize(
    "code",
    ["dispatch.pending", "Dispatch.pending.enqueued", "dispatch..enqueued", "dispatch.pending.en-queued",
     "1dispatch.pending.enqueued", "dispatch.pending.enqueued.twice", "", "dispatch pending enqueued"],
)
def test_malformed_reason_codes_are_named(code):
    """L1: a reason code is three lowercase segments; the error repeats the code and the expected shape."""
    with pytest.raises(PolicyError) as excinfo:
        check_reason_code(code)
    assert repr(code) in str(excinfo.value)
    assert "<domain>.<status-or-outcome>.<cause>" in str(excinfo.value)


def test_well_formed_reason_code_splits_into_three_parts():
    """L1: the accepted shape is <domain>.<status-or-outcome>.<cause>."""
    assert check_reason_code("schedule_run.failed.nonzero_exit") == ("schedule_run", "failed", "nonzero_exit")


def test_gated_exit_from_a_terminal_status_is_accepted():
    """L1 / L10: a terminal status may be left, but only along an edge restricted to an actor type."""
    lc = widget(edges=(*widget().edges, Edge("done", "open", actors=frozenset({"operator"}))))
    validate(lc)
    assert lc.edge("done", "open").gated


JSONY = managed_table(
    "json_widgets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("size", sa.Integer),
    sa.Column("tags", sa.JSON),
    meta=META,
)


def test_a_required_guard_on_a_json_column_is_refused():
    """L1: guards compare for equality in SQL, which JSON columns do not support portably."""
    with pytest.raises(PolicyError, match="JSON column"):
        validate(widget(table=JSONY, patch_fields={"size", "tags"},
                        edges=(*edges("open", "working", guard="tags"), *edges("working", "done"))))


def test_a_guard_on_a_json_column_is_rejected_before_any_write():
    """L3: a command guarding a JSON column is refused with the guard rule (nothing reaches the database)."""
    from statebook.lifecycle import TransitionRejected

    lc = widget(table=JSONY, patch_fields={"size", "tags"})
    with pytest.raises(TransitionRejected, match="hold JSON") as err:
        lc.check_command(["open"], "working", actor_type="system", guard={"tags": []},
                         reason_code="widget.working.started")
    assert err.value.rule == "guard"
    lc.check_command(["open"], "working", actor_type="system", guard={"size": 1}, reason_code="widget.working.started")


def test_a_trap_may_be_declared_terminal_instead():
    """L1: the fix the trap message suggests is accepted: the same status, declared terminal (and refused as
    a trap while it is not)."""
    trap = dict(statuses=("open", "working", "done", "stuck"), edges=(*widget().edges, *edges("working", "stuck")))
    with pytest.raises(PolicyError, match="stuck"):
        validate(widget(**trap, terminal={"done"}))
    fixed = widget(**trap, terminal={"done", "stuck"})
    validate(fixed)
    assert "stuck" in fixed.terminal


def test_the_builtin_lifecycles_have_no_trap_and_no_unreachable_status():
    """L1: dispatch, schedule and schedule_run pass the rules every application lifecycle must pass."""
    from statebook.lifecycle.validation import check_no_trap
    from statebook.adapters.registry import builtin_registry

    for lc in builtin_registry():
        validate(lc)
        check_no_trap(lc)


@pytest.mark.parametrize("column", [
    sa.Column("stamp", sa.Float, server_default=sa.func.now()),
    sa.Column("stamp", sa.Float, default=lambda: 1.0),
    sa.Column("stamp", sa.Text, server_default=sa.text("upper('x')")),
], ids=["sql-function", "python-callable", "sql-expression"])
def test_a_default_computed_at_insert_time_is_refused(column):
    """L1 / L7: a data column whose default the database (or a callable) computes at insert time would hold
    what no fact records, so the row could not be the fold of its facts: registration refuses it, naming the
    column and what to declare instead. A literal default is fine."""
    meta = sa.MetaData()
    table = managed_table("stamped", sa.Column("id", sa.String(32), primary_key=True), column, meta=meta)
    with pytest.raises(PolicyError, match=r"stamp .*computed at insert time.*literal default"):
        validate(widget(table=table, patch_fields=set(), edges=(*edges("open", "working"), *edges("working", "done", "open"))))
    literal = managed_table("stamped_ok", sa.Column("id", sa.String(32), primary_key=True),
                            sa.Column("stamp", sa.Float, server_default="0"), meta=meta)
    validate(widget(table=literal, patch_fields=set()))
