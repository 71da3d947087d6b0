"""The response lifecycle: acknowledge, dismiss, time out — and the timeout's durable host callback (N31-N39).

A notification accepted with ``response_timeout`` waits for a human once it is delivered. Its
``notification_response`` (same id) is created by the first qualifying delivery, in that delivery's
transaction, with ``due_at = delivered + response_timeout``: an undelivered notification has no response
and never times out. Then exactly one of:

- :func:`ack_notification` / :func:`dismiss_notification` — ``pending -> acked | dismissed`` with the actor
  and the time; the same actor asking again for the same state gets the original answer (no new fact);
  anyone else, another terminal state or a late answer is :class:`ResponseConflict`;
- :func:`expire_responses` — the timeout pass, separate from delivery and callback batches: due responses
  by (due time, id) move to ``timed_out`` and, in the same transaction, each enqueues its callback as a
  dispatch (``kind="notification.timeout"``, route ``callback:<name>``, dedup key ``timeout:<id>``: one
  obligation per timeout). The dispatch outbox then delivers it with bounded attempts, backoff and a dead
  letter; :class:`CallbackTransport` calls the host's ``async def`` registered with
  :func:`register_timeout_callback`. Its failures touch the dispatch only, never the response.

Followers (part 2) have no response of their own: reads give them their owner's (``effective_ack_status``,
``ack_inherited``), and an answer to a follower answers its owner.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, EntityNotFound, Reason, apply_many, create
from statebook.lifecycle.errors import StatebookError
from statebook.lifecycle import inputs
from statebook.lifecycle.inputs import KEY_CHARS, integer, shown, text
from statebook.lifecycle.schema import status_in
from statebook.outbox import TransportResult, dispatch_outbox, enqueue_dispatches
from statebook.outbox.core.claims import read_rows

from .errors import checked, refused
from .channels import FOLLOWS_RESPONSES
from .models import FollowUp, NotificationResponse, TimeoutCallback
from .schema import channel_attempts, notification_responses, notifications

CALLBACK_KIND = "notification.timeout"
CALLBACK_PREFIX = "callback:"
RESPONSE_ACTOR = Actor("system", "notification_response")
CALLBACK_TIMEOUT_SECONDS = 10.0
CALLBACK_ATTEMPTS = 8
"""Attempts of one timeout callback before its dispatch is dead-lettered (the outbox's bound)."""
NOTE_CHARS = 2_000
MAX_TIMEOUT_SECONDS = 366 * 86_400.0

Callback = Callable[[dict[str, Any]], Awaitable[Any]]
_callbacks: dict[str, Callback] = {}


class ResponseConflict(StatebookError):
    """An answer that cannot be recorded: another actor or state was recorded first, the deadline passed,
    or the notification does not (yet) wait for an answer. Nothing was written; ``recorded`` is the
    response as it stands (None when there is none)."""

    def __init__(self, message: str, *, recorded: NotificationResponse | None = None) -> None:
        super().__init__(message)
        self.recorded = recorded


# -- callbacks --------------------------------------------------------------------------------------
def register_timeout_callback(name: str, fn: Callback) -> None:
    """Register the host's ``async def fn(event)`` as timeout callback ``name`` (in this process).

    A plain (blocking) function is refused: callbacks run on the event loop, and a blocking one would
    stall every delivery with it (N38). ``event`` is a dict: ``event_id`` (the timeout's fact id, the
    key a recipient deduplicates by), ``notification_id``, ``due_at``, ``timed_out_at``."""
    checked(text, "name", name, max_chars=KEY_CHARS, empty=False)
    target = getattr(fn, "__call__", None) if not inspect.isfunction(fn) and not inspect.ismethod(fn) else fn
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(target)):
        raise refused("fn", "type", f"a timeout callback must be an async def (a coroutine function), got {shown(fn)}: "
                                    "a blocking callable would stall the event loop")
    _callbacks[name] = fn


def unregister_timeout_callback(name: str) -> None:
    """Forget callback ``name`` (tests, reloads)."""
    _callbacks.pop(name, None)


