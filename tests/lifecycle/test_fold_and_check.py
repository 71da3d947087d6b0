"""L6 / L7 / L8 / L12 without a database: fold a synthetic history and audit it with ``check_entity``.

The conformance suite runs the same checks against real rows; these pin the rules themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa

from statebook.lifecycle import Fact, Lifecycle, edges, managed_table
from statebook.lifecycle.errors import PolicyError
from statebook.lifecycle.replay import fold
from statebook.lifecycle.facts import GENESIS, fact_hash, insert_values, legacy_fact_hash
from statebook.lifecycle.replay import check_entity
from statebook.lifecycle.schema import UNKNOWN, column_default, row_defaults

META = sa.MetaData()
JOBS = managed_table("fold_jobs", sa.Column("id", sa.String(32), primary_key=True), sa.Column("title", sa.Text),
                     sa.Column("attempt", sa.Integer), meta=META)
JOB = Lifecycle(
    entity_type="job",
    table=JOBS,
    statuses=("new", "busy", "done"),
    initial={"new"},
    terminal={"done"},
    edges=(*edges("new", "busy"), *edges("busy", "new", "done")),
    patch_fields={"attempt"},
    reason_prefixes={"job"},
    reasons={"job.new.created", "job.busy.started", "job.done.ok", "job.new.retry", "job.purged.old"},
)


def chain(*steps: tuple[str | None, dict[str, Any]], lc: Lifecycle = JOB, actor: str = "system") -> list[Fact]:
    """Facts for one entity 'j1': each step is (status, patch); status None is a tombstone."""
    facts: list[Fact] = []
    prev_id, prev_hash, prev_status = GENESIS, GENESIS, None
    for n, (status, patch) in enumerate(steps, start=1):
        content = {
            "id": f"f{n}", "entity_type": lc.entity_type, "entity_id": "j1", "prev_fact_id": prev_id,
            "previous_status": prev_status, "status": status, "version": n, "reason_code": "job.new.created",
            "reason_summary": f"step {n}", "evidence_refs": [], "actor_type": actor, "actor_id": "",
            "at": 1000.0 + n, "patch": patch, "metadata": {}, "idempotency_key": None, "command_digest": None,
            "policy_fingerprint": lc.fingerprint,
        }
        facts.append(Fact(**insert_values(content, prev_hash), seq=n))
        prev_id, prev_hash, prev_status = facts[-1].id, facts[-1].hash, status
    return facts


HAPPY = (("new", {"id": "j1", "title": "t", "attempt": 0}), ("busy", {"attempt": 1}), ("new", {}),
         ("busy", {"attempt": 2}), ("done", {}))


def kinds(found: list) -> list[str]:
    return sorted(f.kind for f in found)


def test_fold_projects_every_lifecycle_column_and_patch():
    """L7: the fold carries the last status, version, reason, fact id, chain hash and every patched value."""
    facts = chain(*HAPPY)
    state = fold(facts)
    assert state == {
        "id": "j1", "title": "t", "attempt": 2, "status": "done", "version": 5, "updated_at": 1005.0,
        "status_reason_code": "job.new.created", "status_reason_summary": "step 5", "last_fact_id": "f5",
        "chain_hash": facts[-1].hash,
    }


def test_fold_of_a_prefix_is_the_state_at_that_step():
    """L7: folding the first n facts gives the state after step n (what as_of relies on)."""
    facts = chain(*HAPPY)
    assert fold(facts[:2])["status"] == "busy" and fold(facts[:2])["attempt"] == 1
    assert fold(facts[:3])["status"] == "new" and fold(facts[:3])["attempt"] == 1
    assert fold([]) is None


def test_tombstone_folds_to_nothing():
    """L11: a history ending in a tombstone describes no row."""
    facts = chain(*HAPPY, (None, {}))
    assert facts[-1].is_tombstone and facts[0].is_creation
    assert fold(facts) is None


def test_clean_history_matching_its_row_has_no_findings():
    """L7 / L8: an intact chain whose fold equals the row is clean."""
    facts = chain(*HAPPY)
    assert check_entity(JOB, "j1", facts, dict(fold(facts) or {})) == []


def test_version_counts_the_facts():
    """L6: fact n carries version n; the folded version equals the number of facts."""
    facts = chain(*HAPPY)
    assert [f.version for f in facts] == list(range(1, len(facts) + 1))
    assert fold(facts)["version"] == len(facts)


def test_hash_covers_content_and_previous_hash():
    """L8: a fact's hash changes with any hashed field and with the hash it links to."""
    fact = chain(*HAPPY)[1]
    assert fact_hash(fact.content(), fact.prev_hash) == fact.hash
    assert fact_hash({**fact.content(), "reason_summary": "edited"}, fact.prev_hash) != fact.hash
    assert fact_hash(fact.content(), "0" * 64) != fact.hash


