"""What the record says about a notification's cycle when a claim takes it (specs/notifications.md N5, N10, N10a, N10b).

A worker can stop anywhere: after a send was admitted and before its result was written, or after a
result was written and before the notification was finalized. The next claim reads the channel
observations of the notification's current cycle — in its own transaction, before it writes — and:

- closes what the lapsed claim left ``started`` as ``unknown`` (the send was admitted, its effect may
  have happened), keeping what the record holds: the admission and the provider retries the lease's
  guards recorded before each further effect;
- finds a *qualifying* success recorded under the lapsed claim (a persistent channel for GUARANTEED,
  any selected channel for BEST_EFFORT): the notification is then settled ``delivered`` from it, not
  sent again (:data:`SETTLED_REASON`);
- otherwise says whether an earlier send of this cycle may have reached the person (an ``unknown`` or a
  ``success`` that settled nothing): every observation of the next attempt then carries
  ``duplicate_risk``. The risk is read from the record, so it belongs to the cycle, however many claims
  died in a row.

A close that meets a result written between the read and the close (the worker was slow, not dead)
reads that observation again and takes the result for what it is: a qualifying success still settles.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, Reason, apply_many

from .channels import EPHEMERAL, Mode
from .policy import RESULT_REASONS
from .schema import channel_attempts

if TYPE_CHECKING:
    from .attempts import Candidate

EVIDENCE_ACTOR = Actor("system", "notification_delivery")
SETTLED_REASON = "notification.delivered.recorded_success"
"""The reason of a notification settled from the success its stopped worker recorded (N10a)."""
MAY_HAVE_REACHED = ("started", "unknown", "success")
"""Observation statuses whose send may have reached the person."""
_CHUNK = 500


@dataclass(frozen=True)
class Record:
    """What a candidate's cycle holds on record: the channel of a qualifying success under the lapsed
    claim (settle from it), and whether the next attempt may repeat an effect."""

    success: str | None = None
    duplicate_risk: bool = False


NOTHING = Record()


def needs_reading(c: Candidate) -> bool:
    """Only a lapsed claim, or a cycle that already made an attempt, can have anything on record."""
    return c.claim_id is not None or c.cycle_attempts > 0


async def _read(tx: Book, wanted: dict[str, Candidate], conditions: list[Any]) -> list[Any]:
    """The observations of the wanted candidates' current cycles that may have reached the person, one
    query per condition."""
    t = channel_attempts
    columns = (t.c.id, t.c.notification_id, t.c.claim_id, t.c.cycle, t.c.channel, t.c.position, t.c.status)
    rows = []
    async with tx.read() as conn:
        for condition in conditions:
            query = sa.select(*columns).where(condition, t.c.status.in_(MAY_HAVE_REACHED))
            rows += [r for r in await conn.execute(query) if r.cycle == wanted[r.notification_id].cycle]
    return rows


def _qualifies(c: Candidate, channel: str) -> bool:
    return c.mode != Mode.GUARANTEED.value or channel not in EPHEMERAL


async def read_records(tx: Book, candidates: Iterable[Candidate], *, now: float) -> dict[str, Record]:
    """The record of each candidate's current cycle (ONE read per 500 candidates, ONE engine call for the
    closes, a second read only of observations whose close met a result), in ``tx``'s transaction;
    candidates with nothing on record are left out."""
    wanted = {c.id: c for c in candidates if needs_reading(c)}
    if not wanted:
        return {}
    t, ids = channel_attempts, sorted(wanted)
    rows = await _read(tx, wanted, [t.c.notification_id.in_(ids[i : i + _CHUNK]) for i in range(0, len(ids), _CHUNK)])
    lapsed = [r for r in rows if r.status == "started" and r.claim_id == wanted[r.notification_id].claim_id]
    reason = Reason(RESULT_REASONS["unknown"], "the worker holding the lease stopped before recording a result")
    patch = {"detail": "the lease lapsed after the send was admitted; no result was recorded", "ended_at": now}
    # provider_retries stays as the record holds it: the guards wrote each retry before its effect (N10b).
    closes = await apply_many(tx, [Command("channel_attempt", r.id, "unknown", reason, EVIDENCE_ACTOR, ("started",),
                                           {}, patch) for r in lapsed])
    moved = {r.id for r, o in zip(lapsed, closes, strict=True) if not o.applied}
    if moved:
        # A result was written between the read and the close (its worker was slow, not dead): read it
        # again, so that a success written just now still settles the notification.
        again = await _read(tx, wanted, [t.c.id.in_(sorted(moved))])
        rows = [r for r in rows if r.id not in moved] + again
    by_notification: dict[str, list[Any]] = {}
    for r in rows:
        by_notification.setdefault(r.notification_id, []).append(r)
    found: dict[str, Record] = {}
    for nid, mine in by_notification.items():
        c = wanted[nid]
        wins = sorted((r.position, r.channel) for r in mine
                      if r.status == "success" and r.claim_id == c.claim_id and _qualifies(c, r.channel))
        found[nid] = Record(success=wins[0][1]) if wins else Record(duplicate_risk=True)
    return found
