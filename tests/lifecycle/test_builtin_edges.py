"""L3 / L10: the full edge matrix of the built-in ``dispatch`` and ``schedule_run`` policies.

The expected graphs are written out by hand from the specification (the issue's words), not derived
from the policy objects: they are the oracle the declarations are checked against. Every ordered
pair of statuses is tried through ``Lifecycle.check_command`` — the check the engine runs before any
write — so a missing, extra or wrongly gated edge fails here.
"""

from __future__ import annotations

import itertools

import pytest

from statebook.lifecycle import Lifecycle, TransitionRejected
from statebook.outbox import DISPATCH
from statebook.scheduler import SCHEDULE_RUN

DISPATCH_STATUSES = {"pending", "delivering", "delivered", "acked", "dead_letter", "expired"}
DISPATCH_INITIAL = {"pending"}
DISPATCH_TERMINAL = {"delivered", "acked", "dead_letter", "expired"}
DISPATCH_EDGES = {
    ("pending", "delivering"), ("pending", "expired"), ("pending", "acked"),
    ("delivering", "delivering"), ("delivering", "pending"), ("delivering", "delivered"),
    ("delivering", "acked"), ("delivering", "dead_letter"), ("delivering", "expired"),
    ("dead_letter", "pending"), ("expired", "pending"), ("pending", "pending"),
}
DISPATCH_OPERATOR_ONLY = {("dead_letter", "pending"), ("expired", "pending")}
OPERATOR_PATCH = {"attempt", "next_attempt_at", "last_error"}
DISPATCH_EXPEDITE = ("pending", "pending")
"""An operator's expedite (specs/outbox.md O23): the due time alone, compared and set."""

RUN_STATUSES = {
    "queued", "waiting_dependency", "running", "retry_wait", "completed", "failed", "timed_out", "skipped",
    "cancelled",
}
RUN_INITIAL = {"queued", "running", "failed", "skipped"}
RUN_TERMINAL = {"completed", "failed", "timed_out", "skipped", "cancelled"}
RUN_EDGES = {
    ("queued", "waiting_dependency"), ("queued", "running"), ("queued", "skipped"), ("queued", "cancelled"),
    ("waiting_dependency", "queued"), ("waiting_dependency", "cancelled"),
    ("running", "completed"), ("running", "failed"), ("running", "timed_out"), ("running", "retry_wait"),
    ("running", "queued"), ("running", "cancelled"),
    ("retry_wait", "queued"), ("retry_wait", "cancelled"),
}


def _requirements(source: str, target: str) -> tuple[dict[str, int], dict[str, int]]:
    """Patch and guards the spec requires for a dispatch edge (empty for anything else)."""
    if (source, target) == DISPATCH_EXPEDITE:
        return {"next_attempt_at": 0}, {"next_attempt_at": 0}
    patch = {f: 0 for f in OPERATOR_PATCH} if (source, target) in DISPATCH_OPERATOR_ONLY else {}
    guards = {"attempt": 1} if (source, target) == ("delivering", "delivering") else {}
    return patch, guards


def _any_reason(lc: Lifecycle) -> str:
    return sorted(lc.reasons)[0]


# -- dispatch -----------------------------------------------------------------------------------


def test_dispatch_status_sets():
    """L3 / L10: dispatch declares exactly the specified statuses, initial and terminal sets."""
    assert set(DISPATCH.statuses) == DISPATCH_STATUSES
    assert DISPATCH.initial == DISPATCH_INITIAL
    assert DISPATCH.terminal == DISPATCH_TERMINAL


@pytest.mark.parametrize("source, target", sorted(itertools.product(sorted(DISPATCH_STATUSES), repeat=2)))
def test_dispatch_edge_matrix(source, target):
    """L3: source -> target is accepted (by the actor and with the fields it needs) iff the spec lists it."""
    patch, guards = _requirements(source, target)
    actor = "operator" if (source, target) in DISPATCH_OPERATOR_ONLY | {DISPATCH_EXPEDITE} else "system"
    check = lambda: DISPATCH.check_command(  # noqa: E731
        [source], target, actor_type=actor, patch=patch, guard=guards, reason_code=_any_reason(DISPATCH)
    )
    if (source, target) in DISPATCH_EDGES:
        check()
    else:
        with pytest.raises(TransitionRejected) as excinfo:
            check()
        assert excinfo.value.rule == "edge"
        assert f"{source} -> {target}" in str(excinfo.value)