def test_edited_fact_is_a_hash_mismatch():
    """L12: changing a stored fact without recomputing its hash is detected."""
    facts = chain(*HAPPY)
    facts[2] = dataclasses.replace(facts[2], reason_summary="nothing to see")
    found = check_entity(JOB, "j1", facts, None)
    assert ("hash_mismatch", "f3") in [(f.kind, f.fact_id) for f in found]


def test_removed_fact_breaks_the_chain_and_the_version_sequence():
    """L8 / L12: deleting a middle fact leaves a link to a missing fact and a version gap."""
    facts = chain(*HAPPY)
    del facts[2]
    found = check_entity(JOB, "j1", facts, None)
    assert {"broken_chain", "version_gap"} <= set(kinds(found))
    assert all(f.fact_id == "f4" for f in found if f.kind in ("broken_chain", "version_gap"))


@pytest.mark.parametrize("seqs, flagged", [
    ((1, 3, 2, 4, 5), ["f3"]),            # two consecutive facts swapped
    ((10, 20, 30, 40, 5), ["f5"]),        # the head moved before the whole history
    ((10, 2, 3, 4, 50), ["f2", "f3", "f4"]),  # the creation moved after its successors: each is behind it
    ((1, 2, 2, 4, 5), ["f3"]),            # two facts at one seq: no order between them
    ((2, 5, 9, 100, 101), []),            # gaps are honest: other entities' facts sit between
])
def test_facts_out_of_seq_order_are_a_finding(seqs: tuple[int, ...], flagged: list[str]):
    """L12d: within an entity seq must rise with version; a fact whose seq is not above every earlier
    fact's is ``seq_out_of_order`` (a reader in seq order would see the history backwards), and nothing
    else is reported: the chain, hashes and fold are intact."""
    facts = [dataclasses.replace(f, seq=s) for f, s in zip(chain(*HAPPY), seqs)]
    found = check_entity(JOB, "j1", facts, dict(fold(facts) or {}))
    assert [(f.kind, f.fact_id) for f in found] == [("seq_out_of_order", i) for i in flagged]
    assert all("seq" in f.detail and "version" in f.detail for f in found)
    unknown = [dataclasses.replace(f, seq=None) for f in facts]  # facts built without a seq: nothing to check
    assert check_entity(JOB, "j1", unknown, dict(fold(facts) or {})) == []


def test_row_differing_from_the_fold_is_a_row_mismatch():
    """L7 / L12: a row whose column disagrees with the facts is named column by column."""
    facts = chain(*HAPPY)
    row = {**fold(facts), "status": "new", "attempt": 9}
    found = check_entity(JOB, "j1", facts, row)
    assert kinds(found) == ["row_mismatch", "row_mismatch"]
    assert any("'status'" in f.detail for f in found) and any("'attempt'" in f.detail for f in found)


def test_missing_row_without_tombstone_and_row_after_tombstone():
    """L11 / L12: facts without a row need a tombstone; a tombstoned entity must not have a row."""
    facts = chain(*HAPPY)
    assert kinds(check_entity(JOB, "j1", facts, None)) == ["missing_row"]
    purged = chain(*HAPPY, (None, {}))
    assert check_entity(JOB, "j1", purged, None) == []
    assert kinds(check_entity(JOB, "j1", purged, {"id": "j1", "status": "done"})) == ["purged_row_present"]


def test_row_without_facts():
    """L12: a row the engine did not create has no history."""
    assert kinds(check_entity(JOB, "j1", [], {"id": "j1", "status": "new"})) == ["row_without_facts"]


def test_undeclared_edge_under_the_current_policy_is_forbidden():
    """L12: a well-hashed fact taking an edge the current policy never allowed is a forbidden edge."""
    facts = chain(("new", {"id": "j1"}), ("done", {}))
    found = check_entity(JOB, "j1", facts, fold(facts))
    assert [(f.kind, f.fact_id) for f in found] == [("forbidden_edge", "f2")]


