"""Operator surface: inspection, retry refusals, audited single and bulk purge, retention."""

from __future__ import annotations

import pytest

from statebook.lifecycle import Actor, EntityNotFound, TransitionRejected, verify
from statebook.outbox import (
    DispatchInvalid,
    apply_retention,
    deliver_due_dispatches,
    enqueue_dispatch,
    expedite_dispatch,
    get_dispatch,
    list_dispatches,
    purge_dispatch,
    purge_dispatches,
    retry_dispatch,
)
from statebook.outbox.dispatch.attempts import scan
from statebook.outbox.dispatch.steps import claim

from .support import Recorder, facts, failing, moves, row

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
        assert [r.id for r in await list_dispatches(book)] == ids[::-1]
        assert [r.id for r in await list_dispatches(book, limit=2)] == ids[:1:-1]
        assert [r.id for r in await list_dispatches(book, status="delivered")] == ids[:1]
        assert await list_dispatches(book, status="acked") == []
        with pytest.raises(DispatchInvalid, match="unknown dispatch status 'done'"):
            await list_dispatches(book, status="done")
        with pytest.raises(DispatchInvalid, match="limit"):
            await list_dispatches(book, limit=0)
        assert isinstance((await get_dispatch(book, ids[0])).payload, dict)

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
        assert (await row(book, expiring)).status == "expired"
        with pytest.raises(TransitionRejected, match="'delivered'"):
            await retry_dispatch(book, pending)  # delivered now
        assert await retry_dispatch(book, expiring) is True
        assert (await row(book, expiring)).status == "pending"

    async def test_an_operator_expedites_a_pending_dispatch_waiting_out_its_backoff(self, book, clock):
        """O23: a pending dispatch waiting out its backoff (attempt 1 failed, due 60 s later) is made due now by
        ONE operator transition pending -> pending (``dispatch.pending.operator_expedited``) whose patch is the
        due time alone: the attempt count, its bound and the last error stay; the next pass sends it as
        attempt 2 at once; a retry of it is still refused (it is pending); verify passes."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", max_attempts=8)
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing("down")).transport)
        clock.advance(5)
        waiting = await row(book, did)
        assert (waiting.status, waiting.attempt, waiting.next_attempt_at.timestamp()) == ("pending", 1, clock.now() + 55)
        with pytest.raises(TransitionRejected, match="'pending'; only dead_letter or expired"):
            await retry_dispatch(book, did)
        assert await deliver_due_dispatches(book, transport=Recorder().transport) == {
            "attempted": 0, "delivered": 0, "dead_letter": 0, "expired": 0, "retried": 0}
        assert await expedite_dispatch(book, did, actor=Actor("operator", "ana")) is True
        now = await row(book, did)
        assert (now.status, now.attempt, now.max_attempts, now.next_attempt_at.timestamp(), now.last_error) == (
            "pending", 1, 8, clock.now(), "down")
        last = (await facts(book, did))[-1]
        assert (last.previous_status, last.status, last.reason_code) == ("pending", "pending",
                                                                        "dispatch.pending.operator_expedited")
        assert (last.actor_type, last.actor_id, last.patch) == ("operator", "ana", {"next_attempt_at": clock.now()})
        assert await expedite_dispatch(book, did) is True  # already due: nothing more to write
        assert len(await facts(book, did)) == 4
        sent = Recorder()
        assert (await deliver_due_dispatches(book, transport=sent.transport))["delivered"] == 1
        assert (await row(book, did)).attempt == 2 and len(sent.calls) == 1
        assert (await verify(book, "dispatch")).ok

    async def test_expedite_refuses_other_statuses_and_actors_without_writing(self, book, clock):
        """O23: only a pending dispatch is expedited. A missing one is ``EntityNotFound``; delivering, delivered,
        dead_letter (the hint names retry) and expired are ``TransitionRejected`` (rule ``status``); an actor that
        is not an operator is refused by the dispatch policy's operator-only edge (rule ``actor``); none writes."""
        with pytest.raises(EntityNotFound):
            await expedite_dispatch(book, "0" * 32)
        dead = await enqueue_dispatch(book, kind="k", deliver_to="dead", max_attempts=1)
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing()).transport)
        done = await enqueue_dispatch(book, kind="k", deliver_to="done")
        await deliver_due_dispatches(book, transport=Recorder().transport)
        held = await enqueue_dispatch(book, kind="k", deliver_to="held")
        [candidate] = await scan(book, now=clock.now())  # a live lease: the dispatch is being sent
        assert await claim(book, candidate, now=clock.now()) is not None
        for did, status in ((dead, "dead_letter"), (done, "delivered"), (held, "delivering")):
            with pytest.raises(TransitionRejected, match=f"'{status}'; only a pending dispatch") as caught:
                await expedite_dispatch(book, did)
            assert caught.value.rule == "status"
            if status == "dead_letter":
                assert "retry" in str(caught.value)
        waiting = await enqueue_dispatch(book, kind="k", deliver_to="wait")
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing()).transport)
        before = await facts(book, waiting)
        with pytest.raises(TransitionRejected) as caught:
            await expedite_dispatch(book, waiting, actor=Actor("system", "cron"))
        assert caught.value.rule == "actor"
        assert await facts(book, waiting) == before
        assert moves(before)[-1] == ("delivering", "pending", "dispatch.pending.transport_failed")
        assert (await verify(book, "dispatch")).ok

    async def test_facts_written_before_the_expedite_edge_verify(self, book, clock):
        """O23, L12c: the expedite edge changed the dispatch policy's fingerprint; ``DISPATCH`` accepts the
        declaration before it (``DISPATCH_V2``, itself accepting ``DISPATCH_V1``), so a database written until
        then verifies, its facts beside today's; a declaration accepting nothing reports them."""
        import dataclasses

        from statebook.lifecycle import Book, Registry
        from statebook.outbox import DISPATCH
        from statebook.outbox.dispatch.policy import DISPATCH_V1, DISPATCH_V2
        from statebook.scheduler import SCHEDULE, SCHEDULE_RUN

        assert DISPATCH.policy_for(DISPATCH_V2.fingerprint) is DISPATCH_V2
        assert DISPATCH.policy_for(DISPATCH_V1.fingerprint) is DISPATCH_V1
        assert DISPATCH.reasons - DISPATCH_V2.reasons == {"dispatch.pending.operator_expedited"}
        assert {(e.source, e.target) for e in DISPATCH.edges} - {(e.source, e.target) for e in DISPATCH_V2.edges} \
            == {("pending", "pending")}
        older = Book(book.engine, Registry([DISPATCH_V2, SCHEDULE, SCHEDULE_RUN]).seal(), clock)
        old = await enqueue_dispatch(older, kind="k", deliver_to="old")
        await deliver_due_dispatches(older, transport=Recorder(outcome=failing()).transport)
        assert {f.policy_fingerprint for f in await facts(book, old)} == {DISPATCH_V2.fingerprint}
        clock.advance(1)
        assert await expedite_dispatch(book, old) is True
        assert (await facts(book, old))[-1].policy_fingerprint == DISPATCH.fingerprint
        assert (await verify(book, "dispatch")).ok
        strict = Book(book.engine, Registry([dataclasses.replace(DISPATCH, accepts=()), SCHEDULE, SCHEDULE_RUN]).seal(),
                      clock)
        assert {f.kind for f in (await verify(strict, "dispatch")).findings} == {"unknown_policy"}

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
        assert (await row(book, live)).status == "pending"
        with pytest.raises(DispatchInvalid):
            await apply_retention(book, now=clock.now(), delivered_days=0)
        assert (await verify(book, "dispatch")).ok
