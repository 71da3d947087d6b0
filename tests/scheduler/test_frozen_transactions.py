"""S16: a daemon frozen inside a transaction does not hold its rows for as long as it is frozen.

A leader stopped by SIGSTOP (or a paused VM) in the middle of any transaction (recording a run's end, say)
keeps its row locks while it is frozen; the standby takes the lease after it lapses, then waits behind those
locks. Found by ``test_leader_processes.py::test_sigstopped_leader_is_replaced_and_fires_nothing_after_waking``
(the new leader fired once, then waited 45 s). The daemon's sessions therefore carry PostgreSQL's
``idle_in_transaction_session_timeout`` at the scheduler lease: the server ends such a session, and its locks
go with it.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from statebook.adapters import daemon as daemon_module
from statebook.adapters.db import open_book, reset_schema
from statebook.adapters.settings import load_settings
from statebook.lifecycle import StatebookError
from statebook.outbox import enqueue_dispatch
from statebook.outbox.dispatch.schema import dispatch_outbox


async def _lock_and_freeze(pg_url: str, idle: float | None) -> tuple[bool, bool]:
    """A session locks a dispatch row and then waits, as a frozen client would. (Could another session lock the
    row 1.5 s later? Did the frozen session's next statement fail?)"""
    other = await open_book(pg_url)
    frozen = await open_book(pg_url, idle_transaction_seconds=idle)
    try:
        await reset_schema(other.engine)
        d = await enqueue_dispatch(other, kind="k", deliver_to="x")  # its id
        row = sa.select(dispatch_outbox.c.id).where(dispatch_outbox.c.id == d)
        async with frozen.engine.connect() as stuck:
            await stuck.begin()
            await stuck.execute(row.with_for_update())
            await asyncio.sleep(1.5)  # the client does nothing: idle in transaction
            async with other.engine.connect() as conn:
                try:
                    await conn.execute(row.with_for_update(nowait=True))
                    took = True
                except (DBAPIError, StatebookError):
                    took = False
                await conn.rollback()
            try:
                await stuck.execute(sa.select(1))
                ended = False
            except (DBAPIError, StatebookError):
                ended = True
        return took, ended
    finally:
        await frozen.engine.dispose()
        await other.engine.dispose()


@pytest.mark.postgres
async def test_a_session_idle_in_a_transaction_past_its_bound_is_ended_and_its_lock_released(pg_url):
    assert await _lock_and_freeze(pg_url, idle=0.5) == (True, True)


@pytest.mark.postgres
async def test_without_the_bound_the_frozen_session_keeps_its_lock(pg_url):
    """The control: a book opened without the bound (an application's, the CLI's) keeps the server's default."""
    assert await _lock_and_freeze(pg_url, idle=None) == (False, False)


async def test_the_daemon_bounds_its_sessions_by_the_scheduler_lease(tmp_path, monkeypatch):
    seen: dict[str, object] = {}
    real = daemon_module.open_book

    async def recording(*args, **kwargs):  # noqa: ANN002, ANN003
        seen.update(kwargs)
        return await real(*args, **kwargs)

    monkeypatch.setattr(daemon_module, "open_book", recording)
    settings = load_settings(None, db=f"sqlite:///{tmp_path / 'd.db'}",
                             scheduler={"lease_seconds": 42.0, "tick_seconds": 1.0})
    await daemon_module.run_daemon(settings, run_for=0.1)
    assert seen["idle_transaction_seconds"] == 42.0
