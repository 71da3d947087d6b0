"""Accepting notifications and reading them back (specs/notifications.md N1, N9).

>>> accepted = await send_notification(book, recipient="oncall-team", content={"text": "disk full"},
...                                    mode="guaranteed", channels=["email", "slack"])  # doctest: +SKIP
>>> accepted.channels  # the order an attempt runs them  # doctest: +SKIP
('slack', 'email')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Reason, create
from statebook.lifecycle.codec import new_id
from statebook.lifecycle.inputs import KEY_CHARS, integer, json_value, text

from .channels import CHANNEL_NAMES, EPHEMERAL, PERSISTENT_ORDER, Mode, run_order
from .errors import checked, refused
from .schema import channel_attempts, notifications

INTAKE_ACTOR = Actor("system", "send_notification")
CYCLE_ATTEMPTS = 3
"""Attempts per GUARANTEED delivery cycle before it is dead-lettered (the seed's default)."""
MAX_LIST = 100_000



@dataclass(frozen=True)
class Accepted:
    """What an intake returns: the notification's id, its status, whether this call created it, and
    the mode and channels (in run order) it was accepted with."""

    id: str
    status: str
    created: bool
    mode: str
    channels: tuple[str, ...]




def _book(value: Any) -> Book:
    if not isinstance(value, Book):
        raise refused("book", "type", f"expected a statebook Book, got {type(value).__name__}")
    return value


def check_mode(value: Any) -> Mode:
    """``guaranteed`` or ``best_effort`` (a :class:`Mode` or its name, any case)."""
    if isinstance(value, Mode):
        return value
    if isinstance(value, str):
        for mode in Mode:
            if value.lower() == mode.value:
                return mode
    raise refused("mode", "type", f"expected 'guaranteed' or 'best_effort', got {value!r:.60}")


def check_channels(value: Any, mode: Mode) -> tuple[str, ...]:
    """The selected channels in run order; refuses an unknown or repeated name, and a GUARANTEED
    selection without a persistent channel (N1)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise refused("channels", "type", f"expected a list of channel names, got {type(value).__name__}")
    if not value:
        raise refused("channels", "empty", "select at least one channel")
    names: list[str] = []
    for item in value:
        checked(text, "channels", item, max_chars=KEY_CHARS)
        if item not in CHANNEL_NAMES:
            raise refused("channels", "channel", f"unknown channel {item!r:.60}; channels are {', '.join(CHANNEL_NAMES)}")
        if item in names:
            raise refused("channels", "channel", f"{item!r} is selected twice")
        names.append(item)
    if mode is Mode.GUARANTEED and not any(n in PERSISTENT_ORDER for n in names):
        raise refused(
            "mode", "mode",
            f"a GUARANTEED notification needs a persistent channel ({', '.join(PERSISTENT_ORDER)}); "
            f"{' and '.join(n for n in names if n in EPHEMERAL)} alone never satisfies it: pass "
            "mode='best_effort' to send through it anyway",
        )
    return tuple(run_order(names))


async def send_notification(
    book: Book,
    *,
    recipient: str,
    content: Mapping[str, Any],
    mode: Mode | str,
    channels: Sequence[str],
) -> Accepted:
    """Accept a notification: ONE creation through the engine (row and fact), ``pending`` and due now.

    Runs in the book's transaction when the book is bound (a transactional outbox), else in its own.
    Every argument is checked before anything is written (:class:`NotificationInvalid`).
    """
    book = _book(book)
    checked(text, "recipient", recipient, max_chars=KEY_CHARS, empty=False)
    if not recipient.strip():
        raise refused("recipient", "empty", "must not be blank")
    if not isinstance(content, Mapping):
        raise refused("content", "type", f"must be a JSON object (a dict), got {type(content).__name__}")
    checked(json_value, "content", dict(content), book.limits)
    chosen = check_mode(mode)
    order = check_channels(channels, chosen)
    now = book.clock.now()
    values = {
        "id": new_id(), "recipient": recipient, "content": dict(content), "mode": chosen.value,
        "channels": list(order), "cycle": 1, "attempts": 0, "cycle_attempts": 0,
        "max_cycle_attempts": CYCLE_ATTEMPTS, "dead_letter": 0, "next_attempt_at": now, "claim_id": None,
        "lease_until": None, "delivered_channel": None, "last_error": None, "created_at": now,
    }
    reason = Reason("notification.pending.accepted", f"accepted {chosen.value} via {', '.join(order)}")
    outcome = await create(book, "notification", values=values, status="pending", reason=reason,
                           actor=INTAKE_ACTOR, fresh_id=True)
    return Accepted(values["id"], "pending", outcome.applied, chosen.value, order)


def _id(argument: str, value: Any) -> str:
    return checked(text, argument, value, max_chars=KEY_CHARS, empty=False)


async def get_notification(book: Book, notification_id: str) -> dict[str, Any] | None:
    """The notification's row as a dict, or None."""
    book = _book(book)
    _id("notification_id", notification_id)
    t = notifications
    async with book.read() as conn:
        row = (await conn.execute(sa.select(t).where(t.c.id == notification_id))).first()
    return None if row is None else _decoded(row)


async def list_notifications(
    book: Book, *, status: str | None = None, dead_letter: bool | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Newest first (created_at, then id), optionally one status and/or only dead letters."""
    book = _book(book)
    if status is not None:
        checked(text, "status", status, max_chars=KEY_CHARS)
        declared = book.policy("notification").statuses
        if status not in declared:
            raise refused("status", "status", f"unknown status {status!r:.60}; statuses are {', '.join(declared)}")
    if dead_letter is not None and not isinstance(dead_letter, bool):
        raise refused("dead_letter", "type", f"expected true, false or None, got {type(dead_letter).__name__}")
    checked(integer, "limit", limit, low=1, high=MAX_LIST)
    t = notifications
    query = sa.select(t).order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
    if status is not None:
        query = query.where(t.c.status == status)
    if dead_letter is not None:
        query = query.where(t.c.dead_letter == (1 if dead_letter else 0))
    async with book.read() as conn:
        rows = (await conn.execute(query)).fetchall()
    return [_decoded(r) for r in rows]


async def notification_attempts(book: Book, notification_id: str) -> list[dict[str, Any]]:
    """The notification's channel observations, cycle by cycle, in the order they were made."""
    book = _book(book)
    _id("notification_id", notification_id)
    t = channel_attempts
    query = (sa.select(t).where(t.c.notification_id == notification_id)
             .order_by(t.c.cycle, t.c.attempt, t.c.position, t.c.made_at, t.c.id))
    async with book.read() as conn:
        rows = (await conn.execute(query)).fetchall()
    return [dict(r._mapping) | {"duplicate_risk": bool(r.duplicate_risk)} for r in rows]


def _decoded(row: Any) -> dict[str, Any]:
    out = dict(row._mapping)
    out["dead_letter"] = bool(out["dead_letter"])
    return out
