"""The order example under the kit: the kit's machine, a rule driving the application, one domain
invariant. This is the whole of what a team adds to its CI (run it with ``pytest examples/orders``)."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

import app
from statebook.adapters.db import open_book
from statebook.lifecycle import Book, TransitionConflict
from statebook.lifecycle.testing import LifecycleMachine


class OrdersMachine(LifecycleMachine):
    """The kit's machine on the order lifecycle, plus the application's own functions."""

    registry = app.registry
    entity_types = ("order",)  # the application's lifecycle; the built-ins are statebook's to test
    shop = app  # the application under test (tests/test_examples_orders.py swaps in a broken one)
    folder: Path = Path(".")
    numbers = itertools.count()

    async def make_book(self) -> Book:
        return await open_book(f"sqlite:///{self.folder}/orders-{next(self.numbers)}.db", registry=self.registry)

    @rule(data=st.data(), action=st.sampled_from(["place", "pay", "ship", "cancel", "refund"]))
    def the_application_acts(self, data: st.DataObject, action: str) -> None:
        """The application's functions on any order, in any state: whatever they do goes through the lifecycle."""
        orders = self.entities("order")
        if action == "place" or not orders:
            self.run(self.shop.place(self.book, data.draw(st.sampled_from(["ana", "bo"])),
                                     data.draw(st.sampled_from([5.0, 12.5, 40.0]))))
            return
        order = data.draw(st.sampled_from(orders)).entity_id
        try:
            if action == "pay":
                self.run(self.shop.pay(self.book, order, data.draw(st.sampled_from([1.0, 12.5, 40.0, 100.0]))))
            elif action == "ship":
                self.run(self.shop.ship(self.book, order, "TRACK-1"))
            else:
                self.run(self.shop.cancel(self.book, order, refund=action == "refund"))
        except TransitionConflict as exc:  # the order is not where the action starts: nothing was written
            assert exc.entity_id == order and exc.actual not in exc.expected, exc

    @invariant()
    def a_shipped_order_was_paid(self) -> None:
        """Domain rule: an order is shipped only after it was paid."""
        snap = self.snapshot()
        for key, row in snap.rows.items():
            if row is not None and row["status"] == "shipped":
                assert "paid" in [f.status for f in snap.facts[key]], f"{key} shipped but never paid"


def test_orders(tmp_path: Path) -> None:
    class OnDisk(OrdersMachine):
        folder = tmp_path

    OnDisk.run_as_test()
