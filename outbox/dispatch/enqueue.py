"""Enqueue: validate, serialise the envelope once, insert row + creation fact (specs/outbox.md O1-O4).

Every function takes a :class:`~statebook.lifecycle.Book`; give it a bound book (``async with
book.begin() as tx``) to enqueue atomically with your own writes.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, NewEntity, Reason, create, create_many, tracing
from statebook.lifecycle.codec import dumps, new_id
from statebook.lifecycle.inputs import KEY_CHARS, Limits

from . import checks
from .bounds import payload_bound
from .errors import DispatchInvalid
from .offers import offer_created
from .policy import NOTIFY_CHANNEL
from .schema import dispatch_outbox
from .signal import TRACEPARENT_BYTES, dispatch_envelope

DEFAULT_MAX_ATTEMPTS = 8
REVIVAL_TTL_SECONDS = 3600.0

ENQUEUE_ACTOR = Actor("system", "enqueue_dispatch")
_DEDUP_RETRIES = 3
_CHUNK = 500

_ENQUEUE_ARGS = frozenset(
    {"kind", "deliver_to", "body", "dedup_key", "ack_required", "max_attempts", "expires_at", "session_id",
     "schedule_run_id"}
)


def _validate(
    limits: Limits, *, kind: Any, deliver_to: Any, body: Any, dedup_key: Any, ack_required: Any, max_attempts: Any,
    expires_at: Any, session_id: Any, schedule_run_id: Any, traceparent: str | None = None,
) -> tuple[dict[str, Any], float | None]:
    """Check every argument that does not need the database (O4, O22); returns the body and the expiry
    (POSIX seconds) to store."""
    checks.name("kind", kind)
    checks.route("deliver_to", deliver_to, limits)
    checks.optional_name("dedup_key", dedup_key)
    checks.optional_name("session_id", session_id)
    checks.optional_name("schedule_run_id", schedule_run_id)
    checks.flag("ack_required", ack_required)
    checks.count("max_attempts", max_attempts, checks.MAX_ATTEMPTS)
    expires = None if expires_at is None else checks.when("expires_at", expires_at)
    if body is None:
        stored, size = {}, 2
    else:
        checks.json_object("body", body, limits)
        text = dumps(body)
        # A copy: the row (and an offer serialised later) must not see the caller change its dict.
        stored, size = json.loads(text), len(text.encode())
    # A traceparent (tracing on) is part of the envelope: the body must leave room for it.
    _check_payload(limits, kind, deliver_to, ack_required, size + (TRACEPARENT_BYTES if traceparent else 0),
                   max_attempts)
    return stored, expires


_ENVELOPE_BYTES = len(dumps(dispatch_envelope(
    created_at=0.0, dispatch_id=new_id(), kind="", deliver_to="", ack_token=None, body={})).encode())
"""The envelope with empty kind, route and body, no token and ``created_at`` 0.0, as canonical JSON."""
_CREATED_AT_SLACK = 24 - len("0.0")
"""A float's ``repr`` is at most 24 characters (``-1.2345678901234567e-100``); sizes count ``created_at`` so."""


def _check_payload(limits: Limits, kind: str, deliver_to: str, ack_required: bool, body_bytes: int,
                   max_attempts: int) -> None:
    """Refuse a body whose envelope would exceed what the book's delivery carries (O22).

    The envelope's size is known before the row is built: canonical JSON of a fixed shape, counted
    with ``created_at`` at its longest and ``attempt`` at the last one allowed (a send carries the attempt
    it makes, O1), so the check needs neither the clock nor a second encode.
    """
    bound, why = payload_bound(limits)
    attempt_slack = len(str(max_attempts)) - 1  # the stored envelope counts "0"
    rough = _ENVELOPE_BYTES + _CREATED_AT_SLACK + attempt_slack + 34 + body_bytes + 6 * (len(kind) + len(deliver_to))
    if rough <= bound:  # every character encodes to at most 6 bytes (an escape): certainly fits
        return
    size = (_ENVELOPE_BYTES + _CREATED_AT_SLACK + attempt_slack + body_bytes - 2 + len(dumps(kind).encode()) - 2
            + len(dumps(deliver_to).encode()) - 2 + (30 if ack_required else 0))  # a token's 34 bytes for null's 4
    if size > bound:
        raise DispatchInvalid(
            f"body: the dispatch's payload would be {size} bytes as JSON, more than the {bound} this book delivers "
            f"({why}); send a smaller body (e.g. a reference to the data)",
            argument="body", rule="payload",
        )