def test_edge_from_an_older_policy_names_both_fingerprints():
    """L12: an edge allowed when written (older fingerprint) but not now is reported as such, not as forgery."""
    older = JOB.extend(edges=edges("new", "done"))
    facts = chain(("new", {"id": "j1"}), ("done", {}), lc=older)
    found = check_entity(JOB, "j1", facts, fold(facts))
    assert [(f.kind, f.fact_id) for f in found] == [("edge_not_in_current_policy", "f2")]
    assert older.fingerprint in found[0].detail and JOB.fingerprint in found[0].detail


def test_creation_in_a_status_no_longer_initial_is_attributed_to_the_older_policy():
    """L12: a creation written under an older policy whose initial set was wider is an old-policy finding."""
    older = JOB.extend(initial=["busy"])
    facts = chain(("busy", {"id": "j1"}), lc=older)
    found = check_entity(JOB, "j1", facts, fold(facts))
    assert [(f.kind, f.fact_id) for f in found] == [("edge_not_in_current_policy", "f1")]
    assert older.fingerprint in found[0].detail and JOB.fingerprint in found[0].detail


def test_gated_edge_taken_by_the_wrong_actor_is_forbidden():
    """L10 / L12: a terminal exit recorded for a non-operator actor is flagged."""
    gated = JOB.extend(edges=edges("done", "new", actors="operator"))
    steps = (("new", {"id": "j1"}), ("busy", {}), ("done", {}), ("new", {}))
    found = check_entity(gated, "j1", chain(*steps, lc=gated, actor="system"), None)
    assert ("forbidden_edge", "f4") in [(f.kind, f.fact_id) for f in found]
    ok = chain(*steps, lc=gated, actor="operator")
    assert check_entity(gated, "j1", ok, fold(ok)) == []


def rehash_legacy(facts: list[Fact]) -> list[Fact]:
    """The same history hashed the way statebook did before the stored-text hash."""
    out: list[Fact] = []
    prev_hash = GENESIS
    for f in facts:
        content = f.content()
        out.append(dataclasses.replace(f, prev_hash=prev_hash, hash=legacy_fact_hash(content, prev_hash)))
        prev_hash = out[-1].hash
    return out


def test_histories_hashed_the_earlier_way_still_verify_and_tampering_still_shows():
    """L8 / L12: facts written before the stored-text hash (legacy_fact_hash) verify; an edit to one of
    them is still a hash_mismatch, and the two hashes differ, so neither passes for the other."""
    facts = rehash_legacy(chain(*HAPPY))
    assert facts[0].hash != chain(*HAPPY)[0].hash
    assert check_entity(JOB, "j1", facts, dict(fold(facts) or {})) == []
    edited = list(facts)
    edited[1] = dataclasses.replace(edited[1], patch={"attempt": 7})
    assert "hash_mismatch" in kinds(check_entity(JOB, "j1", edited, dict(fold(edited) or {})))


# -- policy history (L12c) --------------------------------------------------------------------

V1 = JOB.extend(edges=edges("new", "done"))
"""An earlier policy: jobs could be closed straight from new."""
V2_ACCEPTING = dataclasses.replace(JOB, accepts=(V1,))
"""Today's policy (new -> done removed), declaring that facts written under V1 still verify."""
V2_STRICT = dataclasses.replace(V2_ACCEPTING, accepts=())
"""The same policy, declaring that it accepts no earlier one."""


def test_facts_under_an_accepted_earlier_policy_verify():
    """L12c: a lifecycle that removed an edge but accepts the earlier declaration verifies the old history
    that took it; the fingerprint is today's, unchanged by what it accepts."""
    assert V2_ACCEPTING.fingerprint == JOB.fingerprint == V2_STRICT.fingerprint != V1.fingerprint
    old = chain(("new", {"id": "j1"}), ("done", {}), lc=V1)
    assert check_entity(V2_ACCEPTING, "j1", old, fold(old)) == []
    assert V2_ACCEPTING.policy_for(V1.fingerprint) is V1 and V2_ACCEPTING.policy_for("0" * 16) is None


def test_without_accepting_it_the_old_history_is_a_finding():
    """L12c: declaring history without the earlier policy makes each of its facts an unknown_policy finding
    naming both fingerprints; leaving the history undeclared (accepts=None) keeps judging old facts by
    today's policy (edge_not_in_current_policy)."""
    old = chain(("new", {"id": "j1"}), ("done", {}), lc=V1)
    found = check_entity(V2_STRICT, "j1", old, fold(old))
    assert [(f.kind, f.fact_id) for f in found] == [("unknown_policy", "f1"), ("unknown_policy", "f2")]
    assert V1.fingerprint in found[0].detail and V2_STRICT.fingerprint in found[0].detail
    assert [f.kind for f in check_entity(JOB, "j1", old, fold(old))] == ["edge_not_in_current_policy"]


