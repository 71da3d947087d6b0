"""L12 without a database: verify's fast screen on stored values is never more lenient than ``check_entity``.

``verify`` hands an entity to ``check_entity`` only when the screen (lifecycle/screen.py) does not pass
it, so the screen must fail every entity ``check_entity`` would report. These tests tamper with stored
histories at random and check exactly that, and that intact histories pass (else verify is slow).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import examples
from statebook.lifecycle import Fact, Lifecycle, edges, managed_table
from statebook.lifecycle.replay import fold
from statebook.lifecycle.codec import dumps
from statebook.lifecycle.facts import GENESIS, JSON_FIELDS, STORED_FIELDS, decoded, insert_values
from statebook.lifecycle.replay import check_entity
from statebook.lifecycle.screen import Merge, Screen
from statebook.lifecycle.schema import row_defaults
from statebook.lifecycle.sweep import screen_of

META = sa.MetaData()
JOBS = managed_table(
    "screen_jobs", sa.Column("id", sa.String(32), primary_key=True), sa.Column("title", sa.Text),
    sa.Column("attempt", sa.Integer), sa.Column("tags", sa.JSON), sa.Column("score", sa.Float),
    sa.Column("level", sa.Integer, nullable=False, server_default="3"),  # no fact sets it: its default is checked
    meta=META,
)
JOB = Lifecycle(
    entity_type="job",
    table=JOBS,
    statuses=("new", "busy", "done"),
    initial={"new"},
    terminal={"done"},
    edges=(*edges("new", "busy"), *edges("busy", "new", "done"), *edges("done", "new", actors="operator")),
    patch_fields={"title", "attempt", "tags", "score"},
    reason_prefixes={"job"},
    reasons={"job.new.created", "job.busy.started", "job.done.ok", "job.purged.old"},
)
SCREEN = screen_of(JOB)
DEFAULTS = row_defaults(JOBS)


def folded(facts: list[Fact]) -> dict[str, Any] | None:
    """The whole row the facts describe: the fold over the table's declared defaults (L7)."""
    return fold(facts, DEFAULTS)

COLUMNS = [c.name for c in JOBS.columns]
MOVES = {"new": ["busy"], "busy": ["new", "done"], "done": ["new"]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
patches = st.fixed_dictionaries({}, optional={
    "title": st.text(max_size=6), "attempt": st.integers(0, 9), "tags": json_values,
    "score": st.floats(allow_nan=False, allow_infinity=False) | st.none(),
})


@st.composite
def histories(draw: st.DrawFn) -> list[Fact]:
    """A valid history of entity 'e1': created 'new', a walk along allowed edges, maybe a tombstone."""
    facts: list[Fact] = []
    status, prev_id, prev_hash, previous = "new", GENESIS, GENESIS, None
    given = {"title": "t", "attempt": 0, "tags": draw(json_values), "score": 1.5}
    patch: dict[str, Any] = {"id": "e1", **{k: v for k, v in given.items() if draw(st.booleans())}}
    for n in range(1, draw(st.integers(1, 5)) + 1):
        if n > 1:
            previous, status = status, draw(st.sampled_from(MOVES[status]))
            patch = draw(patches)
        actor = "operator" if (previous, status) == ("done", "new") else draw(st.sampled_from(["system", "operator"]))
        facts.append(_fact(n, prev_id, prev_hash, previous, status, actor, patch))
        prev_id, prev_hash = facts[-1].id, facts[-1].hash
    if draw(st.booleans()):
        facts.append(_fact(len(facts) + 1, prev_id, prev_hash, status, None, "operator", {}))
    return facts


def _fact(n: int, prev_id: str, prev_hash: str, previous: str | None, status: str | None, actor: str,
          patch: dict[str, Any], entity_id: str = "e1") -> Fact:
    content = {
        "id": f"{entity_id}-f{n}", "entity_type": "job", "entity_id": entity_id, "prev_fact_id": prev_id, "previous_status": previous,
        "status": status, "version": n, "reason_code": "job.new.created", "reason_summary": f"step {n}",
        "evidence_refs": ["ref"], "actor_type": actor, "actor_id": "a", "at": 1000.0 + n, "patch": patch,
        "metadata": {"n": n}, "idempotency_key": None, "command_digest": None, "policy_fingerprint": JOB.fingerprint,
    }
    return Fact(**insert_values(content, prev_hash), seq=10 * n)  # other entities' facts fall between


def stored_fact(fact: Fact) -> list[Any]:
    """A fact as verify reads it: STORED_FIELDS order, JSON fields as canonical text, then its seq."""
    return [*(dumps(getattr(fact, k)) if k in JSON_FIELDS else getattr(fact, k) for k in STORED_FIELDS), fact.seq]


def stored_row(state: dict[str, Any] | None) -> list[Any] | None:
    if state is None:
        return None
    return [dumps(state.get(c)) if c in SCREEN.json_columns else state.get(c) for c in COLUMNS]


def full_check(facts: list[list[Any]], row: list[Any] | None) -> list[Any]:
    values = None if row is None else {c: decoded(v) if c in SCREEN.json_columns else v for c, v in zip(COLUMNS, row)}
    return check_entity(JOB, "e1", [Fact.from_stored(f) for f in facts], values)


odd_values = st.none() | st.integers(-2, 12) | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    ["", "e1", "e1-f1", "e1-f2", "new", "busy", "done", "system", "operator", "{}", "[]", '{"attempt":3}', '{"attempt": 0}',
     '["ref"]', '[ "ref" ]', '{"n":1}', "x\x1fy", 'null'])


