"""An order lifecycle and the application code that drives it (the kit's worked example).

``registry`` is what the CLI and the kit take (``--app app:registry``): the built-in lifecycles and
``order``, as an application's registry is (docs/tutorial.md); ``place``, ``pay``, ``ship``
and ``cancel`` are the application: each one is a guarded transition through the lifecycle API,
never a write of its own to the ``orders`` table. An order in another status than the one an action
expects raises ``TransitionConflict`` (naming the status it has) and nothing is written.
"""

from __future__ import annotations

import sqlalchemy as sa

from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Book, Lifecycle, Outcome, Reason, create, edges, managed_table, transition

META = sa.MetaData()

orders = managed_table(
    "orders",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("customer", sa.Text, nullable=False),
    sa.Column("total", sa.Float, nullable=False),
    sa.Column("paid_amount", sa.Float, nullable=True),
    sa.Column("tracking", sa.Text, nullable=True),
    meta=META,
)

ORDER = Lifecycle(
    entity_type="order",
    table=orders,
    statuses=("placed", "paid", "shipped", "cancelled"),
    initial={"placed"},
    terminal={"shipped", "cancelled"},
    edges=(
        *edges("placed", "paid", patch="paid_amount"),
        *edges("placed", "cancelled"),
        *edges("paid", "shipped", actors="warehouse", patch="tracking"),
        *edges("paid", "cancelled", actors="operator"),  # a refund
    ),
    patch_fields={"paid_amount", "tracking"},
    reason_prefixes={"order"},
    reasons={"order.placed.new", "order.paid.card", "order.shipped.courier", "order.cancelled.customer",
             "order.cancelled.refund", "order.purged.retention"},
    description="An order: placed, paid, shipped — or cancelled (after payment only by an operator).",
)

registry = builtin_registry(seal=False)  # statebook's own lifecycles (dispatch, schedule, notifications, ...)
registry.register(ORDER)                 # ... and the application's
registry.seal()

WAREHOUSE = Actor("warehouse", "main")


async def place(book: Book, customer: str, total: float) -> str:
    """A new order; returns its id."""
    out = await create(book, "order", values={"customer": customer, "total": total}, status="placed",
                       reason=Reason("order.placed.new"), actor=Actor("customer", customer))
    return out.entity_id


async def pay(book: Book, order_id: str, amount: float) -> Outcome | None:
    """Record a payment; an amount short of the total is refused (None); an order no longer ``placed``
    raises ``TransitionConflict``."""
    async with book.begin() as tx:
        row = (await tx.conn.execute(sa.select(orders.c.total).where(orders.c.id == order_id))).first()
        if row is None or amount < row.total:
            return None
        return await transition(tx, "order", order_id, "paid", expected="placed", patch={"paid_amount": amount},
                                reason=Reason("order.paid.card"), actor=Actor("customer", "payer"))


async def ship(book: Book, order_id: str, tracking: str) -> Outcome:
    """Hand a paid order to the courier (``TransitionConflict`` when it is not paid)."""
    return await transition(book, "order", order_id, "shipped", expected="paid", patch={"tracking": tracking},
                            reason=Reason("order.shipped.courier"), actor=WAREHOUSE)


async def cancel(book: Book, order_id: str, *, refund: bool = False) -> Outcome:
    """Cancel a placed order, or (``refund``) refund and cancel a paid one as an operator
    (``TransitionConflict`` when the order is in neither)."""
    if refund:
        return await transition(book, "order", order_id, "cancelled", expected="paid",
                                reason=Reason("order.cancelled.refund"), actor=Actor("operator", "desk"))
    return await transition(book, "order", order_id, "cancelled", expected="placed",
                            reason=Reason("order.cancelled.customer"), actor=Actor("customer", "self"))
