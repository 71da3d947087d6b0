"""Fleet-wide rate limits: a token bucket per (channel, scope) in the database (specs/notifications.md N8).

The seed's workers kept their buckets in process memory, so N workers sent N times the limit. Here a
bucket is a ``rate_bucket`` row: every worker of every host draws from the same one, in the
transaction that records the attempt the token pays for — a rolled-back attempt gives its token back.

>>> await ensure_bucket(book, "slack", "team-a", capacity=5, refill_per_second=0.5)  # doctest: +SKIP
>>> async with book.begin() as tx:  # doctest: +SKIP
...     wait = await draw(tx, "slack", "team-a", now=tx.clock.now())
...     # wait == 0.0: a token was taken (and the attempt is recorded in this same tx); else the
...     # seconds until the next token, and nothing was written.

A draw reads the bucket row under its row lock (PostgreSQL ``FOR UPDATE``; SQLite's single writer
already serialises every write transaction), refills it by the time elapsed since ``refilled_at``
up to ``capacity``, and takes a token with ONE guarded ``open -> open`` transition (guards: the
``tokens`` and ``refilled_at`` it read). Because the row is held from the read to the commit, no other
drawer can change it in between: the guards then only re-check what the lock promises, and a conflict
would mean a broken lock, which raises :class:`~statebook.lifecycle.errors.StorageError` after a few
fresh reads rather than hand out a token twice. Two drawers of the same bucket queue on its lock,
so a hot bucket serialises its callers for the length of their transactions: keep them short.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Command, Reason, apply_many, create, head_columns
from statebook.lifecycle.errors import StorageError
from statebook.lifecycle import inputs
from statebook.lifecycle.inputs import KEY_CHARS, number, shown, text, timestamp
from statebook.lifecycle.queries import lock_rows

from .channels import CHANNEL_NAMES
from .errors import checked, refused
from .schema import rate_buckets

__all__ = ["BUCKET_ACTOR", "bucket_id", "draw", "ensure_bucket", "hold"]

BUCKET_ACTOR = Actor("system", "rate_bucket")
MAX_CAPACITY = 1e9
"""Tokens a bucket may hold at most (a bound that keeps the float arithmetic exact to well below one token)."""
MAX_REFILL = 1e9
EPSILON = 1e-9
"""Slack for float rounding in the refill: ``0.1 * 10`` tokens is a token."""
RETRIES = 3
MAX_HOLD_SECONDS = 86_400.0
"""The longest wait a provider's ``Retry-After`` may impose on a bucket (a day; longer answers are cut)."""
"""Fresh reads of a bucket after a guarded draw that conflicted (never expected under the row lock)."""

_ROW = sa.select(
    rate_buckets.c.id, *head_columns(rate_buckets), rate_buckets.c.capacity, rate_buckets.c.refill_per_second,
    rate_buckets.c.tokens, rate_buckets.c.refilled_at,
).where(rate_buckets.c.id == sa.bindparam("b_id"))




def bucket_id(channel: str, scope: str) -> str:
    """The bucket's id, ``"<channel>:<scope>"``, after checking both (:class:`NotificationInvalid`)."""
    checked(text, "channel", channel, max_chars=KEY_CHARS)
    if channel not in CHANNEL_NAMES:
        raise refused("channel", "channel", f"unknown channel {shown(channel)}; channels are {', '.join(CHANNEL_NAMES)}")
    checked(text, "scope", scope, max_chars=KEY_CHARS - len(channel) - 1, empty=False)
    return f"{channel}:{scope}"


def refilled(row: Mapping[str, Any], now: float) -> tuple[float, float]:
    """(tokens, refilled_at) of ``row`` at ``now``: refilled by the time elapsed, never above capacity.
    A ``now`` before ``refilled_at`` (a clock that stepped back) refills nothing and keeps ``refilled_at``,
    so no interval is ever paid out twice."""
    since = row["refilled_at"]
    if now <= since:
        return min(row["tokens"], row["capacity"]), since
    return min(row["capacity"], row["tokens"] + (now - since) * row["refill_per_second"]), now


async def _locked(tx: Book, entity_id: str) -> dict[str, Any] | None:
    assert tx.conn is not None
    query = lock_rows(_ROW, "wait")
    row = (await tx.conn.execute(query, {"b_id": entity_id})).first()
    return None if row is None else dict(row._mapping)


async def _move(tx: Book, row: dict[str, Any], patch: dict[str, Any], code: str, summary: str) -> bool:
    """ONE guarded ``open -> open`` transition of the row as read (no second read: it is ours, locked)."""
    command = Command(
        "rate_bucket", row["id"], "open", Reason(code, summary), BUCKET_ACTOR, ("open",),
        guards={"tokens": row["tokens"], "refilled_at": row["refilled_at"]}, patch=patch,
    )
    [outcome] = await apply_many(tx, [command], seen={row["id"]: row})
    return outcome.applied


