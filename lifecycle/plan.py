"""The records of a command and how the engine plans one: the fact it appends and the row it leaves.

Planning is pure: it reads no database and writes nothing. :mod:`.engine` plans every command with
these functions and hands the plans (:class:`~.store.RowWrite`) to the book's store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .codec import digest, dumps, new_id
from .facts import GENESIS as GENESIS_ID, stored_values
from .head import Head, filled
from .policy import Lifecycle
from .reasons import Actor, Reason
from .store import RowWrite


@dataclass(frozen=True)
class Outcome:
    """The result of a command: ``applied`` (with the fact written) or ``conflict`` (nothing written)."""

    kind: Literal["applied", "conflict"]
    entity_type: str
    entity_id: str
    status: str | None
    version: int | None
    fact_id: str | None = None
    replayed: bool = False
    row: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    chain_hash: str | None = field(default=None, compare=False, repr=False)
    """The hash of the fact written (the row's new chain head)."""

    @property
    def applied(self) -> bool:
        """True when the command wrote its fact."""
        return self.kind == "applied"

    def head(self, **guarded: Any) -> Head | None:
        """The row's head as this command left it, with the ``guarded`` columns' values it wrote: what
        the next command on the row compares against (``apply_many(seen=)``). None unless applied."""
        if self.kind != "applied" or self.chain_hash is None or self.fact_id is None or self.status is None:
            return None
        return filled(Head, status=self.status, version=self.version, fact_id=self.fact_id,
                      chain_hash=self.chain_hash, guarded=guarded)

    @property
    def conflict(self) -> bool:
        """True when the command lost its compare-and-set (or, with ``if_absent``, the row existed) and wrote
        nothing.
        """
        return self.kind == "conflict"


@dataclass(frozen=True)
class Command:
    """One requested transition."""

    entity_type: str
    entity_id: str
    target: str
    reason: Reason
    actor: Actor
    expected: tuple[str, ...]
    guards: Mapping[str, Any] = field(default_factory=dict)
    patch: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def digest(self) -> str:
        """A digest of what the command asks (entity, target, reason, actor, expectations, patch): an idempotent
        replay must match it.
        """
        return digest(
            dumps(
                {
                    "entity": [self.entity_type, self.entity_id],
                    "target": self.target,
                    "reason": [self.reason.code, self.reason.summary, list(self.reason.evidence)],
                    "actor": [self.actor.type, self.actor.id],
                    "expected": sorted(self.expected),
                    "guards": dict(self.guards),
                    "patch": dict(self.patch),
                }
            )
        )


@dataclass(frozen=True)
class NewEntity:
    """One row for :func:`.engine.create_many`."""

    values: Mapping[str, Any]
    status: str
    reason: Reason
    actor: Actor
    metadata: Mapping[str, Any] | None = None


def fact_content(
    lc: Lifecycle, *, entity_id: str, prev_fact_id: str, previous: str | None, status: str | None, version: int,
    reason: Reason, actor: Actor, at: float, patch: Mapping[str, Any], metadata: Mapping[str, Any],
    idempotency_key: str | None = None, command_digest: str | None = None,
) -> dict[str, Any]:
    """The hashed fields of a new fact (``facts.HASHED_FIELDS``)."""
    return {
        "id": new_id(),
        "entity_type": lc.entity_type,
        "entity_id": entity_id,
        "prev_fact_id": prev_fact_id,
        "previous_status": previous,
        "status": status,
        "version": version,
        "reason_code": reason.code,
        "reason_summary": reason.summary,
        "evidence_refs": list(reason.evidence),
        "actor_type": actor.type,
        "actor_id": actor.id,
        "at": at,
        "patch": dict(patch),
        "metadata": dict(metadata),
        "idempotency_key": idempotency_key,
        "command_digest": command_digest,
        "policy_fingerprint": lc.fingerprint,
    }


def projection(content: Mapping[str, Any], fact: Mapping[str, Any]) -> dict[str, Any]:
    """The lifecycle column values a fact projects onto its row."""
    return {
        "status": content["status"],
        "version": content["version"],
        "updated_at": content["at"],
        "status_reason_code": content["reason_code"],
        "status_reason_summary": content["reason_summary"],
        "last_fact_id": content["id"],
        "chain_hash": fact["hash"],
    }


def plan_create(lc: Lifecycle, data: Mapping[str, Any], item: NewEntity, at: float, key: bytes | None = None) -> RowWrite:
    """The insert of a new row (``data`` holds its id) and its creation fact (previous status NULL)."""
    content = fact_content(
        lc, entity_id=data["id"], prev_fact_id=GENESIS_ID, previous=None, status=item.status, version=1,
        reason=item.reason, actor=item.actor, at=at, patch=data, metadata=item.metadata or {},
    )
    fact = stored_values(content, GENESIS_ID, key)
    return RowWrite(data["id"], {**data, **projection(content, fact)}, fact)


def plan_transition(lc: Lifecycle, cmd: Command, row: Head | Mapping[str, Any], at: float, key: bytes | None = None) -> RowWrite:
    """The compare-and-set update of ``row`` (as read) to ``cmd.target``, and its fact."""
    keyed = cmd.idempotency_key is not None
    status, version, fact_id, chain_hash = _read_head(row)
    content = fact_content(
        lc, entity_id=cmd.entity_id, prev_fact_id=fact_id, previous=status, status=cmd.target, version=version + 1,
        reason=cmd.reason, actor=cmd.actor, at=at, patch=cmd.patch, metadata=cmd.metadata,
        idempotency_key=cmd.idempotency_key, command_digest=cmd.digest() if keyed else None,
    )
    fact = stored_values(content, chain_hash, key)
    return RowWrite(cmd.entity_id, {**cmd.patch, **projection(content, fact)}, fact,
                    _expect(status, version, fact_id, chain_hash, cmd.guards), tuple(cmd.guards))


def plan_purge(lc: Lifecycle, entity_id: str, row: Mapping[str, Any], reason: Reason, actor: Actor, at: float,
               forced: bool, key: bytes | None = None) -> RowWrite:
    """The compare-and-set delete of ``row`` and its tombstone fact (status NULL)."""
    status, version, fact_id, chain_hash = _read_head(row)
    content = fact_content(
        lc, entity_id=entity_id, prev_fact_id=fact_id, previous=status, status=None, version=version + 1,
        reason=reason, actor=actor, at=at, patch={}, metadata={"forced": True} if forced else {},
    )
    fact = stored_values(content, chain_hash, key)
    return RowWrite(entity_id, {}, fact, _expect(status, version, fact_id, chain_hash, {}))


def _read_head(row: Head | Mapping[str, Any]) -> tuple[str, int, str, str]:
    """(status, version, last fact id, chain hash) of a row as read; a Head's read as attributes (its
    ``[]`` is a Python call, and this runs for every row of a pass)."""
    if type(row) is Head:
        return row.status, row.version, row.fact_id, row.chain_hash
    return row["status"], row["version"], row["last_fact_id"], row["chain_hash"]


def _expect(status: str, version: int, fact_id: str, chain_hash: str, guards: Mapping[str, Any]) -> dict[str, Any]:
    """The compare-and-set of a write: the row's head as read (its chain hash too: the new fact's
    ``prev_hash`` is taken from it, so a row given by a caller (``seen=``) with a wrong hash is a
    conflict, not a broken chain) and the guarded columns."""
    return {"version": version, "status": status, "last_fact_id": fact_id, "chain_hash": chain_hash, **guards}


def matches(cmd: Command, row: Head | Mapping[str, Any] | None) -> bool:
    """Does ``row`` (as read) satisfy the command's expected statuses and guards?"""
    if row is None:
        return False
    # A Head is read through its attributes and its dict (its ``[]`` is a Python call, for every row of a pass).
    if isinstance(row, Head):
        status, values = row.status, row.guarded
    else:
        status, values = row["status"], row
    if status not in cmd.expected:
        return False
    for g, v in cmd.guards.items():  # a loop, not all() over a generator
        if (values[g] if g in values else row[g]) != v:
            return False
    return True


_UNSET = object()
"""A guarded column the row does not hold: it differs from any value a command can guard on."""


def differing(cmd: Command, row: Head | Mapping[str, Any]) -> tuple[str, ...]:
    """The guarded columns whose value in ``row`` is not the command's, when its status is expected
    (why such a row is a conflict); empty when the status is not."""
    values: Mapping[str, Any] = row.guarded if isinstance(row, Head) else row
    status = row.status if isinstance(row, Head) else row["status"]
    if status not in cmd.expected:
        return ()
    return tuple(g for g, v in cmd.guards.items() if values.get(g, _UNSET) != v)


def applied(cmd: Command, write: RowWrite) -> Outcome:
    """The ``applied`` outcome of ``cmd`` once ``write`` is committed: its version, fact id and chain hash."""
    fact = write.fact
    return Outcome("applied", cmd.entity_type, cmd.entity_id, cmd.target, fact["version"], fact["id"],
                   chain_hash=fact["hash"])


def conflict(entity_type: str, entity_id: str, row: Head | Mapping[str, Any] | None = None) -> Outcome:
    """A ``conflict`` outcome for the entity, with the status and version it has now when ``row`` is given."""
    return Outcome("conflict", entity_type, entity_id, None if row is None else row["status"],
                   None if row is None else row["version"])

