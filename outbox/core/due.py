"""The due scan of a deliverable lifecycle: which rows are due, in which order, and when the next is.

A :class:`DueScan` is declared once per lifecycle (dispatches, notifications) from its table, the
statuses that are due and the scan's order; it gives the one compiled scan every claim runs (with
bound ``b_now``/``b_limit``, and each row's head, so a claim compares without a second read) and
the next due time a worker sleeps until.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, head_columns
from statebook.lifecycle.head import HEAD
from statebook.lifecycle.schema import status_in

__all__ = ["DueScan"]


class DueScan:
    """The due rows of ``table``: a status in ``statuses`` and ``next_attempt_at <= now``, in ``order``.

    ``active`` is literal SQL, so PostgreSQL can match the partial due index (bound parameters cannot);
    ``query`` selects ``columns`` and the row's head (:func:`~statebook.lifecycle.head_columns`)."""

    def __init__(self, table: sa.Table, statuses: Iterable[str], columns: Sequence[Any],
                 order: Sequence[Any]) -> None:
        self.table = table
        self.statuses = tuple(statuses)
        self.active = sa.text(status_in(f"{table.name}.status", self.statuses))
        picked = [c for c in columns if c.name not in HEAD]
        self.query = (
            sa.select(*picked, *head_columns(table))
            .where(self.active, table.c.next_attempt_at <= sa.bindparam("b_now", type_=sa.Float))
            .order_by(*order)
            .limit(sa.bindparam("b_limit", type_=sa.Integer))
        )

    @staticmethod
    def params(now: float, limit: int) -> dict[str, Any]:
        """The scan's bound values."""
        return {"b_now": now, "b_limit": limit}

    async def next_due(self, book: Book) -> float | None:
        """The earliest ``next_attempt_at`` of any row in a due status (None when idle)."""
        t = self.table
        async with book.read() as conn:
            earliest: float | None = (
                await conn.execute(sa.select(sa.func.min(t.c.next_attempt_at)).where(self.active))).scalar()
            return earliest