async def ensure_bucket(book: Book, channel: str, scope: str, *, capacity: float, refill_per_second: float) -> None:
    """Make sure the bucket of (``channel``, ``scope``) exists with this size: created ``open`` and full
    (``rate_bucket.open.created``) when absent — racing creators make one row — or resized
    (``rate_bucket.open.resized``) when it has another capacity or refill rate. A resize first refills
    at the old rate up to now (the book's clock), then keeps at most the new capacity. A retired bucket
    is left as it is. Runs in the book's transaction when bound, else in its own.
    """
    checked(inputs.book, "book", book)
    entity_id = bucket_id(channel, scope)
    checked(number, "capacity", capacity, low=1, high=MAX_CAPACITY)
    checked(number, "refill_per_second", refill_per_second, low=0, high=MAX_REFILL)
    if refill_per_second <= 0:
        raise refused("refill_per_second", "range", f"{refill_per_second!r} must be more than 0 tokens per second")
    capacity, refill = float(capacity), float(refill_per_second)
    async with book.begin() as tx:
        now = tx.clock.now()
        values = {"id": entity_id, "channel": channel, "scope": scope, "capacity": capacity,
                  "refill_per_second": refill, "tokens": capacity, "refilled_at": now}
        made = await create(tx, "rate_bucket", values=values, status="open", if_absent=True, actor=BUCKET_ACTOR,
                            reason=Reason("rate_bucket.open.created", f"{capacity:g} tokens, {refill:g}/s"))
        if made.applied:
            return
        for _ in range(RETRIES):
            row = await _locked(tx, entity_id)
            if row is None or row["status"] != "open":
                return  # purged after it lost the create race, or retired: nothing to size
            if (row["capacity"], row["refill_per_second"]) == (capacity, refill):
                return
            tokens, at = refilled(row, now)
            patch = {"capacity": capacity, "refill_per_second": refill, "tokens": min(tokens, capacity),
                     "refilled_at": at}
            summary = (f"{row['capacity']:g} tokens, {row['refill_per_second']:g}/s -> "
                       f"{capacity:g} tokens, {refill:g}/s")
            if await _move(tx, row, patch, "rate_bucket.open.resized", summary):
                return
        raise StorageError(f"rate_bucket {entity_id!r}: the resize conflicted {RETRIES} times under its row lock")


async def draw(tx: Book, channel: str, scope: str, *, now: float) -> float:
    """Take one token of the (``channel``, ``scope``) bucket in ``tx``'s transaction (a bound Book from
    ``book.begin()``): 0.0 when a token was taken (``rate_bucket.open.drawn``; it is given back if the
    transaction rolls back), else the seconds until the next token — and then nothing is written.

    A channel and scope without a bucket (or with a retired one) have no limit configured: 0.0, and
    nothing is written. ``now`` is the caller's injected clock reading.
    """
    checked(inputs.book, "tx", tx)
    if tx.conn is None or not tx.conn.in_transaction():
        raise refused("tx", "bound", "draw runs in the caller's transaction: pass the book of "
                                     "`async with book.begin() as tx`, so the token and the attempt it pays for "
                                     "commit (or roll back) together")
    entity_id = bucket_id(channel, scope)
    checked(timestamp, "now", now)
    now = float(now)
    for _ in range(RETRIES):
        row = await _locked(tx, entity_id)
        if row is None or row["status"] != "open":
            return 0.0
        tokens, at = refilled(row, now)
        if tokens < 1 - EPSILON:
            # Nothing refills before ``refilled_at`` (a held bucket, or a clock that stepped back).
            rate: float = row["refill_per_second"]
            return max(0.0, at - now) + (1 - tokens) / rate
        patch = {"tokens": max(0.0, tokens - 1), "refilled_at": at}
        if await _move(tx, row, patch, "rate_bucket.open.drawn", f"{tokens:.6g} -> {patch['tokens']:.6g} tokens"):
            return 0.0
    raise StorageError(f"rate_bucket {entity_id!r}: the draw conflicted {RETRIES} times under its row lock")


async def hold(tx: Book, channel: str, scope: str, *, seconds: float, now: float) -> bool:
    """The provider said "too many requests, retry after ``seconds``" (a 429's ``Retry-After``): empty the
    (``channel``, ``scope``) bucket so that its next token comes ``seconds`` from ``now`` — for every
    worker of the fleet, not only the notification that was refused (``rate_bucket.open.held``). In
    ``tx``'s transaction (the one recording the observation). False, and nothing written, when the
    channel has no bucket or the bucket is already held at least that long."""
    if tx.conn is None or not tx.conn.in_transaction():
        raise refused("tx", "bound", "hold runs in the caller's transaction (the one that records the observation)")
    entity_id = bucket_id(channel, scope)
    checked(number, "seconds", seconds, low=0, high=MAX_HOLD_SECONDS)
    checked(timestamp, "now", now)
    for _ in range(RETRIES):
        row = await _locked(tx, entity_id)
        if row is None or row["status"] != "open":
            return False
        period = 1 / row["refill_per_second"]
        # No tokens, refilled from ``now + seconds - period`` on: exactly one token at ``now + seconds``.
        at = float(now) + float(seconds) - period
        tokens, since = refilled(row, float(now))
        if tokens < 1 - EPSILON and max(0.0, since - now) + (1 - tokens) * period >= seconds - EPSILON:
            return False
        patch = {"tokens": 0.0, "refilled_at": at}
        if await _move(tx, row, patch, "rate_bucket.open.held", f"the provider asked to wait {seconds:g}s"):
            return True
    raise StorageError(f"rate_bucket {entity_id!r}: the hold conflicted {RETRIES} times under its row lock")