def test_dispatch_declares_no_edge_outside_the_spec():
    """L3: the declared edge set equals the specified one (no extra edge hides behind same_status)."""
    assert {(e.source, e.target) for e in DISPATCH.edges} == DISPATCH_EDGES
    assert DISPATCH.same_status == "edge"


@pytest.mark.parametrize("source", sorted(s for s, _ in DISPATCH_OPERATOR_ONLY))
@pytest.mark.parametrize("actor", ["system", "delivery", "consumer", "scheduler"])
def test_dispatch_reopen_is_operator_only(source, actor):
    """L10: dead_letter -> pending and expired -> pending are refused for every non-operator actor."""
    patch, _ = _requirements(source, "pending")
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command([source], "pending", actor_type=actor, patch=patch,
                               reason_code="dispatch.pending.operator_retry")
    assert excinfo.value.rule == "actor"
    assert "operator" in str(excinfo.value) and repr(actor) in str(excinfo.value)


@pytest.mark.parametrize("source", sorted(s for s, _ in DISPATCH_OPERATOR_ONLY))
@pytest.mark.parametrize("missing", sorted(OPERATOR_PATCH))
def test_dispatch_reopen_requires_the_full_patch(source, missing):
    """L3 / L10: an operator reopening a dispatch must set attempt, next_attempt_at and last_error."""
    patch = {f: 0 for f in OPERATOR_PATCH if f != missing}
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command([source], "pending", actor_type="operator", patch=patch,
                               reason_code="dispatch.pending.operator_retry")
    assert excinfo.value.rule == "patch"
    assert missing in str(excinfo.value)


def test_dispatch_terminal_exits_are_all_operator_gated():
    """L10: every edge leaving a terminal dispatch status is gated to the operator."""
    exits = [e for e in DISPATCH.edges if e.source in DISPATCH_TERMINAL]
    assert {(e.source, e.target) for e in exits} == DISPATCH_OPERATOR_ONLY
    assert all(e.actors == {"operator"} and e.requires_patch == OPERATOR_PATCH for e in exits)


def test_dispatch_redelivery_needs_an_attempt_guard():
    """L3 / L4: delivering -> delivering (a reclaim) must compare-and-set on attempt."""
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["delivering"], "delivering", actor_type="system", patch={"attempt": 2},
                               reason_code="dispatch.delivering.reclaimed")
    assert excinfo.value.rule == "guard"
    assert "attempt" in str(excinfo.value)
    DISPATCH.check_command(["delivering"], "delivering", actor_type="system", patch={"attempt": 2},
                           guard={"attempt": 1}, reason_code="dispatch.delivering.reclaimed")


@pytest.mark.parametrize("actor", ["system", "delivery", "consumer", "scheduler"])
def test_dispatch_expedite_is_the_operators_and_moves_the_due_time_alone(actor):
    """L3 / O23: pending -> pending is an operator's, patches next_attempt_at and nothing it does not name,
    and must compare-and-set on the due time."""
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["pending"], "pending", actor_type=actor, patch={"next_attempt_at": 1},
                               guard={"next_attempt_at": 0}, reason_code="dispatch.pending.operator_expedited")
    assert excinfo.value.rule == "actor"
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["pending"], "pending", actor_type="operator", patch={"next_attempt_at": 1},
                               reason_code="dispatch.pending.operator_expedited")
    assert excinfo.value.rule == "guard"
    (edge,) = [e for e in DISPATCH.edges if (e.source, e.target) == DISPATCH_EXPEDITE]
    assert (edge.actors, edge.requires_patch, edge.requires_guard) == ({"operator"}, {"next_attempt_at"},
                                                                       {"next_attempt_at"})


def test_dispatch_ungated_edges_accept_any_actor():
    """L3: only the two reopen edges and the expedite are gated; the delivery pipeline's edges take any actor
    type."""
    for source, target in DISPATCH_EDGES - DISPATCH_OPERATOR_ONLY - {DISPATCH_EXPEDITE}:
        patch, guards = _requirements(source, target)
        for actor in ("system", "operator", "consumer"):
            DISPATCH.check_command([source], target, actor_type=actor, patch=patch, guard=guards,
                                   reason_code="dispatch.pending.enqueued")