@st.composite
def tampered(draw: st.DrawFn) -> tuple[list[list[Any]], list[Any] | None]:
    """A stored history and row with one change an attacker or a bad write could make."""
    facts = draw(histories())
    rows = [stored_fact(f) for f in facts]
    row = stored_row(folded(facts))
    kind = draw(st.sampled_from(["fact", "fact", "forge", "forge", "drop", "swap", "reseq", "row", "no_row",
                                 "row_back"]))
    i = draw(st.integers(0, len(rows) - 1))
    if kind == "forge":
        # Someone who knows the hash function rewrites a fact and re-chains the rest (and maybe the row).
        field = draw(st.sampled_from(["version", "status", "previous_status", "actor_type", "patch", "prev_fact_id"]))
        value = draw({
            "patch": patches, "version": st.integers(0, 7), "actor_type": st.sampled_from(["system", "operator", ""]),
            "prev_fact_id": st.sampled_from(["", "e1-f1", "e1-f2", "e1-f3"]),
        }.get(field, st.sampled_from([None, "new", "busy", "done", "bogus"])))
        forged = [f.content() for f in facts]
        forged[i][field] = value
        prev_hash, chain = GENESIS, []
        for content, original in zip(forged, facts):
            chain.append(Fact(**insert_values(content, prev_hash), seq=original.seq))
            prev_hash = chain[-1].hash
        rows = [stored_fact(f) for f in chain]
        if draw(st.booleans()):
            try:
                row = stored_row(folded(chain))
            except (TypeError, ValueError):
                pass
    elif kind == "fact":
        field = draw(st.sampled_from((*STORED_FIELDS, "seq")))
        value = draw(odd_values)
        if field == "patch" and not (isinstance(value, str) and value.startswith("{")):
            value = "{}"  # check_entity folds patches, which must be JSON objects
        rows[i][len(STORED_FIELDS) if field == "seq" else STORED_FIELDS.index(field)] = value
    elif kind == "drop":
        del rows[i]
    elif kind == "swap":
        j = draw(st.integers(0, len(rows) - 1))
        rows[i], rows[j] = rows[j], rows[i]
    elif kind == "reseq":
        # Raw SQL moves facts in seq order, every hash untouched (L12d): two seqs swapped, or one moved.
        j = draw(st.integers(0, len(rows) - 1))
        if draw(st.booleans()):
            rows[i][-1], rows[j][-1] = rows[j][-1], rows[i][-1]
        else:
            rows[i][-1] = draw(st.integers(-5, 70))
    elif kind == "row" and row is not None:
        row[draw(st.integers(0, len(row) - 1))] = draw(odd_values)
    elif kind == "no_row":
        row = None
    elif kind == "row_back":
        row = stored_row(folded(facts[:-1]) if facts[-1].is_tombstone else folded(facts))
    return rows, row


@settings(max_examples=examples(400), deadline=None)
@given(histories())
def test_intact_histories_pass_the_screen(facts: list[Fact]):
    """L12: the history the engine would have written, stored as text, passes the screen."""
    rows, row = [stored_fact(f) for f in facts], stored_row(folded(facts))
    assert full_check(rows, row) == []
    assert SCREEN.passes(rows, row)


