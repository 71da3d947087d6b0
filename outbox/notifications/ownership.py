"""Who owns a semantic obligation: owners, followers and successors (specs/notifications.md N13-N24).

A notification accepted with an ``obligation_key`` is counted under ONE ``dedup_claim`` per semantic
obligation — (recipient, obligation key, mode): a best-effort delivery never satisfies a guaranteed
duplicate. The claim names the owner (the notification that does the delivering), its generation
(raised at every change of owner) and the end of the suppression window. Every function here joins
the caller's transaction (a bound book) and reads the claim under a row lock, so the claim and the
notifications it concerns change together or not at all:

- :func:`arrival` — what a new arrival is: the owner (no claim; a released claim; a satisfied one whose
  window has passed; an ownerless one, which is never taken as evidence of delivery), a follower of a
  live owner (even after the window: pending ownership survives it), or satisfied at once (a
  delivered owner's window covers it);
- :func:`owner_delivered` — the owner's followers become ``deduplicated`` and the claim ``satisfied``;
- :func:`plan_failure` / :func:`apply_failure` — the oldest follower is elected successor with a higher generation, the others
  re-linked to it, the window kept; without followers the claim is ``released``. An owner the claim no
  longer names (a newer owner took it) changes nothing of the claim: its own followers, if any, go to
  the current owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, Head, Reason, apply_many, create, head_columns
from statebook.lifecycle.codec import digest

from .schema import dedup_claims, notifications

OWNERSHIP_ACTOR = Actor("system", "notification_ownership")
DEFAULT_WINDOW_SECONDS = 300.0
"""The suppression window when an intake names an obligation key but no window."""

Role = Literal["owner", "follower", "satisfied"]


def dedup_claim_id(recipient: str, obligation_key: str, mode: str) -> str:
    """The id of the semantic obligation's claim."""
    return digest("notification", recipient, obligation_key, mode)


@dataclass(frozen=True)
class Arrival:
    """What a new arrival is, and the values its row starts with."""

    role: Role
    dedup_claim_id: str
    owner_id: str | None  # the owner it follows or that satisfied it (None: it is the owner)
    generation: int


async def _locked_claim(tx: Book, cid: str) -> dict[str, Any] | None:
    store = tx.store
    async with store.reader(tx.conn) as unit:
        rows = await store.select(unit, _CLAIM_BY_ID, {"b_id": cid}, lock="wait")
    return rows[0] if rows else None


async def lock(tx: Book, cid: str) -> dict[str, Any] | None:
    """Take the claim's row lock in ``tx`` (the first lock of every ownership change, so that they
    queue instead of deadlocking); the row, or None."""
    return await _locked_claim(tx, cid)


_CLAIM_BY_ID = sa.select(dedup_claims).where(dedup_claims.c.id == sa.bindparam("b_id", type_=sa.String))


def _head(row: dict[str, Any]) -> Head:
    return Head.of(row, "owner_id", "generation")


async def move_claim(tx: Book, row: dict[str, Any], target: str, code: str, summary: str,
                     patch: dict[str, Any]) -> bool:
    """Move the claim along one edge, compared against ``row`` as locked (owner and generation guarded);
    True when it applied."""
    command = Command("dedup_claim", row["id"], target, Reason(code, summary), OWNERSHIP_ACTOR, (row["status"],),
                      {"owner_id": row["owner_id"], "generation": row["generation"]}, patch)
    [outcome] = await apply_many(tx, [command], seen={row["id"]: _head(row)})
    return outcome.applied


class OwnershipRace(Exception):
    """The claim moved under a lock that should have held it (a bug, or a claim written outside this
    module): the caller's transaction rolls back."""


async def locked_claim(tx: Book, *, recipient: str, obligation_key: str, mode: str) -> tuple[dict[str, Any] | None, str]:
    """The obligation's claim row, locked in ``tx`` (None when there is none yet), and its id.
    Intakes of one obligation queue here."""
    cid = dedup_claim_id(recipient, obligation_key, mode)
    return await _locked_claim(tx, cid), cid


