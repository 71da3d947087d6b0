"""Offers: dispatches an idle worker may claim without scanning for them.

A worker that is idle has delivered everything due, so a dispatch enqueued now is the next one it
would claim anyway. Two sources tell it which:

- an enqueue in the same process (:func:`offer_created`) hands over the row it just committed —
  status, due time, attempt and chain head — so the claim is ONE statement, no read;
- a PostgreSQL ``NOTIFY`` names the id (the creation statement sends it), so the worker reads
  that row by key instead of scanning the due index.

An offer only saves a read: the claim is the usual compare-and-set against the row, so a row that
moved meanwhile (another worker claimed it, an operator purged it) is a lost race, nothing more.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from statebook.lifecycle import Book, Head

from .attempts import Candidate, with_head

Take = Callable[[str, "tuple[Candidate, Head] | None"], bool]
"""A worker's intake: (dispatch id, candidate and its head or None) -> accepted."""

_takers: weakref.WeakKeyDictionary[Any, list[Take]] = weakref.WeakKeyDictionary()
_HEX32 = re.compile(r"[0-9a-f]{32}")


def subscribe(book: Book, take: Take) -> None:
    """Offer new dispatches of ``book``'s engine to ``take`` as they are enqueued in this process."""
    _takers.setdefault(book.engine.sync_engine, []).append(take)


def unsubscribe(book: Book, take: Take) -> None:
    """Stop offering new dispatches to ``take`` (nothing if it was not subscribed)."""
    takers = _takers.get(book.engine.sync_engine, [])
    if take in takers:
        takers.remove(take)


def offered_id(payload: Any) -> str | None:
    """The dispatch id a NOTIFY payload names, if it names one."""
    return payload if isinstance(payload, str) and _HEX32.fullmatch(payload) else None


def candidate_of(row: Mapping[str, Any], payload_text: str) -> tuple[Candidate, Head]:
    """A committed row as a scan would read it, and its head for ``apply_many(seen=)``."""
    return with_head({"claim_id": None, **row, "payload": payload_text})


def offer_created(book: Book, row: Mapping[str, Any], payload_text: Callable[[], str]) -> None:
    """Offer a dispatch this process just committed to an idle worker on the same database.

    ``payload_text`` gives the stored payload text; it is only called when a worker listens.
    """
    takers = _takers.get(book.engine.sync_engine)
    if not takers:
        return
    hint = candidate_of(row, payload_text())
    for take in takers:
        if take(row["id"], hint):
            return
