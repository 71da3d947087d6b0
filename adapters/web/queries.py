"""What the console reads about any registered lifecycle: keyset pages of its entities, counts per status.

Plain async functions taking a :class:`~statebook.lifecycle.Book`, on SQLAlchemy Core selects that read
the same on every backend; no starlette here. One entity's page (history, as-of, verify, the
notification and schedule sections) is :mod:`.entity_reads`.

A page is cut by key, never by OFFSET: entities are listed newest first by ``(created_at, id)`` when
the table has a ``created_at`` it always fills, else by ``(updated_at, id)`` (every managed table has
it), and a cursor carries the key of the row a page ends at. Every built-in table has an index led by
its order's columns (specs/performance.md, "Console pages"), so the thousandth page costs what the
first does.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from statebook.adapters.masking import MASK, mask
from statebook.lifecycle import Book, Lifecycle
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.inputs import KEY_CHARS, TIME_RANGE, integer, text as checked_text

__all__ = ["MAX_LIMIT", "Filters", "LifecycleCounts", "Page", "browse", "check_filters", "counts", "masked", "order_of",
           "parse_time", "time_columns"]

MAX_LIMIT = 500
TEXT_COLUMNS = ("id", "dedup_key", "recipient", "name", "kind")
"""The columns a text filter searches, those of them a table has (ids, keys, recipients, names)."""
_SECRET_NAME = re.compile(r"token|secret|password|passwd|pwd|api_?key|authorization|webhook_url|routing_key"
                          r"|link_key|session_key|signing", re.IGNORECASE)
"""A column or JSON key whose value is a secret as a whole: shown as ``***``, never searched."""
_ESCAPE = "\\"


@functools.lru_cache(maxsize=4096)
def _secret(name: str) -> bool:
    return _SECRET_NAME.search(name) is not None


def masked(value: Any, name: str = "") -> Any:
    """``value`` as a page may show it: a value under a secret's name is ``***``; text has URL passwords and
    ``token=``-style values masked (:func:`statebook.adapters.masking.mask`), inside JSON too; a datetime
    becomes POSIX seconds, as every stored time is.

    >>> masked({"url": "https://u:pw@host/x", "ack_token": "abc"})
    {'url': 'https://u:***@host/x', 'ack_token': '***'}
    """
    if name and value is not None and _secret(name):
        return MASK
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, Mapping):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v) for v in value]
    return value


def order_of(lc: Lifecycle) -> sa.Column[Any]:
    """The time column a lifecycle's entities are listed by: ``created_at`` when the table has one that is
    never NULL and holds POSIX seconds (a float, as every statebook time), else ``updated_at``."""
    created = lc.table.c.get("created_at")
    if created is not None and not created.nullable and isinstance(created.type, sa.Float):
        return created
    return lc.table.c.updated_at


@dataclass(frozen=True)
class Filters:
    """What a page was asked for: one status, a time window on the order's column, text in ids and keys."""

    status: str | None = None
    since: float | None = None
    until: float | None = None
    text: str | None = None

    def params(self) -> dict[str, str]:
        """The filters as query parameters (the ones set), for links that keep them."""
        values = {"status": self.status, "since": self.since, "until": self.until, "text": self.text}
        return {k: _param(v) for k, v in values.items() if v is not None}


