"""Operator surface: inspection, retry refusals, audited single and bulk purge, retention."""

from __future__ import annotations

import pytest

from statebook.lifecycle import Actor, TransitionRejected, verify
from statebook.outbox import (
    DispatchInvalid,
    apply_retention,
    deliver_due_dispatches,
    enqueue_dispatch,
    get_dispatch,
    list_dispatches,
    purge_dispatch,
    purge_dispatches,
    retry_dispatch,
)

from dispatch_support import Recorder, facts, failing, row

DAY = 86400.0


class DispatchAdminCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_get_and_list_newest_first_with_a_validated_status(self, book, clock):
        """O19: get_dispatch is None on a miss; list_dispatches is newest first, filters by status,
        honours the limit and refuses an unknown status or a bad limit."""
        assert await get_dispatch(book, "0" * 32) is None
        ids = []
        for n in range(4):
            ids.append(await enqueue_dispatch(book, kind="k", deliver_to=f"r{n}"))
            clock.advance(1)
        await deliver_due_dispatches(book, transport=Recorder().transport, batch_size=1)  # oldest -> delivered
        assert [r["id"] for r in await list_dispatches(book)] == ids[::-1]
        assert [r["id"] for r in await list_dispatches(book, limit=2)] == ids[:1:-1]
        assert [r["id"] for r in await list_dispatches(book, status="delivered")] == ids[:1]
        assert await list_dispatches(book, status="acked") == []
        with pytest.raises(DispatchInvalid, match="unknown dispatch status 'done'"):
            await list_dispatches(book, status="done")
        with pytest.raises(DispatchInvalid, match="limit"):
            await list_dispatches(book, limit=0)
        assert isinstance((await get_dispatch(book, ids[0]))["payload"], dict)

    async def test_retry_refuses_live_and_successful_rows_without_writing(self, book, clock):
        """O15: retry accepts only dead_letter or expired; another status is refused
        (TransitionRejected, rule ``status``) and nothing is written; a missing row is a LookupError;
        an expired row can be retried."""
        with pytest.raises(LookupError):
            await retry_dispatch(book, "0" * 32)
        pending = await enqueue_dispatch(book, kind="k", deliver_to="r")
        with pytest.raises(TransitionRejected, match="'pending'; only dead_letter or expired") as caught:
            await retry_dispatch(book, pending)
        assert caught.value.rule == "status"
        assert len(await facts(book, pending)) == 1
        expiring = await enqueue_dispatch(book, kind="k", deliver_to="x", expires_at=clock.now() + 1)
        clock.advance(1)
        await deliver_due_dispatches(book, transport=Recorder().transport)
        assert (await row(book, expiring))["status"] == "expired"
        with pytest.raises(TransitionRejected, match="'delivered'"):
            await retry_dispatch(book, pending)  # delivered now
        assert await retry_dispatch(book, expiring) is True
        assert (await row(book, expiring))["status"] == "pending"

    async def test_single_purge_refuses_live_rows_unless_forced(self, book):
        """O16: purging a pending row is refused (TransitionRejected, nothing written) unless forced;
        the forced tombstone records that it was forced."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r")
        with pytest.raises(TransitionRejected, match="force"):
            await purge_dispatch(book, did)
        assert len(await facts(book, did)) == 1
        assert await purge_dispatch(book, did, force=True) is True
        assert (await facts(book, did))[-1].metadata == {"forced": True}
        assert (await verify(book, "dispatch")).ok

    async def test_bulk_purge_defaults_to_terminal_rows_before_the_cutoff(self, book, clock):
        """O16 (do-better 6): bulk purge takes terminal rows last changed before ``before``; dry-run
        lists them and writes nothing; non-terminal statuses are refused without force; each purge
        leaves a tombstone by the operator and the history verifies."""
        old_ok = await enqueue_dispatch(book, kind="k", deliver_to="a")
        old_dead = await enqueue_dispatch(book, kind="k", deliver_to="b", max_attempts=1)
        await deliver_due_dispatches(book, transport=Recorder(outcome=lambda to, _n: to == "a").transport)
        cutoff = clock.now() + 1
        clock.advance(10)
        live = await enqueue_dispatch(book, kind="k", deliver_to="c")
        young = await enqueue_dispatch(book, kind="k", deliver_to="a")
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing()).transport)  # live, young: pending
        clock.advance(60)
        await deliver_due_dispatches(book, transport=Recorder().transport)  # both delivered, after the cutoff

        wanted = {old_ok, old_dead}
        assert set(await purge_dispatches(book, before=cutoff, dry_run=True)) == wanted
        assert await get_dispatch(book, old_ok) is not None
        with pytest.raises(TransitionRejected, match="pending"):
            await purge_dispatches(book, before=clock.now() + 1, statuses=["pending", "delivered"])
        with pytest.raises(DispatchInvalid, match="unknown dispatch status"):
            await purge_dispatches(book, before=cutoff, statuses=["gone"])
        assert set(await purge_dispatches(book, before=cutoff, actor=Actor("operator", "carol"))) == wanted
        for did in wanted:
            assert await get_dispatch(book, did) is None
            last = (await facts(book, did))[-1]
            assert (last.status, last.reason_code, last.actor_id) == (None, "dispatch.purged.operator", "carol")
        assert await get_dispatch(book, live) is not None and await get_dispatch(book, young) is not None
        assert (await verify(book, "dispatch")).ok

    async def test_bulk_purge_of_live_rows_needs_force(self, book, clock):
        """O16: with force a bulk purge may take pending rows."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r")
        clock.advance(5)
        assert await purge_dispatches(book, before=clock.now(), statuses=["pending"], force=True) == [did]
        assert await get_dispatch(book, did) is None

    async def test_retention_purges_settled_rows_by_age_and_status(self, book, clock):
        """O16 (do-better 6), O17: retention purges delivered/acked rows older than delivered_days and
        dead_letter/expired rows older than failed_days, as system:retention with the retention reason;
        younger rows and live rows stay."""
        delivered = await enqueue_dispatch(book, kind="k", deliver_to="ok")
        dead = await enqueue_dispatch(book, kind="k", deliver_to="bad", max_attempts=1)
        await deliver_due_dispatches(book, transport=Recorder(outcome=lambda to, _n: to == "ok").transport)
        live = await enqueue_dispatch(book, kind="k", deliver_to="later", expires_at=clock.now() + 365 * DAY)
        clock.advance(8 * DAY)
        assert await apply_retention(book, now=clock.now()) == {"delivered": 1, "acked": 0, "dead_letter": 0, "expired": 0}
        assert await get_dispatch(book, delivered) is None and await get_dispatch(book, dead) is not None
        clock.advance(23 * DAY)
        assert (await apply_retention(book, now=clock.now(), failed_days=30))["dead_letter"] == 1
        tomb = (await facts(book, dead))[-1]
        assert (tomb.status, tomb.reason_code, tomb.actor_type, tomb.actor_id) == (
            None, "dispatch.purged.retention", "system", "retention",
        )
        assert (await row(book, live))["status"] == "pending"
        with pytest.raises(DispatchInvalid):
            await apply_retention(book, now=clock.now(), delivered_days=0)
        assert (await verify(book, "dispatch")).ok