async def _existing_ids(tx: Book, keys: Iterable[str]) -> dict[str, str]:
    """dedup key -> id of the rows holding them (visible to this transaction)."""
    assert tx.conn is not None
    t = dispatch_outbox
    wanted, found = sorted(set(keys)), {}
    for start in range(0, len(wanted), _CHUNK):
        rows = await tx.conn.execute(sa.select(t.c.dedup_key, t.c.id).where(t.c.dedup_key.in_(wanted[start : start + _CHUNK])))
        found.update({r.dedup_key: r.id for r in rows})
    return found


async def notify(tx: Book, payload: str = "") -> None:
    """Wake workers listening on ``statebook_dispatch`` when ``tx`` commits (PostgreSQL ``NOTIFY``;
    nothing on SQLite, whose workers are woken in process)."""
    store = tx.store
    if tx.conn is None:  # an unbound book: the wake-up is a statement of its own (no transaction around it)
        await tx.upkeep.notify(None, NOTIFY_CHANNEL, payload)
        return
    async with store.unit(tx.conn) as unit:
        await tx.upkeep.notify(unit, NOTIFY_CHANNEL, payload)


def _new_row(args: dict[str, Any], now: float) -> dict[str, Any]:
    """Column values of a new pending dispatch; the envelope is serialised here, once."""
    expires_at = args["expires_at"]
    if expires_at is not None and expires_at <= now:
        raise DispatchInvalid(f"expires_at: {expires_at} is not in the future (now is {now}); pass a later time or None",
                              argument="expires_at", rule="future")
    dispatch_id = new_id()
    token = secrets.token_hex(16) if args["ack_required"] else None
    payload = dispatch_envelope(
        created_at=now, dispatch_id=dispatch_id, kind=args["kind"], deliver_to=args["deliver_to"], ack_token=token,
        body=args["body"],  # already checked and JSON-normalised by _validate (callers run it first)
        traceparent=args.get("traceparent"),
    )
    return {
        "id": dispatch_id,
        "kind": args["kind"],
        "deliver_to": args["deliver_to"],
        "payload": payload,
        "dedup_key": args["dedup_key"],
        "attempt": 0,
        "max_attempts": args["max_attempts"],
        "next_attempt_at": now,
        "ack_required": 1 if args["ack_required"] else 0,
        "ack_token": token,
        "session_id": args["session_id"],
        "schedule_run_id": args["schedule_run_id"],
        "last_error": None,
        "created_at": now,
        "expires_at": None if expires_at is None else float(expires_at),
    }


def _reason(kind: str) -> Reason:
    return Reason("dispatch.pending.enqueued", f"enqueued kind={kind}")


def _stored_payload(payload: Any) -> str:
    """The text the payload column stores for ``payload``: its canonical JSON (adapters.db gives every
    engine ``codec.dumps`` as its JSON serializer)."""
    return dumps(payload)


