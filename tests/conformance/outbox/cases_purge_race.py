"""O16: a purge whose row changed version between its read and its delete is a conflict (issue 9 s. 5).

The race is real, with no hook into the engine: an operator retry (dead_letter -> pending, a new
version) holds its transaction open while a purge of the dead letter starts on another connection.

- PostgreSQL: the purge reads the committed dead letter and its delete waits on the retry's row
  lock; the test waits until the server shows it waiting, then commits the retry. Only the delete's
  version condition stops it: without it the purge deletes the retried row and its tombstone
  collides with the retry's fact on the chain (an ``IntegrityError``).
- SQLite has one writer: the purge's transaction (``BEGIN IMMEDIATE``) starts only after the retry
  commits, so the purge always reads the new version and the race cannot reach the delete. The same
  test then checks the contract as SQLite can show it — conflict, the retried row intact — but it
  cannot tell whether the version condition is there (the PostgreSQL leg does).
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from statebook.lifecycle import Actor, Reason, TransitionConflict, TransitionRejected, purge, verify
from statebook.outbox import deliver_due_dispatches, enqueue_dispatch, purge_dispatch, retry_dispatch

from .support import Recorder, facts, failing, row

OPERATOR = Actor("operator", "test")
PURGED = Reason("dispatch.purged.operator", "purged by an operator")


async def _dead_letter(book) -> str:
    did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", max_attempts=1)
    await deliver_due_dispatches(book, transport=Recorder(outcome=failing("down")).transport)
    assert (await row(book, did)).status == "dead_letter"
    return did


async def _until_waiting_on_a_lock(book, task: asyncio.Future) -> None:
    """Return once PostgreSQL shows a backend of this database waiting on a lock (or the task ended)."""
    query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")
    for _ in range(1000):
        if task.done():
            return
        async with book.read() as conn:
            if (await conn.execute(query)).scalar():
                return
        await asyncio.sleep(0.01)
    pytest.fail("the purge never waited on the retry's row lock")


async def _purge_by_lifecycle(book, did):
    try:
        return (await purge(book, "dispatch", did, reason=PURGED, actor=OPERATOR, expected="dead_letter")).kind
    except TransitionConflict as lost:  # read after the retry committed: the row is pending
        assert lost.actual == "pending", lost
        return lost.outcome.kind


async def _purge_by_admin(book, did):
    try:
        return "applied" if await purge_dispatch(book, did, actor=OPERATOR) else "conflict"
    except TransitionRejected:  # SQLite: read after the retry committed, the row is pending (live)
        return "conflict"


class PurgeRaceCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    @pytest.mark.parametrize("purging", [_purge_by_lifecycle, _purge_by_admin], ids=["lifecycle.purge", "purge_dispatch"])
    async def test_a_purge_racing_a_retry_is_a_conflict_not_a_deleted_row(self, book, backend, purging):
        """O16, O15 (issue 9 section 5): a purge that read the dead letter before a concurrent retry
        committed is a ``conflict`` — never an IntegrityError, never a deleted retried row. The row stays
        pending with the retry as its last fact, no tombstone is written, and the history verifies."""
        did = await _dead_letter(book)
        async with book.begin() as tx:
            assert await retry_dispatch(tx, did, actor=OPERATOR)
            task = asyncio.ensure_future(purging(book, did))
            if backend == "postgres":
                await _until_waiting_on_a_lock(book, task)
            else:
                await asyncio.sleep(0)  # let the purge begin; it waits for this writer to commit
            assert not task.done(), "the purge did not wait for the open retry"
        assert await task == "conflict"

        r = await row(book, did)
        assert (r.status, r.attempt) == ("pending", 0)
        found = await facts(book, did)
        assert found[-1].reason_code == "dispatch.pending.operator_retry"
        assert all(f.status is not None for f in found)
        assert (await verify(book, "dispatch")).ok
