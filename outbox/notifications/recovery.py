"""Recovering failed notifications: the dead-letter view, replay and resolve (specs/notifications.md N25-N29).

A replay is recovery of an unsatisfied obligation, not a force-send: it keeps the notification's id,
cumulative attempts and history, starts a new delivery cycle with a fresh budget, and is refused —
with the blocker and a reason code as data — whenever someone else holds the obligation. A resolve is
an operator's audited decision that a dead letter needs nothing more. Nothing here clears a dead
letter by reading it.

Replay refusal reasons (:data:`BLOCK_REASONS`):

- ``not_failed`` — only a ``failed`` notification can be replayed;
- ``resolved`` — an operator resolved it (a deliberate new notification takes a new idempotency key);
- ``covered_by_replay`` — a replay of an earlier owner took its obligation over (``replayed_in``);
- ``successor_pending`` / ``successor_delivered`` — its successor (``dedup_successor_id``, followed
  down the chain) holds or satisfied the obligation;
- ``successor_lineage_unresolved`` — the chain cannot be followed to its end (a link is missing, loops,
  or is in no status that settles it), so nothing proves the obligation is free;
- ``owner_pending`` / ``owner_delivered_in_window`` — another current owner of the obligation is
  pending, or delivered and its suppression window has not passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, EntityNotFound, Reason, apply_many
from statebook.lifecycle.errors import StatebookError
from statebook.lifecycle import inputs
from statebook.lifecycle.inputs import KEY_CHARS, integer, shown, text

from . import ownership
from .errors import checked, refused
from .intake import MAX_LIST, get_notification
from .models import DeadLetter, Notification
from .ownership import DEFAULT_WINDOW_SECONDS
from .policy import OPERATOR
from .schema import dedup_claims, notifications

OPERATOR_ACTOR = Actor(OPERATOR, "api")
BLOCK_REASONS = ("not_failed", "resolved", "covered_by_replay", "successor_pending", "successor_delivered",
                 "successor_lineage_unresolved", "owner_pending", "owner_delivered_in_window")
NOTE_CHARS = 2_000
"""The longest operator note or resolution reason."""
MAX_CHAIN = 10_000
"""A successor chain longer than this is a bug (each link is an elected follower); refused, not walked."""


class RecoveryRefused(StatebookError):
    """A replay or resolve was refused; nothing was written. ``reason`` is a code of
    :data:`BLOCK_REASONS` (or ``not_dead_letter`` for a resolve), ``blocked_by`` the notification that
    holds the obligation, when one does."""

    def __init__(self, message: str, *, reason: str, blocked_by: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.blocked_by = blocked_by


@dataclass(frozen=True)
class Block:
    """Why a failure cannot be replayed now, as data."""

    reason: str
    blocked_by: str | None


_ROW = sa.select(notifications).where(notifications.c.id == sa.bindparam("b_id", type_=sa.String))


async def _row(book: Book, notification_id: str, *, lock: bool) -> dict[str, Any] | None:
    store = book.store
    async with store.reader(book.conn) as unit:
        rows = await store.select(unit, _ROW, {"b_id": notification_id}, lock="wait" if lock else None)
    return rows[0] if rows else None


async def replay_block(book: Book, row: dict[str, Any], *, now: float,
                       claim: dict[str, Any] | None = None) -> Block | None:
    """Why ``row`` cannot be replayed now, or None (read in ``book``'s transaction when bound)."""
    if row["status"] != "failed":
        return Block("not_failed", None)
    if row["resolved_at"] is not None:
        return Block("resolved", None)
    if row["replayed_in"] is not None:
        return Block("covered_by_replay", row["replayed_in"])
    link, seen = row["dedup_successor_id"], {row["id"]}
    while link is not None:
        if link in seen or len(seen) > MAX_CHAIN:
            return Block("successor_lineage_unresolved", link)
        seen.add(link)
        successor = await _row(book, link, lock=False)
        if successor is None:  # the chain cannot be followed (its record was removed): nothing proves it settled
            return Block("successor_lineage_unresolved", link)
        if successor["status"] in ("pending", "rate_limited"):
            return Block("successor_pending", link)
        if successor["status"] == "delivered":
            return Block("successor_delivered", link)
        if successor["status"] != "failed":
            return Block("successor_lineage_unresolved", link)
        link = successor["dedup_successor_id"]  # a failure: the replay will take it over
    if row["dedup_claim_id"] is not None:
        if claim is None:
            async with book.read() as conn:
                found = (await conn.execute(sa.select(dedup_claims).where(
                    dedup_claims.c.id == row["dedup_claim_id"]))).first()
            claim = None if found is None else dict(found._mapping)
        if claim is not None and claim["owner_id"] not in (None, row["id"]):
            holder = await _row(book, claim["owner_id"], lock=False)
            if claim["status"] == "owned" and holder is not None and holder["status"] in ("pending", "rate_limited"):
                return Block("owner_pending", claim["owner_id"])
            if claim["status"] == "satisfied" and now < claim["window_until"]:
                return Block("owner_delivered_in_window", claim["owner_id"])
    return None


def _id(value: Any) -> str:
    return checked(text, "notification_id", value, max_chars=KEY_CHARS, empty=False)


def _actor(value: Any) -> Actor:
    if not isinstance(value, Actor) or value.type != OPERATOR:
        raise refused("actor", "type", f"recovery is an operator's: expected Actor('{OPERATOR}', ...), got {shown(value)}")
    return value


@dataclass(frozen=True)
class Replayed:
    """A replay that applied: the notification (same id), its new cycle, and the failed descendants
    its cycle took over."""

    id: str
    cycle: int
    covered: tuple[str, ...]


async def replay_notification(book: Book, notification_id: str, *, actor: Actor = OPERATOR_ACTOR,
                              note: str | None = None) -> Replayed:
    """Replay a failure (N25-N28): in ONE transaction, the notification is ``pending`` again in a new
    cycle with a fresh budget (id, cumulative attempts and history kept), owns its obligation with a
    higher generation and a new window, and its failed unresolved descendants (down the successor
    chain) are covered by it (``replayed_in``, out of the dead-letter view, never replayable again). Refused with :class:`RecoveryRefused` — the reason
    and the blocker as data, nothing written — when :func:`replay_block` finds a blocker."""
    checked(inputs.book, "book", book)
    nid, actor = _id(notification_id), _actor(actor)
    if note is not None:
        checked(text, "note", note, max_chars=NOTE_CHARS)
    async with book.begin() as tx:
        now = tx.clock.now()
        first = await _row(tx, nid, lock=False)
        if first is None:
            raise EntityNotFound(f"notification {nid} does not exist")
        claim_row = None
        if first["dedup_claim_id"] is not None:  # the claim's lock first, as every ownership change takes it
            claim_row = await ownership.lock(tx, first["dedup_claim_id"])
        row = await _row(tx, nid, lock=True)
        assert row is not None
        block = await replay_block(tx, row, now=now, claim=claim_row)
        if block is not None:
            raise RecoveryRefused(
                f"notification {nid} cannot be replayed: {block.reason}"
                + (f" ({block.blocked_by})" if block.blocked_by else ""), reason=block.reason, blocked_by=block.blocked_by)
        cycle = row["cycle"] + 1
        generation = row["generation"]
        if claim_row is not None:
            generation = claim_row["generation"] + 1
            window = row["dedup_window"] if row["dedup_window"] is not None else DEFAULT_WINDOW_SECONDS
            moved = await ownership.move_claim(
                tx, claim_row, "owned", "dedup_claim.owned.replayed",
                f"replay of {nid} takes the obligation (generation {generation})",
                {"owner_id": nid, "generation": generation, "window_until": now + window})
            if not moved:
                raise ownership.OwnershipRace(f"dedup claim {claim_row['id']} changed under its row lock")
        summary = f"replayed by {actor.id or actor.type}: cycle {cycle}" + (f" ({note})" if note else "")
        command = Command("notification", nid, "pending", Reason("notification.pending.replayed", summary[:NOTE_CHARS]),
                          actor, ("failed",), {"cycle": row["cycle"], "resolved_at": None, "replayed_in": None},
                          {"cycle": cycle, "cycle_attempts": 0, "dead_letter": 0, "next_attempt_at": now,
                           "claim_id": None, "lease_until": None, "obligation_owner_id": None,
                           "generation": generation})
        [outcome] = await apply_many(tx, [command], seen={nid: row})
        if not outcome.applied:
            raise RecoveryRefused(f"notification {nid} changed while it was being replayed; read it and retry",
                                  reason="not_failed")
        covered = await _cover_descendants(tx, row, nid, cycle, actor)
    return Replayed(nid, cycle, covered)


async def _cover_descendants(tx: Book, row: dict[str, Any], nid: str, cycle: int, actor: Actor) -> tuple[str, ...]:
    """The failed, unresolved notifications down the successor chain move to the replayed cycle."""
    chain: list[dict[str, Any]] = []
    link = row["dedup_successor_id"]
    while link is not None and len(chain) < MAX_CHAIN:
        successor = await _row(tx, link, lock=True)
        if successor is None:
            break
        chain.append(successor)
        link = successor["dedup_successor_id"]
    todo = [s for s in chain if s["status"] == "failed" and s["resolved_at"] is None and s["replayed_in"] is None]
    commands = [Command("notification", s["id"], "failed",
                        Reason("notification.failed.replay_covered", f"taken over by the replay of {nid} (cycle {cycle})"),
                        actor, ("failed",), {"replayed_in": None}, {"dead_letter": 0, "replayed_in": nid})
                for s in todo]
    outcomes = await apply_many(tx, commands, seen={s["id"]: s for s in todo})
    return tuple(s["id"] for s, o in zip(todo, outcomes, strict=True) if o.applied)


async def resolve_notification(book: Book, notification_id: str, *, reason: str,
                               actor: Actor = OPERATOR_ACTOR) -> Notification:
    """An operator resolves a dead letter (N29): ``failed`` stays ``failed``, ``dead_letter`` cleared,
    with the actor, the time and the reason recorded (an audited fact). Refused — nothing written —
    for anything but an unresolved dead letter. Returns the notification as it is now."""
    checked(inputs.book, "book", book)
    nid, actor = _id(notification_id), _actor(actor)
    checked(text, "reason", reason, max_chars=NOTE_CHARS, empty=False)
    if not reason.strip():
        raise refused("reason", "empty", "say why the failure needs nothing more")
    async with book.begin() as tx:
        row = await _row(tx, nid, lock=True)
        if row is None:
            raise EntityNotFound(f"notification {nid} does not exist")
        if row["status"] != "failed" or not row["dead_letter"] or row["resolved_at"] is not None:
            raise RecoveryRefused(f"notification {nid} is not an unresolved dead letter (status {row['status']}, "
                                  f"dead_letter {bool(row['dead_letter'])})", reason="not_dead_letter")
        now = tx.clock.now()
        by = f"{actor.type}:{actor.id}" if actor.id else actor.type
        command = Command("notification", nid, "failed", Reason("notification.failed.resolved", reason[:NOTE_CHARS]),
                          actor, ("failed",), {"resolved_at": None, "dead_letter": 1},
                          {"dead_letter": 0, "resolved_at": now, "resolved_by": by, "resolution": reason})
        [outcome] = await apply_many(tx, [command], seen={nid: row})
        if not outcome.applied:
            raise RecoveryRefused(f"notification {nid} changed while it was being resolved; read it and retry",
                                  reason="not_dead_letter")
    after = await get_notification(book, nid)
    assert after is not None
    return after


_DEAD = (sa.select(notifications)
         .where(notifications.c.status == "failed", notifications.c.dead_letter == 1)
         .order_by(notifications.c.updated_at, notifications.c.id))


async def list_dead_letters(book: Book, *, limit: int = 100) -> list[DeadLetter]:
    """The durable dead-letter view (N26): failed notifications with ``dead_letter`` set, oldest first,
    each with ``replay_blocked_by`` and ``replay_block_reason`` (None when a replay would be accepted
    now). Reading changes nothing."""
    checked(inputs.book, "book", book)
    checked(integer, "limit", limit, low=1, high=MAX_LIST)
    async with book.read() as conn:
        rows = [dict(r._mapping) for r in await conn.execute(_DEAD.limit(limit))]
    now = book.clock.now()
    out = []
    for row in rows:
        block = await replay_block(book, row, now=now)
        out.append(DeadLetter.answered(row, None).model_copy(update={
            "replay_blocked_by": None if block is None else block.blocked_by,
            "replay_block_reason": None if block is None else block.reason}))
    return out
