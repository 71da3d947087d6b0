"""What the outbox state machine (test_stateful_outbox.py) knows and checks, apart from its rules.

The database is the state. This module reads it back (rows, and every dispatch fact including
those of purged entities), says what each step should do given the row it acts on, and checks the
outbox invariants (specs/outbox.md) against a snapshot and the transport runs the test recorded.
An *epoch* of a dispatch is the stretch between two operator retries or releases: an operator retry
restarts the attempt counter at 0 and a release (O21) gives the released attempt back, so the next
claim repeats that attempt number; a claim is identified by (epoch, attempt).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Fact, Lifecycle
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.replay import check_entity
from statebook.outbox import CallableTransport, TransportResult, dispatch_outbox
from statebook.outbox.dispatch.attempts import Candidate, Lease

TERMINAL = frozenset({"delivered", "acked", "dead_letter", "expired"})
LIVE = frozenset({"pending", "delivering"})
ClaimKey = tuple[int, int]  # (epoch, attempt)

SEEN: Counter[str] = Counter()
"""How often each interesting path ran; the tests print it (``pytest -s``) to show coverage."""


def event(what: str) -> None:
    SEEN[what] += 1


# -- reading the database back -----------------------------------------------------------------


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


def is_release(fact: Fact) -> bool:
    return fact.reason_code == "dispatch.pending.released"


def starts_epoch(fact: Fact) -> bool:
    return is_operator_retry(fact) or is_release(fact)


def epoch_of(facts: list[Fact]) -> int:
    return sum(1 for f in facts if starts_epoch(f))


def epoch_starts(facts: list[Fact]) -> list[int]:
    """The attempt each epoch's first claim must take: 1, then the attempt its opening fact left, plus one."""
    return [1] + [int(f.patch["attempt"]) + 1 for f in facts if starts_epoch(f)]


def claim_keys(facts: list[Fact]) -> list[ClaimKey]:
    """(epoch, attempt) of every won claim, in commit order."""
    keys, epoch = [], 0
    for fact in facts:
        if starts_epoch(fact):
            epoch += 1
        elif fact.status == "delivering":
            keys.append((epoch, int(fact.patch["attempt"])))
    return keys


# -- what the claimants hold --------------------------------------------------------------------


@dataclass(eq=False)
class Held:
    """A lease won by a claimant, with the epoch it was won in. Kept forever for zombie draws."""

    lease: Lease
    epoch: int

    @property
    def key(self) -> ClaimKey:
        return (self.epoch, self.lease.attempt)

    def __repr__(self) -> str:
        return f"Held({self.lease.dispatch_id[:6]}, epoch={self.epoch}, attempt={self.lease.attempt})"


@dataclass
class Claimant:
    phase: str = "idle"  # idle -> scanned -> claimed -> executed -> idle; a crash resets to idle
    candidates: list[Candidate] = field(default_factory=list)
    held: Held | None = None
    result: TransportResult | None = None

    def forget(self) -> None:
        self.phase, self.candidates, self.held, self.result = "idle", [], None, None


@dataclass
class Runs:
    """Transport executions the test saw, per dispatch, each with the claim it ran under."""

    by_dispatch: dict[str, list[ClaimKey]] = field(default_factory=lambda: defaultdict(list))

    def record(self, dispatch_id: str, key: ClaimKey) -> None:
        self.by_dispatch[dispatch_id].append(key)


def scripted(outcome: str, on_run) -> CallableTransport:  # noqa: ANN001
    """A transport whose result is decided by the test: ok, fail, timeout (a failed result that
    says so — no real waiting) or raise (execute must turn it into a failed result)."""

    async def send(deliver_to: str, payload: str) -> TransportResult:
        on_run()
        if outcome == "raise":
            raise RuntimeError("transport crashed")
        if outcome == "timeout":
            return TransportResult.failed("timeout: the transport ran longer than 10s", timed_out=True)
        return TransportResult(outcome == "ok", None if outcome == "ok" else "exit 3")

    return CallableTransport(send)


# -- what each step should do -------------------------------------------------------------------


def fresh(row: dict | None, cand: Candidate) -> bool:
    """The row is still exactly what the scan read, so a compare-and-set on it can pass."""
    return row is not None and (row["status"], row["attempt"], row["next_attempt_at"]) == (
        cand.status, cand.attempt, cand.next_attempt_at)


