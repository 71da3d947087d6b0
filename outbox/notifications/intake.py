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
from statebook.lifecycle.codec import digest, dumps, new_id
from statebook.lifecycle.errors import IdempotencyMismatch
from statebook.lifecycle import inputs
from statebook.lifecycle.inputs import KEY_CHARS, integer, json_value, number, shown, text

from . import ownership
from .channels import CHANNEL_NAMES, EPHEMERAL, PERSISTENT_ORDER, Mode, run_order
from .errors import checked, refused
from .models import ChannelAttempt, Notification
from .responses import check_timeout
from .schema import channel_attempts, notification_responses, notifications

INTAKE_ACTOR = Actor("system", "send_notification")
CYCLE_ATTEMPTS = 3
"""Attempts per GUARANTEED delivery cycle before it is dead-lettered (the seed's default)."""
MAX_LIST = 100_000



MAX_WINDOW_SECONDS = 366 * 86_400.0


@dataclass(frozen=True)
class Accepted:
    """What an intake returns: the notification's id, its status, whether this call created it, the
    mode and channels (in run order) it was accepted with, and its obligation: the canonical owner
    (itself when it owns it or has no obligation key) and that owner's response as a read of the same row
    gives it (``effective_ack_status``, ``ack_inherited``: N24, N34)."""

    id: str
    status: str
    created: bool
    mode: str
    channels: tuple[str, ...]
    obligation_owner_id: str | None = None
    effective_ack_status: str | None = None
    ack_inherited: bool = False




def _book(value: Any) -> Book:
    checked(inputs.book, "book", value)
    book: Book = value
    return book