async def create_claim(tx: Book, cid: str, *, recipient: str, obligation_key: str, mode: str, owner_id: str,
                       window: float, now: float) -> dict[str, Any] | None:
    """Create the obligation's claim, owned by ``owner_id``: None when created; the (locked) row a
    racing intake created first otherwise."""
    values = {"id": cid, "recipient": recipient, "dedup_key": obligation_key, "obligation": mode,
              "owner_id": owner_id, "generation": 1, "window_until": now + window}
    made = await create(tx, "dedup_claim", values=values, status="owned", actor=OWNERSHIP_ACTOR,
                        reason=Reason("dedup_claim.owned.acquired", "first owner of the obligation"), if_absent=True)
    if made.applied:
        return None
    row = await _locked_claim(tx, cid)  # the racing intake has committed by now
    if row is None:
        raise OwnershipRace(f"dedup claim {cid} conflicted on creation but cannot be read")
    return row


async def arrival(tx: Book, row: dict[str, Any] | None, cid: str, *, notification_id: str, window: float,
                  now: float) -> Arrival:
    """What a new arrival is, given its obligation's locked claim (None: :func:`create_claim` just
    created it for this arrival); writes the claim's side of it in ``tx``."""
    if row is None:
        return Arrival("owner", cid, None, 1)
    owner = row["owner_id"]
    if row["status"] == "owned" and owner is not None:
        return Arrival("follower", cid, owner, row["generation"])
    if row["status"] == "satisfied" and owner is not None and now < row["window_until"]:
        return Arrival("satisfied", cid, owner, row["generation"])
    # Released, satisfied and expired, or ownerless: a fresh owner with a higher generation, a new window.
    generation = row["generation"] + 1
    moved = await move_claim(tx, row, "owned", "dedup_claim.owned.acquired",
                                 f"new owner (generation {generation})",
                                 {"owner_id": notification_id, "generation": generation, "window_until": now + window})
    if not moved:
        raise OwnershipRace(f"dedup claim {cid} changed under its row lock")
    return Arrival("owner", cid, None, generation)


_FOLLOWERS = (
    sa.select(notifications.c.id, *head_columns(notifications), notifications.c.obligation_owner_id,
              notifications.c.generation)
    .where(notifications.c.obligation_owner_id == sa.bindparam("b_owner", type_=sa.String),
           notifications.c.status == "pending")
    .order_by(notifications.c.created_at, notifications.c.id)
)
"""An owner's pending followers, oldest first (the successor is the first)."""


async def _followers(tx: Book, owner_id: str) -> list[dict[str, Any]]:
    store = tx.store
    async with store.reader(tx.conn) as unit:
        return await store.select(unit, _FOLLOWERS, {"b_owner": owner_id}, lock="wait")


def _follower_command(f: dict[str, Any], target: str, code: str, summary: str, patch: dict[str, Any]) -> Command:
    return Command("notification", f["id"], target, Reason(code, summary), OWNERSHIP_ACTOR, ("pending",),
                   {"obligation_owner_id": f["obligation_owner_id"], "generation": f["generation"]}, patch)


def _seen(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in rows}


async def owner_delivered(tx: Book, *, owner_id: str, cid: str, now: float) -> int:
    """The owner delivered: its followers ``deduplicated`` and the claim ``satisfied`` (if it still names
    this owner), in ``tx``. Returns how many followers were satisfied."""
    row = await _locked_claim(tx, cid)
    if row is not None and row["owner_id"] == owner_id and row["status"] == "owned":
        await move_claim(tx, row, "satisfied", "dedup_claim.satisfied.owner_delivered",
                             f"owner {owner_id} delivered", {})
    followers = await _followers(tx, owner_id)
    commands = [_follower_command(f, "deduplicated", "notification.deduplicated.owner_delivered",
                                  f"owner {owner_id} delivered", {})
                for f in followers]
    outcomes = await apply_many(tx, commands, seen=_seen(followers))
    if not all(o.applied for o in outcomes):
        raise OwnershipRace(f"a follower of {owner_id} changed under its row lock")
    return len(followers)


