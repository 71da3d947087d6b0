"""Set-based claims and fenced group records, for every deliverable lifecycle.

A deliverable lifecycle (dispatches, notifications) keeps due rows that workers claim under a lease
and finish under that lease's fencing token. The two writes every such lifecycle needs are here,
once:

- :func:`claim_set` — in ONE transaction, read the due rows (locked ``FOR UPDATE SKIP LOCKED`` on
  PostgreSQL, so concurrent workers take disjoint rows), plan one command per row, and apply them in
  one engine call compared against the rows as read (``apply_many(seen=)``: no second read);
- :func:`record_set` — apply the fenced outcomes of several leases in one transaction, one
  transition each, falling back to one by one when the group cannot be written.

What a lifecycle plans — the claim, or a settlement of a row that must not be claimed again — stays
with the lifecycle (:mod:`statebook.outbox.dispatch.attempts`, :mod:`statebook.outbox.notifications.attempts`);
:func:`won` turns what applied into leases and counters the same way for both.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from statebook.lifecycle import Book, Command, Head, Outcome, apply_many

from .lease import Lease

__all__ = ["Planned", "claim_set", "read_rows", "record_set", "won"]

log = logging.getLogger("statebook.outbox")

T = TypeVar("T")


class Planned(Generic[T]):
    """One planned write of a claim: the command, the row as read (its compare-and-set), and what
    the caller makes of the command when it applies (a lease, or a counter's name)."""

    __slots__ = ("command", "row", "what")

    def __init__(self, command: Command, row: Head | Mapping[str, Any], what: T) -> None:
        self.command, self.row, self.what = command, row, what


Plan = Callable[[Book, list[dict[str, Any]]], Awaitable[list[Planned[T]]]]
"""Plans the commands for the rows read; may write other entities in the claim's transaction (the
bound book it is given), e.g. settle what a lapsed claim left open."""


async def read_rows(book: Book, query: sa.Select[Any], params: Mapping[str, Any], *, lock: bool) -> list[dict[str, Any]]:
    """The rows of a due scan (``query`` built once, with bind parameters); locked until the bound
    transaction ends when ``lock`` (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's write
    transaction already excludes other claimants)."""
    store = book.store
    async with store.reader(book.conn) as unit:
        return await store.select(unit, query, params, lock="skip_locked" if lock else None)


async def claim_set(book: Book, query: sa.Select[Any], params: Mapping[str, Any], plan: Plan[T]
                    ) -> list[tuple[T, Outcome]]:
    """Scan, plan and apply in ONE transaction; each planned item with its outcome (applied or
    ``conflict``). Rows are planned at most once each, in scan order."""
    async with book.begin() as tx:
        rows = await read_rows(tx, query, params, lock=True)
        planned = await plan(tx, rows)
        if not planned:
            return []
        seen = {p.command.entity_id: p.row for p in planned}
        # The scan locked and read these rows in this transaction: the compare-and-set is against them.
        outcomes = await apply_many(tx, [p.command for p in planned], lock="skip_locked", seen=seen)
    return [(p.what, outcome) for p, outcome in zip(planned, outcomes, strict=True)]


def won(done: Iterable[tuple[Any, Outcome]], counts: dict[str, int], claimed: str) -> list[Any]:
    """The leases a claim won, each with the head its claim left (:meth:`.lease.Lease.won`); ``counts``
    gets ``claimed`` once per lease and a settlement's name (what it planned instead) once per settlement."""
    leases = []
    for what, outcome in done:
        if not outcome.applied:
            continue
        if isinstance(what, Lease):
            leases.append(what.won(outcome))
            counts[claimed] += 1
        else:
            counts[what] += 1
    return leases


async def record_set(book: Book, planned: Sequence[tuple[Command, Head | None]]) -> list[bool | None]:
    """Apply fenced commands in ONE transaction (one transition each, compared against the given
    heads where there are some): True applied, False lost (``conflict``: written nothing), None
    could not be written (logged; the row keeps its claim, which lapses and is taken again). When the
    group fails as a whole — or names an entity twice — the commands are applied one by one."""
    ids = [command.entity_id for command, _ in planned]
    if len(set(ids)) == len(ids):
        try:
            seen = {c.entity_id: head for c, head in planned if head is not None}
            return [o.applied for o in await apply_many(book, [c for c, _ in planned], seen=seen)]
        except Exception:
            if len(planned) == 1:
                log.exception("could not record the outcome of %s %s", planned[0][0].entity_type, ids[0])
                return [None]
            log.warning("the group record failed; recording one by one", exc_info=True)
    done: list[bool | None] = []
    for command, head in planned:
        try:
            seen_one = {command.entity_id: head} if head is not None else None
            [outcome] = await apply_many(book, [command], seen=seen_one)
            done.append(outcome.applied)
        except Exception:
            log.exception("could not record the outcome of %s %s", command.entity_type, command.entity_id)
            done.append(None)
    return done