@settings(max_examples=examples(1500), deadline=None)
@given(tampered())
def test_the_screen_fails_every_entity_the_full_check_reports(case: tuple[list[list[Any]], list[Any] | None]):
    """L12: whatever was changed, an entity the screen passes has no findings."""
    rows, row = case
    if SCREEN.passes(rows, row):
        assert full_check(rows, row) == []


@pytest.mark.parametrize("steps", [
    [("new", "system", 1)], [("busy", "system", 1)],
    [("new", "system", 1), ("done", "system", 2)],
    [("new", "system", 1), ("busy", "system", 2), ("done", "system", 3), ("new", "system", 4)],
    [("new", "system", 1), ("busy", "system", 3)],
], ids=["intact", "not_initial", "undeclared_edge", "gated_edge_wrong_actor", "version_gap"])
def test_forged_but_well_hashed_histories(steps: list[tuple[str, str, int]]):
    """L12: facts forged with correct hashes (edge, actor, initial status, version) fail the screen."""
    facts: list[Fact] = []
    previous, prev_id, prev_hash = None, GENESIS, GENESIS
    for n, (status, actor, version) in enumerate(steps, start=1):
        fact = _fact(n, prev_id, prev_hash, previous, status, actor, {"id": "e1"} if n == 1 else {})
        content = {**fact.content(), "version": version}
        facts.append(Fact(**insert_values(content, prev_hash), seq=n))
        previous, prev_id, prev_hash = status, facts[-1].id, facts[-1].hash
    rows, row = [stored_fact(f) for f in facts], stored_row(folded(facts))
    found = full_check(rows, row)
    assert SCREEN.passes(rows, row) == (found == []) == (len(steps) == 1 and steps[0][0] == "new")


def test_facts_out_of_seq_order_fail_the_screen():
    """L12d: a history whose seq does not rise with its version fails the screen, and the full check names it;
    gaps in seq (other entities' facts between) pass."""
    facts = [_fact(1, GENESIS, GENESIS, None, "new", "system", {"id": "e1"})]
    for n, (previous, status) in enumerate((("new", "busy"), ("busy", "new")), start=2):
        facts.append(_fact(n, facts[-1].id, facts[-1].hash, previous, status, "system", {}))
    rows, row = [stored_fact(f) for f in facts], stored_row(folded(facts))
    assert SCREEN.passes(rows, row) and full_check(rows, row) == []
    rows[1][-1], rows[2][-1] = rows[2][-1], rows[1][-1]
    assert not SCREEN.passes(rows, row)
    assert [(f.kind, f.fact_id) for f in full_check(rows, row)] == [("seq_out_of_order", facts[2].id)]
    rows[1][-1], rows[2][-1] = 11, 12  # still rising: honest
    assert SCREEN.passes(rows, row) and full_check(rows, row) == []


def test_json_in_another_spelling_fails_the_screen_but_is_no_finding():
    """L12: the screen hashes stored text, so a re-spelled JSON value goes to the full check, which passes it."""
    facts = [_fact(1, GENESIS, GENESIS, None, "new", "system", {"id": "e1", "tags": [1]})]
    rows, row = [stored_fact(f) for f in facts], stored_row(folded(facts))
    rows[0][STORED_FIELDS.index("metadata")] = '{ "n" : 1 }'
    assert not SCREEN.passes(rows, row)
    assert full_check(rows, row) == []


def test_merge_pairs_facts_and_rows_across_batches():
    """verify's merge: an entity split across fact batches still meets its row; rows without facts and
    facts without a row become suspects (for the full check); the rest pass."""
    def history(entity_id: str) -> tuple[list[list[Any]], list[Any] | None]:
        first = _fact(1, GENESIS, GENESIS, None, "new", "system", {"id": entity_id}, entity_id)
        second = _fact(2, first.id, first.hash, "new", "busy", "system", {"attempt": 1}, entity_id)
        return [stored_fact(first), stored_fact(second)], stored_row(folded([first, second]))

    (a, a_row), (b, _), (d, d_row) = history("a"), history("b"), history("d")
    rows = iter([[a_row], [_orphan("bb"), _orphan("c")], [d_row, _orphan("e")]])
    merge = Merge(SCREEN)
    for batch in ([*a, b[0]], [b[1], *d]):
        while merge.wants_rows(batch[-1][SCREEN.entity_at]):
            merge.add_rows(next(rows, []))
        merge.add_facts(batch)
    merge.end_facts()
    for rest in rows:
        merge.add_rows(rest)
    assert (merge.entities, merge.facts) == (6, 6)
    assert [(s[0], len(s[1]), s[2] is not None) for s in merge.suspects] == [
        ("b", 2, False), ("bb", 0, True), ("c", 0, True), ("e", 0, True)]