class CallbackTransport:
    """The dispatch transport of routes ``callback:<name>``: calls the registered callback in process.

    Success is the callback returning; an exception, a missing registration or running past ``timeout``
    is a failed attempt (the outbox retries it with backoff, then dead-letters it)."""

    def __init__(self, timeout: float = CALLBACK_TIMEOUT_SECONDS) -> None:
        self.timeout = timeout

    async def send(self, deliver_to: str, payload: str) -> TransportResult:
        """Run the host callback named by ``deliver_to`` with the response event in ``payload``; a missing callback,
        bad payload or raising callback is a failed result.
        """
        name = deliver_to.removeprefix(CALLBACK_PREFIX)
        fn = _callbacks.get(name)
        if fn is None:
            return TransportResult.failed(f"no timeout callback is registered as {name!r}")
        try:
            envelope = json.loads(payload)
            event = dict(envelope.get("body") or {})
        except (ValueError, AttributeError) as exc:
            return TransportResult.failed(f"the callback's payload is not a dispatch envelope: {exc}")
        try:
            async with asyncio.timeout(self.timeout):
                await fn(event)
        except TimeoutError:
            return TransportResult.failed(f"the callback ran longer than {self.timeout:g}s", timed_out=True)
        except Exception as exc:  # noqa: BLE001 - host code: any failure is this attempt's
            return TransportResult.failed(f"{type(exc).__name__}: {exc}")
        return TransportResult(True, None, {"callback": name})


# -- the response's start ---------------------------------------------------------------------------
async def start_response(tx: Book, notification_id: str, *, timeout: float, callback: str | None, now: float) -> bool:
    """Create the response at the notification's first qualifying delivery (in that delivery's
    transaction); False when it already has one (a replayed notification delivering again)."""
    values = {"id": notification_id, "started_at": now, "due_at": now + timeout, "timeout_callback": callback,
              "responder": None, "responded_at": None, "note": None}
    made = await create(tx, "notification_response", values=values, status="pending", actor=RESPONSE_ACTOR,
                        reason=Reason("notification_response.pending.delivered",
                                      f"delivered; a response is due within {timeout:g}s"), if_absent=True)
    return made.applied


# -- answers ----------------------------------------------------------------------------------------
_RESPONSE = sa.select(notification_responses).where(notification_responses.c.id == sa.bindparam("b_id", type_=sa.String))
_OWNER = sa.select(notifications.c.id, notifications.c.obligation_owner_id, notifications.c.response_timeout).where(
    notifications.c.id == sa.bindparam("b_id", type_=sa.String))


async def _one(book: Book, query: sa.Select[Any], key: str, *, lock: bool) -> dict[str, Any] | None:
    store = book.store
    async with store.reader(book.conn) as unit:
        rows = await store.select(unit, query, {"b_id": key}, lock="wait" if lock else None)
    return rows[0] if rows else None


def _who(actor: Actor) -> str:
    return f"{actor.type}:{actor.id}" if actor.id else actor.type


async def canonical(book: Book, notification_id: str) -> str:
    """The notification whose response answers for ``notification_id``: its owner for a follower."""
    row = await _one(book, _OWNER, notification_id, lock=False)
    if row is None:
        raise EntityNotFound(f"notification {notification_id} does not exist")
    owner: str = row["obligation_owner_id"] or row["id"]
    return owner


async def _respond(book: Book, notification_id: Any, target: str, actor: Any, note: Any) -> NotificationResponse:
    checked(inputs.book, "book", book)
    nid = checked(text, "notification_id", notification_id, max_chars=KEY_CHARS, empty=False)
    checked(inputs.actor, "actor", actor)
    if note is not None:
        checked(text, "note", note, max_chars=NOTE_CHARS)
    async with book.begin() as tx:
        rid = await canonical(tx, nid)
        row = await _one(tx, _RESPONSE, rid, lock=True)
        if row is None:
            raise ResponseConflict(f"notification {nid} is not waiting for a response (it expects none, or it has "
                                   "not been delivered yet)")
        who, now = _who(actor), tx.clock.now()
        if row["status"] != "pending":
            if row["status"] == target and row["responder"] == who:
                return public(row)  # the same answer again: the original result, nothing written
            raise ResponseConflict(f"notification {nid}: the response is already {row['status']}"
                                   + (f" by {row['responder']}" if row["responder"] else ""), recorded=public(row))
        if now >= row["due_at"]:
            raise ResponseConflict(f"notification {nid}: the response was due at {row['due_at']}; the timeout pass "
                                   "records it as timed out", recorded=public(row))
        reason = Reason(f"notification_response.{target}.responder", f"{target} by {who}" + (f": {note}" if note else ""))
        command = Command("notification_response", rid, target, reason, actor, ("pending",), {},
                          {"responder": who, "responded_at": now, "note": note})
        [outcome] = await apply_many(tx, [command], seen={rid: row})
        if not outcome.applied:
            raise ResponseConflict(f"notification {nid}: the response changed meanwhile; read it again")
        await _follow(tx, rid, target, who)
        after = await _one(tx, _RESPONSE, rid, lock=False)
    assert after is not None
    return public(after)