def test_dispatch_rejects_undeclared_patch_columns():
    """L3: a patch may only touch declared patch fields — never a lifecycle column or another data column."""
    for column in ("status", "version", "payload", "deliver_to"):
        with pytest.raises(TransitionRejected) as excinfo:
            DISPATCH.check_command(["pending"], "delivering", actor_type="system", patch={column: 1},
                                   reason_code="dispatch.delivering.attempt")
        assert excinfo.value.rule == "patch" and column in str(excinfo.value)


def test_dispatch_rejects_undeclared_reason_codes():
    """L3: a transition cites a reason code its lifecycle declares; the error lists nearby codes."""
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["delivering"], "pending", actor_type="system",
                               reason_code="dispatch.pending.because")
    assert excinfo.value.rule == "reason"
    assert "'dispatch.pending.because'" in str(excinfo.value)
    assert "dispatch.pending.transport_failed" in str(excinfo.value)
    with pytest.raises(TransitionRejected):
        DISPATCH.check_command(["pending"], "expired", actor_type="system", reason_code="schedule_run.failed.x")


def test_dispatch_rejects_unknown_statuses():
    """L3: a command naming a status the lifecycle does not have is refused before anything else."""
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["pending"], "sent", actor_type="system", reason_code="dispatch.pending.enqueued")
    assert excinfo.value.rule == "status" and "'sent'" in str(excinfo.value)
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["queued"], "pending", actor_type="system", reason_code="dispatch.pending.enqueued")
    assert excinfo.value.rule == "status" and "'queued'" in str(excinfo.value)


def test_every_expected_status_must_have_the_edge():
    """L3: with several expected statuses, each one must be allowed to move to the target."""
    DISPATCH.check_command(["pending", "delivering"], "expired", actor_type="system",
                           reason_code="dispatch.expired.deadline")
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command(["pending", "delivered"], "expired", actor_type="system",
                               reason_code="dispatch.expired.deadline")
    assert excinfo.value.rule == "edge" and "delivered -> expired" in str(excinfo.value)
    with pytest.raises(TransitionRejected) as excinfo:
        DISPATCH.check_command([], "expired", actor_type="system", reason_code="dispatch.expired.deadline")
    assert excinfo.value.rule == "status"


# -- schedule_run -------------------------------------------------------------------------------


def test_schedule_run_status_sets():
    """L3 / L10: schedule_run declares exactly the specified statuses, initial and terminal sets."""
    assert set(SCHEDULE_RUN.statuses) == RUN_STATUSES
    assert SCHEDULE_RUN.initial == RUN_INITIAL
    assert SCHEDULE_RUN.terminal == RUN_TERMINAL


@pytest.mark.parametrize("source, target", sorted(itertools.product(sorted(RUN_STATUSES), repeat=2)))
def test_schedule_run_edge_matrix(source, target):
    """L3: source -> target is accepted iff the spec lists it; no schedule_run edge needs patch or guard."""
    check = lambda: SCHEDULE_RUN.check_command(  # noqa: E731
        [source], target, actor_type="system", reason_code=_any_reason(SCHEDULE_RUN)
    )
    if (source, target) in RUN_EDGES:
        check()
    else:
        with pytest.raises(TransitionRejected) as excinfo:
            check()
        assert excinfo.value.rule == "edge"
        assert f"{source} -> {target}" in str(excinfo.value)


def test_schedule_run_declares_no_edge_outside_the_spec():
    """L3 / L10: the declared edges equal the specified ones, and no terminal status has an exit."""
    assert {(e.source, e.target) for e in SCHEDULE_RUN.edges} == RUN_EDGES
    assert SCHEDULE_RUN.same_status == "edge"
    assert not [e for e in SCHEDULE_RUN.edges if e.source in RUN_TERMINAL]


@pytest.mark.parametrize("status", sorted(RUN_TERMINAL))
def test_schedule_run_terminal_refuses_even_an_operator(status):
    """L10: a finished run stays finished — no actor type, not even an operator, may move it."""
    for target in sorted(RUN_STATUSES):
        with pytest.raises(TransitionRejected) as excinfo:
            SCHEDULE_RUN.check_command([status], target, actor_type="operator",
                                       reason_code="schedule_run.queued.requeued")
        assert excinfo.value.rule == "edge"
        assert "none (terminal)" in str(excinfo.value)
