"""What the outbox state machine test knows and checks, apart from the machine's rules.

The database is the state; this module reads it back (rows and every dispatch fact, purged
entities included) and checks the outbox invariants against it and against the transport runs
the test recorded. An *epoch* of a dispatch is the stretch between two operator retries: the
attempt counter restarts at 0 in each, so a claim is identified by (epoch, attempt).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Fact, facts_table
from statebook.outbox import dispatch_outbox

TERMINAL = frozenset({"delivered", "acked", "dead_letter", "expired"})
LIVE = frozenset({"pending", "delivering"})
ClaimKey = tuple[int, int]  # (epoch, attempt)


@dataclass
class Snapshot:
    rows: dict[str, dict[str, Any]]
    facts: dict[str, list[Fact]]

    def fact_count(self, dispatch_id: str) -> int:
        return len(self.facts.get(dispatch_id, ()))


async def snapshot(book: Book) -> Snapshot:
    t, f = dispatch_outbox, facts_table
    async with book.read() as conn:
        rows = {r.id: dict(r._mapping) for r in (await conn.execute(sa.select(t))).fetchall()}
        found = (await conn.execute(sa.select(f).where(f.c.entity_type == "dispatch").order_by(f.c.seq))).fetchall()
    facts: dict[str, list[Fact]] = defaultdict(list)
    for r in found:
        facts[r.entity_id].append(Fact.from_row(r))
    return Snapshot(rows, dict(facts))


def is_operator_retry(fact: Fact) -> bool:
    return fact.previous_status in TERMINAL and fact.status == "pending"


def epoch_of(facts: list[Fact]) -> int:
    return sum(1 for f in facts if is_operator_retry(f))


def claim_keys(facts: list[Fact]) -> list[ClaimKey]:
    """(epoch, attempt) of every won claim, in commit order."""
    keys, epoch = [], 0
    for fact in facts:
        if is_operator_retry(fact):
            epoch += 1
        elif fact.status == "delivering":
            keys.append((epoch, int(fact.patch["attempt"])))
    return keys


@dataclass
class Runs:
    """Transport executions the test saw, per dispatch: (epoch, attempt), or None when unknown."""

    by_dispatch: dict[str, list[ClaimKey | None]] = field(default_factory=lambda: defaultdict(list))

    def record(self, dispatch_id: str, key: ClaimKey | None) -> None:
        self.by_dispatch[dispatch_id].append(key)


def problems(snap: Snapshot, runs: Runs) -> list[str]:
    """Every invariant violation visible in a snapshot (empty when all hold)."""
    found: list[str] = []
    dedup = Counter(r["dedup_key"] for r in snap.rows.values() if r["dedup_key"] is not None)
    for key, n in dedup.items():
        if n > 1:
            found.append(f"O-dedup: {n} rows share dedup key {key!r}")
    for did, row in snap.rows.items():
        if row["status"] in LIVE:
            due = row["next_attempt_at"]
            if due is None or not math.isfinite(due):
                found.append(f"O-due: {row['status']} row {did} has no finite due time ({due!r})")
        if not 0 <= row["attempt"] <= row["max_attempts"]:
            found.append(f"O-bounded: row {did} has attempt {row['attempt']} of max {row['max_attempts']}")
    for did, facts in snap.facts.items():
        keys = claim_keys(facts)
        for key, n in Counter(keys).items():
            if n > 1:
                found.append(f"O-single-claim: {did} attempt {key} was claimed {n} times")
        for f in facts:
            if f.status == "delivering" and f.previous_status not in LIVE:
                found.append(f"O-terminal: {did} was claimed from {f.previous_status!r}")
        per_epoch: dict[int, list[int]] = defaultdict(list)
        for epoch, attempt in keys:
            per_epoch[epoch].append(attempt)
        for epoch, attempts in per_epoch.items():
            if attempts != list(range(1, len(attempts) + 1)):
                found.append(f"O-single-claim: {did} epoch {epoch} claimed attempts {attempts}, not 1, 2, 3, ...")
        seen = runs.by_dispatch.get(did, [])
        if len(seen) > len(keys):
            found.append(f"O-runs: {did} ran the transport {len(seen)} times for {len(keys)} won claims")
        exact = Counter(k for k in seen if k is not None)
        for key, n in exact.items():
            if n > 1:
                found.append(f"O-runs: {did} ran the transport {n} times for claim {key}")
            if key not in keys:
                found.append(f"O-runs: {did} ran the transport for {key}, which no claim fact records")
    return found