FOLLOW_KIND = "notification.follow"
FOLLOW_PREFIX = "follow:"
FOLLOW_ACTIONS = {"acked": "acknowledge", "dismissed": "resolve"}
"""What a provider that keeps its own incident (:data:`~.channels.FOLLOWS_RESPONSES`) is told when the
human answers: an acknowledgement acknowledges the incident, a dismissal resolves it. A timeout tells it
nothing — the incident stays open, which is what the provider's own escalation is for."""

_ADMITTED = sa.select(channel_attempts.c.channel).where(
    channel_attempts.c.notification_id == sa.bindparam("b_id", type_=sa.String),
    channel_attempts.c.channel.in_(FOLLOWS_RESPONSES), channel_attempts.c.started_at.is_not(None)).distinct()


async def _follow(tx: Book, rid: str, target: str, who: str) -> None:
    """In the answer's transaction: one dispatch per provider that was sent this notification and keeps
    an incident of it (route ``follow:<channel>``, dedup key ``follow:<channel>:<id>:<action>``), so the
    incident follows the human with the outbox's attempts, backoff and dead letter (N45)."""
    action = FOLLOW_ACTIONS[target]
    assert tx.conn is not None
    channels = sorted((await tx.conn.execute(_ADMITTED, {"b_id": rid})).scalars())
    if channels:
        await enqueue_dispatches(tx, [
            {"kind": FOLLOW_KIND, "deliver_to": FOLLOW_PREFIX + channel, "dedup_key": f"follow:{channel}:{rid}:{action}",
             "body": {"notification_id": rid, "dedup_key": rid, "action": action, "responder": who},
             "max_attempts": CALLBACK_ATTEMPTS}
            for channel in channels])


async def follow_ups(book: Book, notification_id: str) -> list[FollowUp]:
    """The provider follow-ups of the notification's response (:data:`FOLLOW_ACTIONS`), oldest first."""
    nid = checked(text, "notification_id", notification_id, max_chars=KEY_CHARS, empty=False)
    rid = await canonical(book, nid)
    t = dispatch_outbox
    query = (sa.select(t.c.id, t.c.status, t.c.deliver_to, t.c.dedup_key, t.c.attempt, t.c.last_error)
             .where(t.c.kind == FOLLOW_KIND, t.c.dedup_key.in_([f"follow:{c}:{rid}:{a}" for c in FOLLOWS_RESPONSES
                                                                for a in FOLLOW_ACTIONS.values()]))
             .order_by(t.c.created_at, t.c.id))
    async with book.read() as conn:
        return [FollowUp.from_row(r) for r in await conn.execute(query)]


async def ack_notification(book: Book, notification_id: str, *, actor: Actor, note: str | None = None) -> NotificationResponse:
    """Acknowledge a delivered notification (or its owner, for a follower): ``pending -> acked`` (N32, N33)."""
    return await _respond(book, notification_id, "acked", actor, note)


async def dismiss_notification(book: Book, notification_id: str, *, actor: Actor, note: str | None = None) -> NotificationResponse:
    """Dismiss a delivered notification (or its owner, for a follower): ``pending -> dismissed`` (N32, N33)."""
    return await _respond(book, notification_id, "dismissed", actor, note)