async def _enqueue_one(tx: Book, args: dict[str, Any], *, offer: bool = False) -> tuple[str, bool]:
    """Insert one dispatch in ``tx``; returns (id, created). With ``offer`` (an unbound book, so the
    insert has committed) the new row is offered to an idle worker of this process."""
    dedup_key = args["dedup_key"]
    for _ in range(_DEDUP_RETRIES):
        if dedup_key is not None:
            found = (await _existing_ids(tx, [dedup_key])).get(dedup_key)
            if found is not None:
                return found, False
        values = _new_row(args, tx.clock.now())
        outcome = await create(
            tx, "dispatch", values=values, status="pending", reason=_reason(args["kind"]), actor=ENQUEUE_ACTOR,
            if_absent=True, fresh_id=True,
        )
        if outcome.applied:
            if offer and outcome.row is not None:
                row = outcome.row
                offer_created(tx, row, lambda: _stored_payload(row["payload"]))
            return values["id"], True
        # With a key: another producer committed it after our first look (on PostgreSQL our insert
        # waited for that commit), and a fresh statement now sees its id. Without one: an id
        # collision; draw another.
    raise DispatchInvalid(
        f"dedup_key: could not enqueue: {dedup_key!r} conflicted but no row holds it (purged concurrently?); retry",
        argument="dedup_key", rule="conflict",
    )


