"""O16: bulk purge and retention are set-based and report progress (issue: 150,000 rows took 570 s,
one transaction per row, with no output)."""

from __future__ import annotations

from statebook.lifecycle import verify
from statebook.outbox import apply_retention, deliver_due_dispatches, enqueue_dispatches, purge_dispatches
from statebook.outbox.dispatch import admin

from .support import Recorder, facts


def count_purge_batches(monkeypatch) -> list[int]:
    """Record the size of each ``purge_many`` call the outbox makes."""
    calls: list[int] = []
    real = admin.purge_many

    async def counting(*args, **kw):
        calls.append(len(args[2]))
        return await real(*args, **kw)

    monkeypatch.setattr(admin, "purge_many", counting)
    return calls


async def settled(book, clock, n: int) -> list[str]:
    ids = await enqueue_dispatches(book, [{"kind": "k", "deliver_to": f"seat-{i}"} for i in range(n)])
    while await deliver_due_dispatches(book, transport=Recorder().transport, batch_size=500) != {
        "attempted": 0, "delivered": 0, "dead_letter": 0, "expired": 0, "retried": 0,
    }:
        pass
    clock.advance(10)
    return ids


class BulkPurgeCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_bulk_purge_runs_in_batches_with_progress_and_tombstones(self, book, clock, monkeypatch):
        """O16: a bulk purge of 1,100 rows runs PURGE_BATCH rows per transaction (three purge_many calls, not
        1,100 purges), reports (done, total) after each batch up to the total, and every row keeps its
        tombstone; the history verifies."""
        ids = await settled(book, clock, 1100)
        calls = count_purge_batches(monkeypatch)
        seen: list[tuple[int, int]] = []
        purged = await purge_dispatches(book, before=clock.now(), progress=lambda done, total: seen.append((done, total)))
        assert sorted(purged) == sorted(ids)
        assert calls == [500, 500, 100]
        assert seen == [(500, 1100), (1000, 1100), (1100, 1100)]
        assert [f.status for f in await facts(book, ids[-1])][-1] is None
        assert (await verify(book, "dispatch")).ok

    async def test_retention_is_set_based_too(self, book, clock, monkeypatch):
        """O16: retention purges through the same batches (one purge_many per batch of delivered rows)."""
        await settled(book, clock, 600)
        calls = count_purge_batches(monkeypatch)
        clock.advance(8 * 86400)
        counts = await apply_retention(book, now=clock.now())
        assert counts["delivered"] == 600 and calls == [500, 100]
        assert (await verify(book, "dispatch")).ok
