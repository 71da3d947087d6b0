"""Enqueue: the envelope, atomicity, deduplication (also racing on PostgreSQL) and validation."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from statebook.adapters.db import connect
from statebook.lifecycle import Book, verify
from statebook.outbox import (
    DispatchSignal,
    dispatch_outbox,
    enqueue_dispatch,
    enqueue_dispatches,
)

from statebook.lifecycle.codec import dumps
from statebook.outbox.dispatch.signal import dispatch_envelope, with_attempt

from conformance.outbox.support import facts, moves

from conformance.outbox.cases_dispatch_enqueue import _until_waiting_on_a_lock, counts


@pytest.mark.postgres
async def test_two_postgres_producers_racing_one_key_get_the_one_committed_id(pg_url, clock):
    """O3 (do-better 2): producer A inserts the key in an open transaction; producer B, on another
    connection, misses A's uncommitted row, its insert waits on the unique index; when A commits,
    B returns A's id. One row, one creation fact. Without the conflict path B would fail."""
    from statebook.adapters.db import open_book, reset_schema

    base = await open_book(pg_url, clock=clock)
    other = Book(connect(pg_url), base.registry, clock)
    try:
        await reset_schema(base.engine)
        async with base.begin() as tx:
            a = await enqueue_dispatch(tx, kind="k", deliver_to="r", dedup_key="race")
            b_task = asyncio.ensure_future(enqueue_dispatch(other, kind="k2", deliver_to="r2", dedup_key="race"))
            await _until_waiting_on_a_lock(base, b_task)
            assert not b_task.done()
        b = await asyncio.wait_for(b_task, 30)
        assert a == b
        async with base.read() as conn:
            ids = (await conn.execute(sa.select(dispatch_outbox.c.id))).scalars().all()
        assert ids == [a]
        assert moves(await facts(base, a)) == [(None, "pending", "dispatch.pending.enqueued")]
        assert (await verify(base, "dispatch")).ok
    finally:
        await other.engine.dispose()
        await base.engine.dispose()


@pytest.mark.postgres
async def test_a_batch_racing_a_producer_on_one_key_gets_the_committed_id(pg_url, clock):
    """O3 (do-better 2): a batch enqueue whose multi-row insert waits on another producer's
    uncommitted key returns that producer's id for every item with the key, and still creates
    its other rows."""
    from statebook.adapters.db import open_book, reset_schema

    base = await open_book(pg_url, clock=clock)
    other = Book(connect(pg_url), base.registry, clock)
    try:
        await reset_schema(base.engine)
        async with base.begin() as tx:
            a = await enqueue_dispatch(tx, kind="k", deliver_to="r", dedup_key="race")
            batch = asyncio.ensure_future(enqueue_dispatches(other, [
                {"kind": "k", "deliver_to": "x", "dedup_key": "race"},
                {"kind": "k", "deliver_to": "y"},
                {"kind": "k", "deliver_to": "z", "dedup_key": "race"},
            ]))
            await _until_waiting_on_a_lock(base, batch)
        ids = await asyncio.wait_for(batch, 30)
        assert ids[0] == ids[2] == a != ids[1]
        assert await counts(base) == (2, 2)
        assert (await verify(base, "dispatch")).ok
    finally:
        await other.engine.dispose()
        await base.engine.dispose()


@given(
    created_at=st.one_of(st.integers(0, 2**40), st.floats(0, 1e12, allow_nan=False)),
    kind=st.text(min_size=1), deliver_to=st.text(min_size=1), token=st.one_of(st.none(), st.text()),
    body=st.dictionaries(st.text(), st.one_of(st.none(), st.booleans(), st.integers(), st.text()), max_size=4),
)
def test_the_fast_envelope_is_the_models_json(created_at, kind, deliver_to, token, body):
    """O1: the enqueue path's envelope (built without the pydantic model) equals DispatchSignal(...).to_json()."""
    fast = dispatch_envelope(created_at=created_at, dispatch_id="d" * 32, kind=kind, deliver_to=deliver_to,
                             ack_token=token, body=body)
    model = DispatchSignal(id=fast["id"], created_at=created_at, dispatch_id="d" * 32, kind=kind,
                           deliver_to=deliver_to, ack_token=token, body=body).to_json()
    assert fast == model
    assert [type(v) for v in fast.values()] == [type(v) for v in model.values()]


@given(
    attempt=st.integers(1, 10_000), token=st.one_of(st.none(), st.just("ab" * 16)),
    body=st.dictionaries(st.sampled_from(["attempt", "a", "zz", "ack_token"]), st.one_of(st.integers(), st.text()),
                         max_size=3),
    legacy=st.booleans(), spaced=st.booleans(),
)
def test_each_attempt_sends_the_stored_envelope_with_its_attempt(attempt, token, body, legacy, spaced):
    """O1: the text an attempt sends is the stored envelope's with ``attempt`` (the top-level field alone) set to
    the attempt being made — for today's envelope, one an older statebook stored (schema 1, a class marker),
    and stored text not in canonical form (spaces): equal as JSON, and byte for byte the stored text but the
    attempt when it is canonical. A body's own ``attempt`` is left alone."""
    envelope = dispatch_envelope(created_at=1.5, dispatch_id="d" * 32, kind="k", deliver_to="r", ack_token=token,
                                 body=body)
    if legacy:
        envelope = {**envelope, "schema_version": 1, "metadata": {"class": "statebook.outbox.DispatchSignal"}}
    stored = json.dumps(envelope) if spaced else dumps(envelope)
    sent = with_attempt(stored, attempt)
    assert json.loads(sent) == {**envelope, "attempt": attempt}
    if not spaced:
        assert sent == stored.replace('"attempt":0,', f'"attempt":{attempt},', 1)
