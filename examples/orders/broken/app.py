"""The example's application with one deliberate bug: ``ship`` writes the status column itself.

A rush shipment "just sets the status" with plain SQL — no transition, no fact, no check that the
order was paid. The kit's machine must fail on it (tests/test_examples_orders.py shows how).
"""

from __future__ import annotations

import sqlalchemy as sa

from app import ORDER, cancel, orders, pay, place, registry  # noqa: F401 - the rest of the app is unchanged
from statebook.lifecycle import Book


async def ship(book: Book, order_id: str, tracking: str) -> None:
    """BROKEN: marks the order shipped with an UPDATE, paid or not."""
    async with book.begin() as tx:
        await tx.conn.execute(sa.update(orders).where(orders.c.id == order_id)
                              .values(status="shipped", tracking=tracking))
