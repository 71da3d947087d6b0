"""What the machine reads after every step, and the invariants it checks on it.

:class:`Checks` is a mixin of ``@invariant`` methods; :class:`~.machine.LifecycleMachine` inherits
it. Each invariant names the rule of specs/lifecycle.md it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from hypothesis.stateful import invariant

from ..book import Book
from ..facts import GENESIS, Fact, facts_table, fact_hash
from ..replay import read_row, replay
from ..schema import LIFECYCLE_COLUMNS

if TYPE_CHECKING:
    from .model import ReferenceModel

__all__ = ["Checks", "Snapshot", "read_snapshot"]

Key = tuple[str, str]


@dataclass
class Snapshot:
    """What the database holds, for the lifecycles the machine tracks, after one step."""

    rows: dict[Key, dict[str, Any] | None]
    """Every entity's row (None: there is none), for the model's entities and every entity with facts."""
    folds: dict[Key, dict[str, Any] | None]
    """``replay`` of each of those entities: the row its facts describe."""
    facts: dict[Key, list[Fact]]
    strays: list[Fact]
    """Facts of entities the model does not know (yet)."""
    total_facts: int
    table_ids: dict[str, set[str]]
    """The ids in each tracked lifecycle's table."""


async def read_snapshot(book: Book, model: ReferenceModel) -> Snapshot:
    """Read every fact, row and fold of the lifecycles ``model`` tracks."""
    types = tuple(model.lifecycles)
    t = facts_table
    async with book.read() as conn:
        every = (await conn.execute(
            sa.select(t).where(t.c.entity_type.in_(types)).order_by(t.c.seq)
        )).fetchall()
        table_ids = {}
        for entity_type, lc in model.lifecycles.items():
            table_ids[entity_type] = set((await conn.execute(sa.select(lc.table.c.id))).scalars())
    facts: dict[Key, list[Fact]] = {key: [] for key in model.entities}
    strays = []
    for record in every:
        fact = Fact.from_row(record)
        key = (fact.entity_type, fact.entity_id)
        if key not in model.entities:
            strays.append(fact)
        facts.setdefault(key, []).append(fact)
    rows, folds = {}, {}
    for key in facts:
        folds[key] = await replay(book, *key)
        rows[key] = await read_row(book, *key)
    return Snapshot(rows, folds, facts, strays, len(every), table_ids)


def differences(row: Mapping[str, Any] | None, expected: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The columns where ``row`` and ``expected`` differ: name -> (row's value, expected value)."""
    row = row or {}
    return {c: (row.get(c), v) for c, v in expected.items() if row.get(c) != v}


class Checks:
    """The invariants checked after every step (mixed into ``LifecycleMachine``).

    They read ``self.snapshot()`` (the database after the step), ``self.before`` (before it),
    ``self.writes`` (facts the step should have written, per entity) and ``self.model``.
    """

    model: ReferenceModel
    before: Snapshot | None
    writes: dict[Key, int]

    def snapshot(self) -> Snapshot:  # pragma: no cover - provided by the machine
        """The database as the machine sees it now (provided by the machine)."""
        raise NotImplementedError

    @invariant()
    def row_is_fold_of_facts(self) -> None:
        """L7: every row equals the fold of its facts (status, version, lifecycle and data columns);
        a purged entity folds to nothing and has no row."""
        snap = self.snapshot()
        for key, folded in snap.folds.items():
            row = snap.rows[key]
            if folded is None:
                assert row is None, f"{key}: the facts end in a tombstone but the row exists: {row}"
                continue
            assert row is not None, f"{key}: the facts describe a row that does not exist: {folded}"
            assert set(LIFECYCLE_COLUMNS) <= set(folded), f"{key}: the fold lacks lifecycle columns: {folded}"
            differ = differences(row, folded)
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
                    assert self.model.accepts(f), (
                        f"{key}: fact {f.previous_status} -> {f.status} by {f.actor_type} with patch "
                        f"{sorted(f.patch)} follows no declared edge"
                    )

    @invariant()
    def step_wrote_what_the_model_predicted(self) -> None:
        """L3, L4, L5: a rejected, conflicting, rolled-back, dropped, replayed or mismatched command
        wrote nothing — fact count and row unchanged; an applied one wrote exactly one fact, earlier
        facts untouched. No fact belongs to an entity nobody created."""
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
    def idempotency_keys_used_once(self) -> None:
        """L9: an idempotency key produced at most one fact of an entity (a retry replays, it never
        writes a second fact)."""
        for key, facts in self.snapshot().facts.items():
            used = [f.idempotency_key for f in facts if f.idempotency_key is not None]
            twice = sorted({k for k in used if used.count(k) > 1})
            assert not twice, f"{key}: idempotency key(s) {twice} wrote more than one fact"

    @invariant()
    def model_matches_database(self) -> None:
        """L4, L6, L7, L11: the database holds what the model predicts — status, version, data and
        lifecycle columns (updated_at from the FakeClock); a purged entity has no row and a history
        ending in its tombstone; no table holds a row the model does not know."""
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
            differ = differences(row, entity.data)
            assert not differ, f"{key}: (database, model) differ: {differ}"
        for entity_type, ids in now.table_ids.items():
            live = {e.entity_id for e in self.model.live() if e.lc.entity_type == entity_type}
            assert ids == live, (
                f"{entity_type}: rows nobody created through the lifecycle {sorted(ids - live)}, "
                f"rows missing {sorted(live - ids)}"
            )
