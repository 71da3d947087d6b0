"""O16 / L19: the outbox's operator tools follow the book's dispatch lifecycle, so an application that adds a
terminal status (specs/extending.md: ``cancelled``) can list, purge and retain those rows too."""

from __future__ import annotations

import uuid

import pytest

from sqlalchemy.engine import make_url

from statebook.adapters.db import connect, open_book
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Reason, edges, transition, verify
from statebook.outbox import apply_retention, enqueue_dispatch, list_dispatches, purge_dispatches
from statebook.outbox.dispatch.errors import DispatchInvalid


@pytest.fixture
async def own_url(db_url, backend):
    """A database of its own: the schema differs from the built-in one (its status CHECK admits more)."""
    if backend != "postgres":
        yield db_url
        return
    name = f"statebook_extended_{uuid.uuid4().hex[:10]}"  # xdist workers share the server: a name of its own
    admin = connect(db_url)
    async with admin.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield make_url(db_url).set(database=name).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.dispose()


@pytest.fixture
async def cancellable(own_url, clock):
    registry = builtin_registry(seal=False)
    registry.extend("dispatch", statuses=["cancelled"], terminal=["cancelled"],
                    edges=edges("pending", "cancelled", actors="operator"), reasons={"dispatch.cancelled.operator"})
    registry.seal()
    book = await open_book(own_url, registry=registry, clock=clock)
    try:
        yield book
    finally:
        await book.engine.dispose()


async def cancel(book, dispatch_id: str) -> None:
    outcome = await transition(book, "dispatch", dispatch_id, "cancelled", expected="pending",
                               reason=Reason("dispatch.cancelled.operator", "not needed"), actor=Actor("operator", "o"))
    assert outcome.applied


async def test_an_added_terminal_status_is_listed_purged_and_retained(cancellable, clock):
    book = cancellable
    kept = await enqueue_dispatch(book, kind="k", deliver_to="a")
    dropped = await enqueue_dispatch(book, kind="k", deliver_to="b")
    await cancel(book, dropped)
    assert [d.id for d in await list_dispatches(book, status="cancelled")] == [dropped]
    with pytest.raises(DispatchInvalid, match="cancelled"):  # the message lists the declared statuses
        await list_dispatches(book, status="canceled")
    clock.advance(10)
    assert await purge_dispatches(book, before=clock.now(), dry_run=True) == [dropped]  # terminal by default
    clock.advance(31 * 86400)
    counts = await apply_retention(book, now=clock.now())
    assert counts["cancelled"] == 1
    assert [d.id for d in await list_dispatches(book)] == [kept]
    assert (await verify(book, "dispatch")).ok