def check_mode(value: Any) -> Mode:
    """``guaranteed`` or ``best_effort`` (a :class:`Mode` or its name, any case)."""
    if isinstance(value, Mode):
        return value
    if isinstance(value, str):
        for mode in Mode:
            if value.lower() == mode.value:
                return mode
    raise refused("mode", "type", f"expected 'guaranteed' or 'best_effort', got {shown(value)}")


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
            raise refused("channels", "channel", f"unknown channel {shown(item)}; channels are {', '.join(CHANNEL_NAMES)}")
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
    principal: str = "",
    source: str = "",
    idempotency_key: str | None = None,
    obligation_key: str | None = None,
    obligation_window: float | None = None,
    response_timeout: float | None = None,
    timeout_callback: str | None = None,
) -> Accepted:
    """Accept a notification: ONE creation through the engine (row and fact), ``pending`` and due now.

    Runs in the book's transaction when the book is bound (a transactional outbox), else in its own.
    Every argument is checked before anything is written (:class:`NotificationInvalid`).

    ``idempotency_key`` scopes the intake to (``principal``, ``source``, key), bound to a hash of the
    request's content: the same key with the same content returns the original acceptance (nothing
    written); with other content it raises :class:`IdempotencyMismatch` (nothing written).
    ``obligation_key`` counts the notification under the semantic obligation (recipient, key, mode) for
    ``obligation_window`` seconds (default 300): it becomes the obligation's owner, a follower of a live
    owner, or ``deduplicated`` at once inside a delivered owner's window (:mod:`.ownership`).
    ``response_timeout`` (seconds) makes the first delivery start a response a human answers
    (:mod:`.responses`); ``timeout_callback`` names the registered host callback its timeout invokes.
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
    checked(text, "principal", principal, max_chars=KEY_CHARS)
    checked(text, "source", source, max_chars=KEY_CHARS)
    if idempotency_key is not None:
        checked(text, "idempotency_key", idempotency_key, max_chars=KEY_CHARS, empty=False)
    window: float | None = None
    if obligation_key is not None:
        checked(text, "obligation_key", obligation_key, max_chars=KEY_CHARS, empty=False)
        window = ownership.DEFAULT_WINDOW_SECONDS if obligation_window is None else checked(
            number, "obligation_window", obligation_window, low=0.0, high=MAX_WINDOW_SECONDS)
    elif obligation_window is not None:
        raise refused("obligation_window", "needs", "an obligation window needs an obligation_key")
    timeout = check_timeout(response_timeout)
    if timeout_callback is not None:
        checked(text, "timeout_callback", timeout_callback, max_chars=KEY_CHARS, empty=False)
        if timeout is None:
            raise refused("timeout_callback", "needs", "a timeout callback needs a response_timeout")
    now = book.clock.now()
    request = {"recipient": recipient, "content": dict(content), "mode": chosen.value, "channels": list(order),
               "dedup_key": obligation_key, "dedup_window": window, "response_timeout": timeout,
               "timeout_callback": timeout_callback}
    values: dict[str, Any] = {
        "id": new_id(), **request, "cycle": 1, "attempts": 0, "cycle_attempts": 0,
        "max_cycle_attempts": CYCLE_ATTEMPTS, "dead_letter": 0, "next_attempt_at": now, "claim_id": None,
        "lease_until": None, "delivered_channel": None, "last_error": None, "created_at": now,
        "principal": principal, "source": source, "idempotency_key": idempotency_key,
        "content_hash": digest("notification", dumps(request)), "dedup_claim_id": None, "obligation_owner_id": None,
        "generation": 0, "dedup_successor_id": None, "resolved_at": None, "resolved_by": None, "resolution": None,
        "replayed_in": None,
    }
    if idempotency_key is None and obligation_key is None:
        reason = Reason("notification.pending.accepted", f"accepted {chosen.value} via {', '.join(order)}")
        outcome = await create(book, "notification", values=values, status="pending", reason=reason,
                               actor=INTAKE_ACTOR, fresh_id=True)
        # Its own obligation, just created: no delivery yet, so no response to report (N24).
        return Accepted(values["id"], "pending", outcome.applied, chosen.value, order, values["id"])
    try:
        async with book.begin() as tx:
            return await _keyed_intake(tx, values, now)
    except _LostRace:
        pass
    # Another intake of this key committed first: its acceptance is the one (or a conflict).
    found = await _by_key(book, principal, source, idempotency_key)
    if found is None:
        raise IdempotencyMismatch(f"idempotency_key: the intake of {idempotency_key!r:.60} raced another that "
                                  "did not commit; retry")
    return await _replayed(book, found, values["content_hash"], idempotency_key)


class _LostRace(Exception):
    """The creation hit the idempotency index: roll back what this intake wrote, then read the winner."""


async def _keyed_intake(tx: Book, values: dict[str, Any], now: float) -> Accepted:
    claim: tuple[dict[str, Any] | None, str] | None = None
    key = values["idempotency_key"]
    if values["dedup_key"] is not None:
        # The claim's row lock comes first: intakes of one obligation queue here, so the idempotency
        # read below sees an earlier intake of the same content once it has committed.
        claim = await ownership.locked_claim(tx, recipient=values["recipient"], obligation_key=values["dedup_key"],
                                             mode=values["mode"])
    if key is not None:
        found = await _by_key(tx, values["principal"], values["source"], key)
        if found is not None:
            return await _replayed(tx, found, values["content_hash"], key)
    if claim is not None and claim[0] is None:
        row = await ownership.create_claim(tx, claim[1], recipient=values["recipient"], obligation_key=values["dedup_key"],
                                           mode=values["mode"], owner_id=values["id"], window=values["dedup_window"],
                                           now=now)
        if row is not None and key is not None:  # a racing intake created the claim: perhaps with this key
            found = await _by_key(tx, values["principal"], values["source"], key)
            if found is not None:
                return await _replayed(tx, found, values["content_hash"], key)
        claim = (row, claim[1])
    status, code = "pending", "notification.pending.accepted"
    summary = f"accepted {values['mode']} via {', '.join(values['channels'])}"
    if claim is not None:
        arrival = await ownership.arrival(tx, *claim, notification_id=values["id"], window=values["dedup_window"],
                                          now=now)
        values["dedup_claim_id"], values["generation"] = arrival.dedup_claim_id, arrival.generation
        if arrival.role == "follower":
            values["obligation_owner_id"], values["next_attempt_at"] = arrival.owner_id, None
            code, summary = "notification.pending.following", f"follows owner {arrival.owner_id} (generation {arrival.generation})"
        elif arrival.role == "satisfied":
            values["obligation_owner_id"], values["next_attempt_at"] = arrival.owner_id, None
            status, code = "deduplicated", "notification.deduplicated.window"
            summary = f"owner {arrival.owner_id} delivered inside the suppression window"
        else:
            summary += f"; owns the obligation (generation {arrival.generation})"
    outcome = await create(tx, "notification", values=values, status=status, reason=Reason(code, summary),
                           actor=INTAKE_ACTOR, fresh_id=True, if_absent=values["idempotency_key"] is not None)
    if not outcome.applied:
        raise _LostRace()
    return await _acceptance(tx, values, status, created=True)


async def _acceptance(book: Book, row: Mapping[str, Any], status: str, *, created: bool) -> Accepted:
    """The acceptance of ``row``, with its canonical obligation's response read in ``book`` (the intake's
    transaction): the same fields a read of the row gives (N24)."""
    owner = row["obligation_owner_id"] or row["id"]
    answer = (await _answers(book, [owner])).get(owner)
    return Accepted(row["id"], status, created, row["mode"], tuple(row["channels"]), owner,
                    answer, answer is not None and owner != row["id"])


_BY_KEY = sa.select(notifications).where(
    notifications.c.principal == sa.bindparam("b_principal", type_=sa.Text),
    notifications.c.source == sa.bindparam("b_source", type_=sa.Text),
    notifications.c.idempotency_key == sa.bindparam("b_key", type_=sa.Text),
)


async def _by_key(book: Book, principal: str, source: str, key: str | None) -> dict[str, Any] | None:
    async with book.read() as conn:
        row = (await conn.execute(_BY_KEY, {"b_principal": principal, "b_source": source, "b_key": key})).first()
    return None if row is None else dict(row._mapping)


async def _replayed(book: Book, found: dict[str, Any], content_hash: str, key: str | None) -> Accepted:
    """The original acceptance of an idempotency key as it stands now, or the conflict of other content (N13)."""
    if found["content_hash"] != content_hash:
        raise IdempotencyMismatch(
            f"idempotency_key: {key!r:.60} was accepted as notification {found['id']} with other content; "
            "use a new key for a new notification")
    return await _acceptance(book, found, found["status"], created=False)


def _id(argument: str, value: Any) -> str:
    return checked(text, argument, value, max_chars=KEY_CHARS, empty=False)


async def get_notification(book: Book, notification_id: str) -> Notification | None:
    """The notification, or None."""
    book = _book(book)
    _id("notification_id", notification_id)
    t = notifications
    async with book.read() as conn:
        row = (await conn.execute(sa.select(t).where(t.c.id == notification_id))).first()
    return None if row is None else (await _answered(book, [row]))[0]


async def list_notifications(
    book: Book, *, status: str | None = None, dead_letter: bool | None = None, limit: int = 50,
    response: str | None = None,
) -> list[Notification]:
    """Newest first (created_at, then id), optionally one status, only dead letters, and/or one response
    status (``acked``, ``dismissed``, ...: the answer its obligation got, a follower's through its owner)."""
    book = _book(book)
    for argument, value, lifecycle in (("status", status, "notification"), ("response", response,
                                                                            "notification_response")):
        if value is None:
            continue
        checked(text, argument, value, max_chars=KEY_CHARS)
        declared = book.policy(lifecycle).statuses
        if value not in declared:
            raise refused(argument, "status", f"unknown {'response ' if argument == 'response' else ''}status "
                          f"{shown(value)}; statuses are {', '.join(declared)}")
    checked(inputs.flag, "dead_letter", dead_letter, optional=True)
    checked(integer, "limit", limit, low=1, high=MAX_LIST)
    t = notifications
    query = sa.select(t).order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
    if status is not None:
        query = query.where(t.c.status == status)
    if dead_letter is not None:
        query = query.where(t.c.dead_letter == (1 if dead_letter else 0))
    if response is not None:
        r = notification_responses
        answered = sa.select(r.c.id).where(r.c.status == response)
        query = query.where(sa.func.coalesce(t.c.obligation_owner_id, t.c.id).in_(answered))
    async with book.read() as conn:
        rows = (await conn.execute(query)).fetchall()
    return await _answered(book, rows)


async def _answered(book: Book, rows: Sequence[Any]) -> list[Notification]:
    """Each row as a :class:`Notification` with its canonical obligation's answer (N24, N34): its own response's
    status, or its owner's for a follower (``ack_inherited``)."""
    found = await _answers(book, [r.obligation_owner_id or r.id for r in rows])
    return [Notification.answered(r, found.get(r.obligation_owner_id or r.id)) for r in rows]


async def _answers(book: Book, owners: Sequence[str]) -> dict[str, str]:
    """The response status of each of these canonical obligations that has a response."""
    wanted = sorted(set(owners))
    found: dict[str, str] = {}
    t = notification_responses
    async with book.read() as conn:
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            found.update({r.id: r.status for r in await conn.execute(sa.select(t.c.id, t.c.status).where(t.c.id.in_(chunk)))})
    return found


async def notification_attempts(book: Book, notification_id: str) -> list[ChannelAttempt]:
    """The notification's channel observations, cycle by cycle, in the order they were made."""
    book = _book(book)
    _id("notification_id", notification_id)
    t = channel_attempts
    query = (sa.select(t).where(t.c.notification_id == notification_id)
             .order_by(t.c.cycle, t.c.attempt, t.c.position, t.c.made_at, t.c.id))
    async with book.read() as conn:
        rows = (await conn.execute(query)).fetchall()
    return [ChannelAttempt.from_row(r) for r in rows]