def _orphan(entity_id: str) -> list[Any]:
    return [entity_id if c == "id" else None for c in COLUMNS]


def test_screen_arguments_are_plain_data():
    """A worker process rebuilds the screen from ``spec`` without importing statebook."""
    rebuilt = Screen(*SCREEN.spec)
    assert rebuilt.spec == SCREEN.spec and rebuilt.moves == SCREEN.moves and rebuilt.data == SCREEN.data
    assert all(type(c) is str for c in SCREEN.spec[3])  # SQLAlchemy's quoted_name would not unpickle there


def test_columns_no_fact_sets_are_screened_against_their_defaults():
    """L7 / L12: a data column no fact set must hold its declared default (a server default, else NULL; for
    a JSON column SQL NULL or JSON null), else the entity fails the screen and the full check names the column."""
    facts = [_fact(1, GENESIS, GENESIS, None, "new", "system", {"id": "e1"})]
    rows = [stored_fact(f) for f in facts]
    row = stored_row(folded(facts))
    assert SCREEN.passes(rows, row) and full_check(rows, row) == []
    sql_null = [None if c == "tags" else v for c, v in zip(COLUMNS, row)]
    assert SCREEN.passes(rows, sql_null) and full_check(rows, sql_null) == []
    assert row[COLUMNS.index("level")] == 3, "the server default"
    for column, value in (("attempt", 3), ("score", 0.5), ("title", "forged"), ("tags", "[1]"), ("level", 4),
                          ("level", "3")):
        tampered = [value if c == column else v for c, v in zip(COLUMNS, row)]
        assert not SCREEN.passes(rows, tampered), column
        assert [(f.kind, f.detail.split("'")[1]) for f in full_check(rows, tampered)] == [("row_mismatch", column)]


def test_the_screen_judges_each_fact_by_the_policy_it_was_written_under():
    """L12c: a history written under an accepted earlier policy passes the screen of the lifecycle that
    accepts it; the same history fails the screen (and has findings) when that policy is not accepted, or
    when a forged fact takes a move no accepted policy allowed."""
    v1 = JOB.extend(edges=edges("new", "done"))
    v2 = dataclasses.replace(JOB, accepts=(v1,))
    strict = dataclasses.replace(JOB, accepts=())

    def written(lc: Lifecycle, *steps: tuple[str | None, str]) -> list[list[Any]]:
        facts, prev_id, prev_hash = [], GENESIS, GENESIS
        for n, (previous, status) in enumerate(steps, start=1):
            content = {**_fact(n, prev_id, prev_hash, previous, status, "system", {"id": "e1"} if n == 1 else {})
                       .content(), "policy_fingerprint": lc.fingerprint}
            facts.append(Fact(**insert_values(content, prev_hash), seq=n))
            prev_id, prev_hash = facts[-1].id, facts[-1].hash
        return [stored_fact(f) for f in facts]

    def verdicts(lc: Lifecycle, rows: list[list[Any]]) -> tuple[bool, list[str]]:
        facts = [Fact.from_stored(f) for f in rows]
        row = stored_row(folded(facts))
        return screen_of(lc).passes(rows, row), [f.kind for f in check_entity(lc, "e1", facts, None if row is None else {
            c: decoded(v) if c in SCREEN.json_columns else v for c, v in zip(COLUMNS, row)})]

    old = written(v1, (None, "new"), ("new", "done"))
    assert verdicts(v2, old) == (True, [])
    assert verdicts(strict, old) == (False, ["unknown_policy", "unknown_policy"])
    assert verdicts(JOB, old) == (False, ["edge_not_in_current_policy"])
    forged = written(v1, (None, "new"), ("new", "busy"), ("busy", "done"), ("done", "new"))
    assert verdicts(v2, forged) == (False, ["forbidden_edge"])
    assert Screen(*screen_of(v2).spec).policies == screen_of(v2).policies