def exhausted(cand: Candidate) -> bool:
    return cand.status == "delivering" and cand.attempt >= cand.max_attempts


def expected_settle(row: dict | None, cand: Candidate, now: float) -> str | None:
    """O6 expiry wins (even over a lapsed lease); O5 a lapsed last attempt is dead-lettered."""
    if not fresh(row, cand):
        return None
    if cand.expires_at is not None and cand.expires_at <= now:
        return "expired"
    return "dead_letter" if exhausted(cand) else None


def claimable(row: dict | None, cand: Candidate, now: float) -> bool:
    """O5/O6/O9: only a fresh, due, unexpired, unexhausted candidate can be claimed."""
    return (fresh(row, cand) and cand.next_attempt_at <= now and not exhausted(cand)
            and (cand.expires_at is None or cand.expires_at > now))


def expected_finalize(lease: Lease, result: TransportResult) -> tuple[str, str]:
    """(return value, new status) of a finalization by the row's current claim (O7, O9, O10)."""
    bound = lease.attempt >= lease.max_attempts
    if result.ok:
        if not lease.ack_required:
            return "delivered", "delivered"
        return ("dead_letter", "dead_letter") if bound else ("awaiting_ack", "pending")
    return ("dead_letter", "dead_letter") if bound else ("retried", "pending")


# -- invariants -------------------------------------------------------------------------------


def problems(snap: Snapshot, runs: Runs, lc: Lifecycle) -> list[str]:
    """Every invariant violation visible in a snapshot (empty when all hold)."""
    found: list[str] = []
    dedup = Counter(r["dedup_key"] for r in snap.rows.values() if r["dedup_key"] is not None)
    found += [f"O3: {n} rows share dedup key {key!r}" for key, n in dedup.items() if n > 1]
    for did, row in snap.rows.items():
        due = row["next_attempt_at"]
        if row["status"] in LIVE and (due is None or not math.isfinite(due)):
            found.append(f"O7: {row['status']} row {did} has no finite due time ({due!r})")
        if not 0 <= row["attempt"] <= row["max_attempts"]:
            found.append(f"O9: row {did} has attempt {row['attempt']} of max {row['max_attempts']}")
    for did in snap.rows.keys() | snap.facts.keys():
        facts = snap.facts.get(did, [])
        # verify's per-entity check: chain, hashes, edges, and row == fold(facts) (L7, L8).
        found += [f"L7 {f.kind}: {did} {f.detail}" for f in check_entity(lc, did, facts, snap.rows.get(did))]
        keys = claim_keys(facts)
        found += [f"O5: {did} attempt {k} was claimed {n} times" for k, n in Counter(keys).items() if n > 1]
        found += [f"O9: {did} was claimed from {f.previous_status!r}" for f in facts
                  if f.status == "delivering" and f.previous_status not in LIVE]
        per_epoch: dict[int, list[int]] = defaultdict(list)
        for epoch, attempt in keys:
            per_epoch[epoch].append(attempt)
        starts = epoch_starts(facts)
        for epoch, attempts in per_epoch.items():
            first = starts[epoch]
            if attempts != list(range(first, first + len(attempts))):
                found.append(f"O5: {did} epoch {epoch} claimed attempts {attempts}, not {first}, {first + 1}, ...")
        claimed = 0
        for f in facts:
            if f.status == "delivering":
                claimed = int(f.patch["attempt"])
            elif is_release(f) and (f.previous_status, f.patch.get("attempt")) != ("delivering", claimed - 1):
                found.append(f"O21: {did} release {f.id} from {f.previous_status!r} left attempt "
                             f"{f.patch.get('attempt')}, not the released claim's {claimed} - 1")
        seen = runs.by_dispatch.get(did, [])
        if len(seen) > len(keys):
            found.append(f"O5: {did} ran the transport {len(seen)} times for {len(keys)} won claims")
        for key, n in Counter(seen).items():
            if n > 1:
                found.append(f"O5: {did} ran the transport {n} times under claim {key}")
            if key not in keys:
                found.append(f"O5: {did} ran the transport under {key}, which no claim fact records")
    return found