def test_a_move_no_accepted_policy_allowed_is_forbidden():
    """L12c: a fact forged under the accepted policy's fingerprint, on an edge that policy never had, is a
    forbidden_edge naming that policy — accepting history does not accept everything."""
    forged = chain(("new", {"id": "j1"}), ("busy", {}), ("done", {}), ("new", {}), lc=V1)
    found = check_entity(V2_ACCEPTING, "j1", forged, fold(forged))
    assert [(f.kind, f.fact_id) for f in found] == [("forbidden_edge", "f4")]
    assert V1.fingerprint in found[0].detail


def test_an_extension_accepts_what_it_extends_and_accepts_are_checked():
    """L12c: extend() keeps a declared history and adds the base to it (an extension only adds moves) and
    the same extension of each declaration the base accepts (what an application's extension of the earlier
    policy wrote); a copy under another entity type starts without one; a declaration of another entity type
    cannot be accepted."""
    more = edges("done", "busy", actors="operator")
    extended = V2_ACCEPTING.extend(edges=more)
    assert {lc.fingerprint for lc in extended.accepted} == {
        V2_ACCEPTING.fingerprint, V1.fingerprint, V1.extend(edges=more).fingerprint}
    assert JOB.extend(statuses=()).accepts is None
    assert V2_ACCEPTING.extend(entity_type="chore").accepts is None, "a copy under another type has no history"
    other = dataclasses.replace(JOB, entity_type="task")
    with pytest.raises(PolicyError, match="earlier declarations of 'job'"):
        dataclasses.replace(JOB, accepts=(other,))


def test_malformed_facts_are_findings_not_errors():
    """L12b: a patch that is not an object, a version that is text, metadata that is a list: each is a
    malformed_fact finding naming the field, and the rest of the check still runs."""
    facts = chain(*HAPPY)
    facts[1] = dataclasses.replace(facts[1], patch=[1, 2])
    facts[2] = dataclasses.replace(facts[2], version="3", metadata=[])
    found = check_entity(JOB, "j1", facts, dict(fold(chain(*HAPPY)) or {}))
    malformed = [f for f in found if f.kind == "malformed_fact"]
    assert [f.fact_id for f in malformed] == ["f2", "f3"]
    assert "patch is [1, 2]" in malformed[0].detail and "version is '3'" in malformed[1].detail
    assert "metadata" in malformed[1].detail
    assert {"hash_mismatch", "version_gap"} <= set(kinds(found))


def test_fold_fills_columns_no_fact_sets_from_the_declared_defaults():
    """L7: with the table's defaults, the fold is the whole row — a column no fact set holds its default."""
    facts = chain(("new", {"id": "j1"}))
    assert "title" not in fold(facts)
    state = fold(facts, row_defaults(JOBS))
    assert (state["title"], state["attempt"]) == (None, None)
    assert check_entity(JOB, "j1", facts, {**state, "attempt": 3})[0].detail.startswith("column 'attempt'")


@pytest.mark.parametrize(("column", "expected"), [
    (sa.Column("a", sa.Integer), None),
    (sa.Column("a", sa.Integer, server_default="0"), 0),
    (sa.Column("a", sa.Float, server_default="1.5"), 1.5),
    (sa.Column("a", sa.Text, server_default="skip"), "skip"),
    (sa.Column("a", sa.Integer, server_default=sa.text("8")), 8),
    (sa.Column("a", sa.Text, server_default=sa.text("'skip'")), "skip"),
    (sa.Column("a", sa.Integer, default=3), 3),
    (sa.Column("a", sa.Float, server_default=sa.func.now()), UNKNOWN),
    (sa.Column("a", sa.Float, default=lambda: 1.0), UNKNOWN),
    (sa.Column("a", sa.Text, server_default=sa.text("upper('x')")), UNKNOWN),
    (sa.Column("a", sa.Boolean, server_default="0"), UNKNOWN),
], ids=["none", "int", "float", "text", "sql_int", "sql_text", "python", "sql_function", "callable", "sql_expr",
        "bool"])
def test_the_default_a_fold_starts_from(column: sa.Column, expected: object):
    """L7: a column's value when no fact sets it: the declared literal default, NULL without one, and
    UNKNOWN (not folded, so not compared until a fact sets it) when the insert computes it."""
    assert column_default(column) is expected if expected in (None, UNKNOWN) else column_default(column) == expected