def _param(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Page:
    """One page of a lifecycle's entities, newest first: rows (column -> value, secrets masked), the cursors
    of the pages before (``prev``, newer) and after (``next``, older), None at either end."""

    entity_type: str
    columns: tuple[str, ...]
    times: frozenset[str]
    """The columns holding POSIX times (shown as UTC)."""
    order: str
    """The time column the page is ordered by."""
    rows: tuple[dict[str, Any], ...]
    next: str | None
    prev: str | None
    filters: Filters
    limit: int


def encode_cursor(at: Any, entity_id: str) -> str:
    """An opaque cursor naming the key ``(at, id)`` of the row a page ends at."""
    raw = json.dumps([at, entity_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(argument: str, cursor: str) -> tuple[float, str]:
    """The key an opaque cursor carries; :class:`InvalidArgument` for anything this module did not write."""
    checked_text(argument, cursor, max_chars=2 * KEY_CHARS)
    try:
        at, entity_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        valid = isinstance(entity_id, str) and isinstance(at, int | float) and not isinstance(at, bool)
    except (ValueError, TypeError):
        valid = False
    if not valid or not math.isfinite(at):
        raise InvalidArgument(f"{argument}: not a cursor of this console (follow the page's links)",
                              argument=argument, rule="cursor")
    return float(at), entity_id


def _time(argument: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not TIME_RANGE[0] <= value <= TIME_RANGE[1]:  # NaN too
        raise InvalidArgument(f"{argument}: expected POSIX seconds between 1970 and 9999, got {value!r}",
                              argument=argument, rule="time")
    return float(value)


def parse_time(argument: str, raw: str | None) -> float | None:
    """A time typed in a form: POSIX seconds, or ISO 8601 (UTC unless it names an offset); None when empty.

    >>> parse_time("since", "2026-12-05T19:30:00"), parse_time("since", "1796499000")
    (1796499000.0, 1796499000.0)
    """
    if raw is None or not raw.strip():
        return None
    raw = raw.strip()
    try:
        number = float(raw)
    except ValueError:
        number = None
    if number is not None:
        return _time(argument, number)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(f"{argument}: {raw[:40]!r} is neither POSIX seconds nor an ISO 8601 time "
                              "(2026-12-05T19:30:00, UTC unless an offset is given)", argument=argument,
                              rule="time") from None
    return _time(argument, (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp())


def _contains(pattern: str) -> str:
    """``%text%`` with the text's own ``%``, ``_`` and escape character taken literally."""
    for special in (_ESCAPE, "%", "_"):
        pattern = pattern.replace(special, _ESCAPE + special)
    return f"%{pattern}%"


def _filtered(lc: Lifecycle, query: sa.Select[Any], filters: Filters) -> sa.Select[Any]:
    t, at = lc.table, order_of(lc)
    if filters.status is not None:
        query = query.where(t.c.status == filters.status)
    if filters.since is not None:
        query = query.where(at >= filters.since)
    if filters.until is not None:
        query = query.where(at < filters.until)
    if filters.text:
        like = _contains(filters.text)
        searched = [t.c[name] for name in TEXT_COLUMNS if name in t.c]
        query = query.where(sa.or_(*(c.ilike(like, escape=_ESCAPE) for c in searched)))
    return query


def check_filters(lc: Lifecycle, status: str | None, since: float | None, until: float | None,
                  text: str | None) -> Filters:
    """The browse filter checked: a status of ``lc``, times in range, bounded text (one wording everywhere)."""
    if status is not None and status not in lc.statuses:
        raise InvalidArgument(f"status: {lc.entity_type} has no status {status[:60]!r}; its statuses are "
                              f"{', '.join(lc.statuses)}", argument="status", rule="vocabulary")
    if text is not None:
        checked_text("text", text, max_chars=KEY_CHARS)
    return Filters(status, _time("since", since), _time("until", until), text or None)


def page_query(lc: Lifecycle, filters: Filters, limit: int, *, after: tuple[float, str] | None = None,
               before: tuple[float, str] | None = None) -> sa.Select[Any]:
    """The select of one page: rows older than the key ``after`` (or newer than ``before``, read oldest first),
    newest first. A row-value comparison on the order's columns, so the index they lead serves it."""
    t, at = lc.table, order_of(lc)
    key = sa.tuple_(at, t.c.id)
    query = _filtered(lc, sa.select(t), filters).limit(limit)
    if before is not None:
        bound = sa.tuple_(sa.literal(before[0], at.type), sa.literal(before[1], t.c.id.type))
        return query.where(key > bound).order_by(at.asc(), t.c.id.asc())
    if after is not None:
        query = query.where(key < sa.tuple_(sa.literal(after[0], at.type), sa.literal(after[1], t.c.id.type)))
    return query.order_by(at.desc(), t.c.id.desc())


async def browse(book: Book, entity_type: str, *, status: str | None = None, since: float | None = None,
                 until: float | None = None, text: str | None = None, after: str | None = None,
                 before: str | None = None, limit: int = 50) -> Page:
    """A page of ``entity_type``'s entities, newest first: the first page, or the one ``after`` (older than)
    or ``before`` (newer than) a cursor of an earlier page. Raises ``UnknownEntityType`` or
    ``InvalidArgument``.

    >>> page = await browse(book, "dispatch", status="dead_letter")  # doctest: +SKIP
    >>> older = await browse(book, "dispatch", status="dead_letter", after=page.next)  # doctest: +SKIP
    """
    lc = book.policy(entity_type)
    filters = check_filters(lc, status, since, until, text)
    integer("limit", limit, low=1, high=MAX_LIMIT)
    if after is not None and before is not None:
        raise InvalidArgument("after and before: give one cursor, not both", argument="before", rule="one_cursor")
    t, at = lc.table, order_of(lc)
    backwards = before is not None
    query = page_query(lc, filters, limit + 1, after=None if after is None else decode_cursor("after", after),
                       before=None if before is None else decode_cursor("before", before))
    async with book.read() as conn:
        found = [dict(r._mapping) for r in await conn.execute(query)]
    more, rows = len(found) > limit, found[:limit]
    if backwards:
        rows.reverse()
    first = encode_cursor(rows[0][at.name], rows[0]["id"]) if rows else None
    last = encode_cursor(rows[-1][at.name], rows[-1]["id"]) if rows else None
    newer = more if backwards else after is not None
    older = before is not None or (more and not backwards)
    return Page(
        entity_type=entity_type, columns=tuple(c.name for c in t.columns), times=time_columns(lc.table),
        order=at.name, rows=tuple(masked(r) for r in rows), next=last if older else None,
        prev=first if newer else None, filters=filters, limit=limit,
    )


def time_columns(table: sa.Table) -> frozenset[str]:
    """The columns of ``table`` holding POSIX times (``*_at``, ``*_until`` floats): pages show them as UTC."""
    return frozenset(c.name for c in table.columns
                     if isinstance(c.type, sa.Float) and c.name.endswith(("_at", "_until")))


@dataclass(frozen=True)
class LifecycleCounts:
    """A registered lifecycle and how many of its entities are in each of its statuses (every status listed)."""

    entity_type: str
    table: str
    statuses: tuple[tuple[str, int], ...]
    terminal: frozenset[str]

    @property
    def total(self) -> int:
        """Every entity of the lifecycle."""
        return sum(n for _, n in self.statuses)


async def counts(book: Book) -> list[LifecycleCounts]:
    """Every registered lifecycle (the application's own included) with its entities per status, by type."""
    out = []
    async with book.read() as conn:
        for lc in sorted(book.registry, key=lambda lc: lc.entity_type):
            t = lc.table
            found: dict[str, int] = dict((await conn.execute(sa.select(t.c.status, sa.func.count()).group_by(t.c.status))).all())
            out.append(LifecycleCounts(lc.entity_type, t.name, tuple((s, int(found.get(s, 0))) for s in lc.statuses),
                                       frozenset(lc.terminal)))
    return out
