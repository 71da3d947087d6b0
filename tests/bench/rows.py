"""Dispatch rows and their facts, built by hand for the raw floor and the history seeder.

The values are what statebook's engine writes for the same step: the data columns, the lifecycle
columns, and a fact whose hash chains to the previous one (computed by the engine's own
``insert_values``, so a seeded history passes ``verify``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from statebook.lifecycle.codec import dumps
from statebook.lifecycle.facts import GENESIS, insert_values
from statebook.outbox.dispatch.policy import DISPATCH
from statebook.outbox.dispatch.schema import dispatch_outbox

FINGERPRINT = DISPATCH.fingerprint
LEASE_SECONDS = 15.0

DISPATCH_COLUMNS = tuple(c.name for c in dispatch_outbox.columns)
HAS_CLAIM_ID = "claim_id" in DISPATCH_COLUMNS
"""The outbox fences finalization with a per-claim id when its table has the column."""
FACT_COLUMNS = (
    "id", "entity_type", "entity_id", "prev_fact_id", "previous_status", "status", "version", "reason_code",
    "reason_summary", "evidence_refs", "actor_type", "actor_id", "at", "patch", "metadata", "idempotency_key",
    "command_digest", "policy_fingerprint", "prev_hash", "hash",
)
_JSON_DISPATCH = {"payload"}
_JSON_FACT = {"evidence_refs", "patch", "metadata"}


@dataclass
class Head:
    """What a claimer knows about a row: enough to write the next fact without reading again."""

    id: str
    status: str
    version: int
    attempt: int
    last_fact_id: str
    chain_hash: str


def new_dispatch(now: float, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pending dispatch row and its creation fact."""
    did = uuid.uuid4().hex
    payload = {"schema_version": 1, "kind": "bench.noop", "dispatch_id": did, "body": {"n": n}, "created_at": now}
    data = {
        "id": did, "kind": "bench.noop", "deliver_to": "noop", "payload": payload, "dedup_key": None,
        "attempt": 0, "max_attempts": 8, "next_attempt_at": now, "ack_required": 0, "ack_token": None,
        "session_id": None, "schedule_run_id": None, "last_error": None, "created_at": now, "expires_at": None,
    }
    content = _content(did, GENESIS, None, "pending", 1, "dispatch.pending.enqueued", "enqueued", "enqueue", now,
                       data)
    fact = insert_values(content, GENESIS)
    row = {**dict.fromkeys(DISPATCH_COLUMNS), **data, **_projection(fact)}
    return row, fact


def step(head: Head, target: str, reason: str, actor_id: str, now: float,
         patch: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fact of ``head -> target`` and the column values the row takes (patch + projection)."""
    content = _content(head.id, head.last_fact_id, head.status, target, head.version + 1, reason, target,
                       actor_id, now, patch)
    fact = insert_values(content, head.chain_hash)
    return fact, {**patch, **_projection(fact)}


def _content(entity_id: str, prev_fact_id: str, previous: str | None, status: str, version: int, reason: str,
             summary: str, actor_id: str, at: float, patch: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex, "entity_type": "dispatch", "entity_id": entity_id, "prev_fact_id": prev_fact_id,
        "previous_status": previous, "status": status, "version": version, "reason_code": reason,
        "reason_summary": summary, "evidence_refs": [], "actor_type": "system", "actor_id": actor_id, "at": at,
        "patch": patch, "metadata": {}, "idempotency_key": None, "command_digest": None,
        "policy_fingerprint": FINGERPRINT,
    }


def _projection(fact: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": fact["status"], "version": fact["version"], "updated_at": fact["at"],
        "status_reason_code": fact["reason_code"], "status_reason_summary": fact["reason_summary"],
        "last_fact_id": fact["id"], "chain_hash": fact["hash"],
    }


def claim_patch(head: Head, now: float) -> dict[str, Any]:
    patch: dict[str, Any] = {"attempt": head.attempt + 1, "next_attempt_at": now + LEASE_SECONDS}
    if HAS_CLAIM_ID:
        patch["claim_id"] = uuid.uuid4().hex
    return patch


def head_of(row: dict[str, Any]) -> Head:
    return Head(row["id"], row["status"], row["version"], row["attempt"], row["last_fact_id"], row["chain_hash"])


def dispatch_params(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(dumps(row[c]) if c in _JSON_DISPATCH else row[c] for c in DISPATCH_COLUMNS)


def fact_params(fact: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(dumps(fact[c]) if c in _JSON_FACT else fact[c] for c in FACT_COLUMNS)


def delivered_history(now: float, n: int) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """A delivered dispatch (terminal) with its three facts: enqueued, claimed, delivered."""
    row, created = new_dispatch(now, n)
    head = head_of(row)
    claimed, cols = step(head, "delivering", "dispatch.delivering.attempt", "delivery", now + 0.001,
                         claim_patch(head, now + 0.001))
    row.update(cols)
    head = head_of(row)
    done, cols = step(head, "delivered", "dispatch.delivered.transport_ok", "delivery", now + 0.002,
                      {"last_error": None})
    row.update(cols)
    return dispatch_params(row), [fact_params(created), fact_params(claimed), fact_params(done)]


def placeholders(n: int, style: str) -> str:
    """``$1, $2, ...`` (asyncpg) or ``?, ?, ...`` (sqlite)."""
    return ", ".join(f"${i}" for i in range(1, n + 1)) if style == "pg" else ", ".join("?" * n)


def insert_dispatch_sql(style: str) -> str:
    return f"INSERT INTO dispatch_outbox ({', '.join(DISPATCH_COLUMNS)}) VALUES ({placeholders(len(DISPATCH_COLUMNS), style)})"


def insert_fact_sql(style: str) -> str:
    return f"INSERT INTO status_transitions ({', '.join(FACT_COLUMNS)}) VALUES ({placeholders(len(FACT_COLUMNS), style)})"