async def _enqueue_many(tx: Book, prepared: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """Insert many dispatches in ``tx`` with one multi-row insert; (ids in input order, any created)."""
    existing = await _existing_ids(tx, (a["dedup_key"] for a in prepared if a["dedup_key"] is not None))
    now = tx.clock.now()
    ids: list[str | None] = [None] * len(prepared)
    first_with_key: dict[str, int] = {}
    fresh: list[tuple[int, NewEntity]] = []
    for index, args in enumerate(prepared):
        key = args["dedup_key"]
        if key is not None and (key in existing or key in first_with_key):
            continue  # resolved below
        try:
            values = _new_row(args, now)
        except DispatchInvalid as exc:
            raise checks.in_item(exc, index) from None
        if key is not None:
            first_with_key[key] = index
        fresh.append((index, NewEntity(values, "pending", _reason(args["kind"]), ENQUEUE_ACTOR)))
    outcomes = await create_many(tx, "dispatch", [entity for _, entity in fresh], if_absent=True,
                                 fresh_ids=True)  # _new_row drew every id with new_id()
    created = False
    for (index, entity), outcome in zip(fresh, outcomes, strict=True):
        if outcome.applied:
            ids[index] = entity.values["id"]
            created = True
        elif prepared[index]["dedup_key"] is not None:
            del first_with_key[prepared[index]["dedup_key"]]  # lost a race: re-read below
        else:
            ids[index], made = await _enqueue_one(tx, prepared[index])  # an id collision
            created = created or made
    # Keys another producer committed while we inserted: their ids are visible to a new statement.
    unresolved = {
        a["dedup_key"] for i, a in enumerate(prepared)
        if ids[i] is None and a["dedup_key"] not in first_with_key and a["dedup_key"] not in existing
    }
    if unresolved:
        existing.update(await _existing_ids(tx, unresolved))
    for index, args in enumerate(prepared):
        key = args["dedup_key"]
        if ids[index] is not None:
            continue
        if key in first_with_key:
            ids[index] = ids[first_with_key[key]]
        elif key in existing:
            ids[index] = existing[key]
        else:  # the key's row vanished again (purged): insert it one by one
            ids[index], made = await _enqueue_one(tx, args)
            created = created or made
            first_with_key[key] = index
    return [i for i in ids if i is not None], created


async def _enqueue_fresh(book: Book, prepared: list[dict[str, Any]]) -> list[str]:
    """A batch without dedup keys on an unbound book: one create_many (its own transaction), then a
    wake-up NOTIFY on PostgreSQL (listeners only hear it once the batch has committed either way)."""
    now = book.clock.now()
    entities = []
    for index, args in enumerate(prepared):
        try:
            entities.append(NewEntity(_new_row(args, now), "pending", _reason(args["kind"]), ENQUEUE_ACTOR))
        except DispatchInvalid as exc:
            raise checks.in_item(exc, index) from None
    outcomes = await create_many(book, "dispatch", entities, if_absent=True, fresh_ids=True)  # ids from new_id()
    ids = []
    for args, entity, outcome in zip(prepared, entities, outcomes, strict=True):
        if outcome.applied:
            ids.append(entity.values["id"])
        else:  # a generated id that already existed (128 random bits: practically never): draw another, alone
            dispatch_id, _ = await _enqueue_one(book, args)
            ids.append(dispatch_id)
    return ids


async def enqueue_dispatch(
    book: Book,
    *,
    kind: str,
    deliver_to: str,
    body: Mapping[str, Any] | None = None,
    dedup_key: str | None = None,
    ack_required: bool = False,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    expires_at: datetime | float | None = None,
    session_id: str | None = None,
    schedule_run_id: str | None = None,
) -> str:
    """Store a pending dispatch and its creation fact; return its 32-hex id.

    With ``dedup_key`` the first committed row wins: a later call (even a racing one on another
    connection) returns that row's id and writes nothing. Invalid arguments raise
    :class:`DispatchInvalid` (a ``ValueError``) naming the argument and write nothing: among them
    ``max_attempts`` outside 1 to 10,000, a body deeper or larger than ``book.limits`` allow or
    whose payload the book's delivery cannot carry, and a route starting with ``-`` unless
    ``book.limits`` come from a template with ``--`` before it (specs/outbox.md O22).

    >>> did = await enqueue_dispatch(book, kind="terminal_notify", deliver_to="seat-1")  # doctest: +SKIP
    """
    args = {
        "kind": kind, "deliver_to": deliver_to, "body": body, "dedup_key": dedup_key, "ack_required": ack_required,
        "max_attempts": max_attempts, "expires_at": expires_at, "session_id": session_id,
        "schedule_run_id": schedule_run_id,
    }
    checks.book_arg(book)
    tracer = tracing.active()
    if tracer is None:
        return await _enqueue_single(book, args)
    with tracer.span("send dispatch", "producer", _send_attributes(kind)) as span:
        args["traceparent"] = span.traceparent()  # the delivery's process span is its child (the envelope carries it)
        dispatch_id = await _enqueue_single(book, args)
        span.set("messaging.message.id", dispatch_id)
        return dispatch_id


def _send_attributes(kind: object) -> dict[str, str]:
    """A send span's attributes (messaging semantic conventions; no route, body or token: they may be secret)."""
    attributes = {"messaging.system": "statebook", "messaging.operation.name": "send",
                  "messaging.operation.type": "send", "messaging.destination.name": "dispatch"}
    if isinstance(kind, str):
        attributes["statebook.dispatch.kind"] = kind
    return attributes


async def _enqueue_single(book: Book, args: dict[str, Any]) -> str:
    """Check and store one dispatch (:func:`enqueue_dispatch` without its span)."""
    args["body"], args["expires_at"] = _validate(book.limits, **args)
    if args["dedup_key"] is None and book.conn is None:
        # No dedup lookup: the create is the only statement (on PostgreSQL one autocommit round trip).
        dispatch_id, _ = await _enqueue_one(book, args, offer=True)
        return dispatch_id
    async with book.begin() as tx:
        dispatch_id, _ = await _enqueue_one(tx, args)  # the creation statement NOTIFYs on PostgreSQL
    return dispatch_id


async def enqueue_dispatches(book: Book, items: Sequence[Mapping[str, Any]]) -> list[str]:
    """Enqueue many dispatches in ONE transaction; ids in input order (dedup hits give the first id).

    Each item holds :func:`enqueue_dispatch`'s keyword arguments. Every item is checked before
    anything is written; one invalid item refuses the whole batch. (Should a generated id already
    exist — 128 random bits make that practically impossible — that one item is retried alone.)
    """
    checks.book_arg(book)
    tracer = tracing.active()
    if tracer is None:
        return await _enqueue_items(book, items, None)
    # One send span for the batch: its context is the creation context of every item (no create spans).
    with tracer.span("send dispatch", "producer", _send_attributes(None)) as span:
        ids = await _enqueue_items(book, items, span.traceparent())
        if len(ids) != 1:
            span.set("messaging.batch.message_count", len(ids))
        return ids


async def _enqueue_items(book: Book, items: Sequence[Mapping[str, Any]], traceparent: str | None) -> list[str]:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise DispatchInvalid(f"items: expected a list of mappings of enqueue_dispatch's arguments, got "
                              f"{type(items).__name__}", argument="items", rule="type")
    limits = book.limits
    prepared: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise DispatchInvalid(f"items[{index}]: expected a mapping of enqueue_dispatch's arguments, got "
                                  f"{type(item).__name__}", argument=f"items[{index}]", rule="type")
        unknown = sorted(repr(key) if not isinstance(key, str) else key for key in item if key not in _ENQUEUE_ARGS)
        if unknown:
            raise DispatchInvalid(f"items[{index}]: unknown argument(s) {', '.join(unknown)[:200]}; known: "
                                  f"{', '.join(sorted(_ENQUEUE_ARGS))}", argument=f"items[{index}]", rule="unknown")
        missing = sorted({"kind", "deliver_to"} - set(item))
        if missing:
            raise DispatchInvalid(f"items[{index}]: missing required argument(s) {', '.join(missing)}",
                                  argument=f"items[{index}]", rule="missing")
        args = {
            "body": None, "dedup_key": None, "ack_required": False, "max_attempts": DEFAULT_MAX_ATTEMPTS,
            "expires_at": None, "session_id": None, "schedule_run_id": None, **item,
        }
        try:
            args["body"], args["expires_at"] = _validate(limits, traceparent=traceparent, **args)
        except DispatchInvalid as exc:
            raise checks.in_item(exc, index) from None
        args["traceparent"] = traceparent
        prepared.append(args)
    if not prepared:
        return []
    if book.conn is None and all(a["dedup_key"] is None for a in prepared):
        return await _enqueue_fresh(book, prepared)
    async with book.begin() as tx:
        ids, created = await _enqueue_many(tx, prepared)
        if created:
            await notify(tx)
    return ids


async def enqueue_revival_heartbeat(
    book: Book,
    seats: Sequence[str],
    *,
    reset_epoch: datetime | float,
    ttl_seconds: float = REVIVAL_TTL_SECONDS,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[str]:
    """One ``revival_ping`` per seat, deduplicated per (seat, reset epoch) (specs/outbox.md O3).

    A truthy ``reset_epoch`` (an aware ``datetime`` or POSIX seconds) sets ``expires_at = reset_epoch +
    ttl_seconds``; zero means no expiry.
    """
    checks.book_arg(book)
    seats = checks.texts("seats", seats)
    # 0: no expiry. Seconds stay as given: the dedup key spells them as before.
    reset_epoch = checks.when("reset_epoch", reset_epoch)
    checks.seconds("ttl_seconds", ttl_seconds)
    checks.count("max_attempts", max_attempts, checks.MAX_ATTEMPTS)
    expires_at = reset_epoch + ttl_seconds if reset_epoch else None
    if expires_at is not None:
        checks.when("reset_epoch + ttl_seconds", expires_at)
    for index, seat in enumerate(seats):
        if len(_revival_key(seat, reset_epoch)) > KEY_CHARS:
            raise DispatchInvalid(f"seats[{index}]: is {len(seat)} characters long; its dedup key would pass the "
                                  f"{KEY_CHARS} characters a key holds", argument=f"seats[{index}]", rule="length")
    items = [
        {
            "kind": "revival_ping",
            "deliver_to": seat,
            "dedup_key": _revival_key(seat, reset_epoch),
            "ack_required": False,
            "max_attempts": max_attempts,
            "expires_at": expires_at,
        }
        for seat in seats
    ]
    return await enqueue_dispatches(book, items)


def _revival_key(seat: str, reset_epoch: float) -> str:
    return f"revival:{seat}:{reset_epoch}"