def public(row: Mapping[str, Any]) -> NotificationResponse:
    """A response row as an operator or host is shown it."""
    return NotificationResponse.from_row(row)


async def get_response(book: Book, notification_id: str) -> NotificationResponse | None:
    """The response that answers for ``notification_id`` (its owner's, for a follower), or None."""
    nid = checked(text, "notification_id", notification_id, max_chars=KEY_CHARS, empty=False)
    rid = await canonical(book, nid)
    row = await _one(book, _RESPONSE, rid, lock=False)
    return None if row is None else public(row)


# -- the timeout pass -------------------------------------------------------------------------------
_DUE = (
    sa.select(notification_responses)
    .where(sa.text(status_in("notification_responses.status", ("pending",))),
           notification_responses.c.due_at <= sa.bindparam("b_now", type_=sa.Float))
    .order_by(notification_responses.c.due_at, notification_responses.c.id)
    .limit(sa.bindparam("b_limit", type_=sa.Integer))
)


async def expire_responses(book: Book, *, limit: int = 100, max_attempts: int = CALLBACK_ATTEMPTS) -> dict[str, int]:
    """One timeout pass (N35, N36): in ONE transaction, the due pending responses (due time, then id;
    ``FOR UPDATE SKIP LOCKED`` on PostgreSQL) move to ``timed_out`` and each enqueues its callback
    dispatch, due at the timeout's time. Counts ``timed_out`` and ``callbacks``."""
    if not isinstance(book, Book) or book.conn is not None:
        raise refused("book", "bound", "the timeout pass runs its own transaction: pass an unbound Book")
    checked(integer, "limit", limit, low=1, high=10_000)
    async with book.begin() as tx:
        now = tx.clock.now()
        rows = await read_rows(tx, _DUE, {"b_now": now, "b_limit": limit}, lock=True)
        commands = [Command("notification_response", r["id"], "timed_out",
                            Reason("notification_response.timed_out.deadline", f"no answer by {r['due_at']}"),
                            RESPONSE_ACTOR, ("pending",), {}, {"responded_at": now}) for r in rows]
        outcomes = await apply_many(tx, commands, lock="skip_locked", seen={r["id"]: r for r in rows})
        callbacks = [
            {"kind": CALLBACK_KIND, "deliver_to": CALLBACK_PREFIX + r["timeout_callback"],
             "body": {"event_id": o.fact_id, "notification_id": r["id"], "due_at": r["due_at"], "timed_out_at": now},
             "dedup_key": f"timeout:{r['id']}", "max_attempts": max_attempts}
            for r, o in zip(rows, outcomes, strict=True) if o.applied and r["timeout_callback"] is not None
        ]
        if callbacks:
            await enqueue_dispatches(tx, callbacks)
    return {"timed_out": sum(o.applied for o in outcomes), "callbacks": len(callbacks)}


async def next_timeout(book: Book) -> float | None:
    """The earliest ``due_at`` of a pending response (None when none waits)."""
    t = notification_responses
    async with book.read() as conn:
        earliest: float | None = (
            await conn.execute(sa.select(sa.func.min(t.c.due_at)).where(t.c.status == "pending"))).scalar()
        return earliest


def check_timeout(value: Any) -> float | None:
    """A response timeout in seconds (> 0), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise refused("response_timeout", "range", f"expected seconds in (0, {MAX_TIMEOUT_SECONDS:g}], got {shown(value)}")
    return float(value)


async def timeout_callbacks(book: Book, notification_id: str) -> list[TimeoutCallback]:
    """The timeout callback obligations of the notification's response (at most one: dedup key
    ``timeout:<id>``): status, attempts, next attempt, last error."""
    nid = checked(text, "notification_id", notification_id, max_chars=KEY_CHARS, empty=False)
    rid = await canonical(book, nid)
    t = dispatch_outbox
    query = sa.select(t.c.id, t.c.status, t.c.deliver_to, t.c.attempt, t.c.max_attempts, t.c.next_attempt_at,
                      t.c.last_error, t.c.created_at).where(t.c.dedup_key == f"timeout:{rid}")
    async with book.read() as conn:
        return [TimeoutCallback.from_row(r) for r in await conn.execute(query)]