@dataclass(frozen=True)
class FailurePlan:
    """What an owner's failure does to its obligation, read under lock before the owner's own
    transition (which records ``successor`` as ``dedup_successor_id``); :func:`apply_failure` writes it."""

    owner_id: str
    claim: dict[str, Any] | None
    followers: list[dict[str, Any]]
    action: Literal["join", "satisfy", "elect", "release", "none"]
    successor: str | None


async def plan_failure(tx: Book, *, owner_id: str, cid: str, now: float) -> FailurePlan:
    """Read (and lock) the claim and the owner's followers, and decide. The oldest follower is elected
    successor — unless the claim names another owner (a newer one took it): then the followers join
    that owner while it is live, are satisfied inside its delivered window, and otherwise elect among
    themselves. Without followers, a claim that still names this owner is released."""
    row = await _locked_claim(tx, cid)
    followers = await _followers(tx, owner_id)
    current = row is not None and row["owner_id"] == owner_id
    if row is not None and not current and row["owner_id"] is not None:
        if row["status"] == "owned":
            return FailurePlan(owner_id, row, followers, "join" if followers else "none", None)
        if row["status"] == "satisfied" and now < row["window_until"]:
            return FailurePlan(owner_id, row, followers, "satisfy" if followers else "none", None)
    if not followers:
        action: Literal["release", "none"] = (
            "release" if current and row is not None and row["status"] == "owned" else "none")
        return FailurePlan(owner_id, row, followers, action, None)
    return FailurePlan(owner_id, row, followers, "elect", followers[0]["id"])


async def apply_failure(tx: Book, plan: FailurePlan, *, now: float) -> None:
    """Write what :func:`plan_failure` decided, in the transaction that failed the owner."""
    row, followers, owner_id = plan.claim, plan.followers, plan.owner_id
    if plan.action == "join":
        assert row is not None
        await _relink(tx, followers, row["owner_id"], row["generation"])
    elif plan.action == "satisfy":
        assert row is not None
        commands = [_follower_command(f, "deduplicated", "notification.deduplicated.owner_delivered",
                                      f"owner {row['owner_id']} delivered", {}) for f in followers]
        await apply_many(tx, commands, seen=_seen(followers))
    elif plan.action == "release":
        assert row is not None
        await move_claim(tx, row, "released", "dedup_claim.released.owner_failed",
                             f"owner {owner_id} failed; no follower to succeed it", {})
    elif plan.action == "elect":
        successor, rest = followers[0], followers[1:]
        generation = (row["generation"] if row is not None else successor["generation"]) + 1
        promoted = _follower_command(successor, "pending", "notification.pending.promoted",
                                     f"elected successor of failed owner {owner_id} (generation {generation})",
                                     {"obligation_owner_id": None, "generation": generation, "next_attempt_at": now})
        [outcome] = await apply_many(tx, [promoted], seen=_seen([successor]))
        if not outcome.applied:
            raise OwnershipRace(f"successor {successor['id']} changed under its row lock")
        await _relink(tx, rest, successor["id"], generation)
        if row is not None:
            # The promotion keeps the window: it is the same obligation, not a new one.
            await move_claim(tx, row, "owned", "dedup_claim.owned.succeeded",
                                 f"owner {owner_id} failed; {successor['id']} succeeds it (generation {generation})",
                                 {"owner_id": successor["id"], "generation": generation})


async def _relink(tx: Book, followers: list[dict[str, Any]], owner_id: str, generation: int) -> None:
    commands = [_follower_command(f, "pending", "notification.pending.relinked",
                                  f"now follows {owner_id} (generation {generation})",
                                  {"obligation_owner_id": owner_id, "generation": generation})
                for f in followers]
    outcomes = await apply_many(tx, commands, seen=_seen(followers))
    if not all(o.applied for o in outcomes):
        raise OwnershipRace(f"a follower changed under its row lock while moving to {owner_id}")
