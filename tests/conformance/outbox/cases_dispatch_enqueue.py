"""Enqueue: the envelope, atomicity, deduplication (also racing on PostgreSQL) and validation."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect
from statebook.lifecycle import Book, StatebookError, verify
from statebook.lifecycle.facts import facts_table
from statebook.outbox import (
    DispatchInvalid,
    DispatchSignal,
    deliver_due_dispatches,
    dispatch_outbox,
    enqueue_dispatch,
    enqueue_dispatches,
    enqueue_revival_heartbeat,
)
from statebook.outbox.dispatch.signal import SIGNAL_SCHEMA_VERSION


from .support import Recorder, facts, row

HEX32 = re.compile(r"^[0-9a-f]{32}$")


async def counts(book: Book) -> tuple[int, int]:
    async with book.read() as conn:
        rows = (await conn.execute(sa.select(sa.func.count()).select_from(dispatch_outbox))).scalar_one()
        found = (await conn.execute(sa.select(sa.func.count()).select_from(facts_table))).scalar_one()
    return rows, found


async def _until_waiting_on_a_lock(book: Book, task: asyncio.Future, attempts: int = 400) -> None:
    query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")
    engine = connect(book.engine.url.render_as_string(hide_password=False))
    try:
        for _ in range(attempts):
            if task.done():
                raise AssertionError(f"the second producer finished without waiting: {task.result()!r}")
            async with engine.connect() as conn:
                if (await conn.execute(query)).scalar_one() > 0:
                    return
            await asyncio.sleep(0.025)
        raise AssertionError("the second producer never waited on the first one's uncommitted key")
    finally:
        await engine.dispose()


INVALID = [
    ({"kind": ""}, "kind"),
    ({"kind": "a\x00b"}, "NUL"),
    ({"deliver_to": "   "}, "deliver_to"),
    ({"deliver_to": "seat\x00"}, "NUL"),
    ({"deliver_to": None}, "deliver_to"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": -3}, "max_attempts"),
    ({"max_attempts": 2.5}, "max_attempts"),
    ({"body": ["not", "an", "object"]}, "JSON object"),
    ({"body": "text"}, "JSON object"),
    ({"body": {"x": {1, 2}}}, "JSON"),
    ({"body": {"x": float("nan")}}, "JSON"),
    ({"body": {1: "int key"}}, "JSON keys are text"),
    ({"expires_at": float("inf")}, "expires_at"),
    ({"dedup_key": ""}, "dedup_key"),
    ({"ack_required": "yes"}, "ack_required"),
]


class DispatchEnqueueCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_a_wake_up_on_an_unbound_book_opens_no_write_transaction(self, book, monkeypatch):
        """O14: ``notify`` on an unbound book is one statement outside any transaction on PostgreSQL and nothing
        at all on SQLite (whose workers are woken in process) — never a write transaction held for nothing."""
        from statebook.outbox.dispatch.enqueue import notify

        store_type = type(book.store)
        own_unit = store_type.own_unit
        opened: list[bool] = []

        def spy(self, one_statement, _own=own_unit):
            opened.append(one_statement)
            return _own(self, one_statement)

        monkeypatch.setattr(store_type, "own_unit", spy)
        await notify(book)
        assert opened == ([True] if book.store.dialect == "postgresql" else [])

    async def test_envelope_is_a_versioned_signal_serialised_once(self, book, clock):
        """O1: the stored payload is a DispatchSignal in JSON mode (schema 2) with its own id, the book clock's
        created_at, ``attempt`` 0 (none made yet) and no implementation detail (no class marker in
        ``metadata``); every attempt sends that stored text with ``attempt`` set to the attempt being made —
        1 on the first (it said 0 before), 2 on the second — and not one other byte changed."""
        did = await enqueue_dispatch(book, kind="terminal_notify", deliver_to="seat-1", body={"n": 1, "s": "x"})
        stored = (await row(book, did)).payload
        assert stored["metadata"] == {}
        assert "DispatchSignal" not in json.dumps(stored)
        assert HEX32.match(stored["id"]) and stored["id"] != did
        assert stored["created_at"] == clock.now()
        assert stored["schema_version"] == SIGNAL_SCHEMA_VERSION == 2
        assert (stored["dispatch_id"], stored["kind"], stored["deliver_to"]) == (did, "terminal_notify", "seat-1")
        assert (stored["attempt"], stored["ack_token"], stored["body"]) == (0, None, {"n": 1, "s": "x"})
        assert (stored["data"], stored["emitter_role"]) == (None, None)
        assert DispatchSignal.model_validate(stored).to_json() == stored
        assert DispatchSignal.model_validate({**stored, "added_later": 1}).to_json() == stored  # additions not breaking

        rec = Recorder(outcome=lambda _to, n: n > 0)  # fail once, then succeed
        await deliver_due_dispatches(book, transport=rec.transport)
        clock.advance(3600)
        await deliver_due_dispatches(book, transport=rec.transport)
        assert len(rec.calls) == 2
        first, second = (p for _, p in rec.calls)
        assert json.loads(first) == {**stored, "attempt": 1}
        assert json.loads(second) == {**stored, "attempt": 2}
        assert first.replace('"attempt":1', '"attempt":2', 1) == second  # stored once: only the attempt differs
        assert (await row(book, did)).payload == stored  # the stored envelope is never rewritten

    async def test_ids_are_32_hex_and_a_token_exists_only_when_required(self, book):
        """O2: dispatch ids are 32 hex; an ack token (32 hex) is generated only for ack_required, and
        the row and the envelope hold the same token."""
        plain = await enqueue_dispatch(book, kind="k", deliver_to="r")
        acked = await enqueue_dispatch(book, kind="k", deliver_to="r", ack_required=True)
        assert HEX32.match(plain) and HEX32.match(acked)
        p, a = await row(book, plain), await row(book, acked)
        assert p.ack_token is None and p.ack_required is False
        token = a.ack_token.get_secret_value()
        assert HEX32.match(token) and a.payload["ack_token"] == token and a.ack_required is True

    async def test_enqueue_commits_the_row_and_its_creation_fact(self, book, clock):
        """O2, O17: the row and its creation fact (dispatch.pending.enqueued by system:enqueue_dispatch,
        summary naming the kind) commit together; the row is due now with attempt 0."""
        did = await enqueue_dispatch(book, kind="terminal_notify", deliver_to="seat-1")
        r = await row(book, did)
        assert (r.status, r.attempt, r.max_attempts, r.next_attempt_at.timestamp()) == ("pending", 0, 8, clock.now())
        [fact] = await facts(book, did)
        assert (fact.previous_status, fact.status, fact.reason_code) == (None, "pending", "dispatch.pending.enqueued")
        assert fact.reason_summary == "enqueued kind=terminal_notify"
        assert (fact.actor_type, fact.actor_id) == ("system", "enqueue_dispatch")
        assert (await verify(book, "dispatch")).ok

    async def test_enqueue_joins_the_callers_transaction_and_rolls_back_with_it(self, book):
        """O2: enqueue given a bound book commits or rolls back with the caller's transaction."""

        class Abort(Exception):
            pass

        with pytest.raises(Abort):
            async with book.begin() as tx:
                await enqueue_dispatch(tx, kind="k", deliver_to="r")
                await enqueue_dispatch(tx, kind="k", deliver_to="r", dedup_key="kept?")
                raise Abort
        assert await counts(book) == (0, 0)
        async with book.begin() as tx:
            did = await enqueue_dispatch(tx, kind="k", deliver_to="r", dedup_key="kept")
        assert (await row(book, did)).dedup_key == "kept"
        assert await counts(book) == (1, 1)

    async def test_a_dedup_hit_returns_the_first_id_and_writes_nothing(self, book):
        """O3: the first committed row wins the key; a later enqueue with other arguments returns its
        id and adds no row and no fact; without a key every call creates a row."""
        first = await enqueue_dispatch(book, kind="a", deliver_to="r1", dedup_key="key-1")
        before = await counts(book)
        again = await enqueue_dispatch(book, kind="b", deliver_to="r2", dedup_key="key-1", ack_required=True)
        assert again == first
        assert await counts(book) == before
        assert (await row(book, first)).kind == "a"
        x = await enqueue_dispatch(book, kind="a", deliver_to="r1")
        y = await enqueue_dispatch(book, kind="a", deliver_to="r1")
        assert x != y

    async def test_dedup_inside_one_transaction_sees_its_own_row(self, book):
        """O3: two enqueues of one key in the caller's transaction give one row."""
        async with book.begin() as tx:
            a = await enqueue_dispatch(tx, kind="k", deliver_to="r", dedup_key="same")
            b = await enqueue_dispatch(tx, kind="k", deliver_to="r", dedup_key="same")
        assert a == b
        assert await counts(book) == (1, 1)

    @pytest.mark.parametrize(("override", "mentions"), INVALID, ids=[repr(o)[:40] for o, _ in INVALID])
    async def test_invalid_enqueue_is_refused_with_a_clear_error_and_writes_nothing(self, book, override, mentions):
        """O4 (do-better 3): each invalid argument raises DispatchInvalid — a ValueError and a
        StatebookError — whose message names the problem; no row and no fact is written."""
        args = {"kind": "k", "deliver_to": "seat-1", **override}
        with pytest.raises(DispatchInvalid, match=re.escape(mentions)) as caught:
            await enqueue_dispatch(book, **args)
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, StatebookError)
        assert await counts(book) == (0, 0)

    async def test_an_expiry_already_past_is_refused_but_a_dedup_hit_still_returns_its_id(self, book, clock):
        """O4, O3: expires_at <= now is refused (nothing written); an existing key's id is returned
        even when the repeated call's expiry has passed since (repeating producers stay idempotent)."""
        with pytest.raises(DispatchInvalid, match="not in the future"):
            await enqueue_dispatch(book, kind="k", deliver_to="r", expires_at=clock.now())
        assert await counts(book) == (0, 0)
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", dedup_key="hb", expires_at=clock.now() + 10)
        clock.advance(60)
        assert await enqueue_dispatch(book, kind="k", deliver_to="r", dedup_key="hb", expires_at=clock.now() - 50) == did

    async def test_batch_enqueue_is_one_transaction_with_dedup_kept(self, book):
        """O2, O3, O4: enqueue_dispatches returns ids in input order (a repeated key gives the first id),
        and one invalid item refuses the whole batch before anything is written."""
        with pytest.raises(DispatchInvalid, match=re.escape("items[2].max_attempts")):
            await enqueue_dispatches(book, [{"kind": "k", "deliver_to": "a"}, {"kind": "k", "deliver_to": "b"},
                                            {"kind": "k", "deliver_to": "c", "max_attempts": 0}])
        with pytest.raises(DispatchInvalid, match="unknown argument"):
            await enqueue_dispatches(book, [{"kind": "k", "deliver_to": "a", "colour": "red"}])
        assert await counts(book) == (0, 0)
        ids = await enqueue_dispatches(
            book,
            [{"kind": "k", "deliver_to": "a", "dedup_key": "d"}, {"kind": "k", "deliver_to": "b"},
             {"kind": "k", "deliver_to": "c", "dedup_key": "d"}],
        )
        assert len(ids) == 3 and ids[0] == ids[2] != ids[1]
        assert await counts(book) == (2, 2)
        assert await enqueue_dispatches(book, []) == []

    async def test_revival_heartbeat_is_one_ping_per_seat_deduplicated_per_epoch(self, book, clock):
        """O3: one revival_ping per seat with dedup key revival:<seat>:<epoch>, expiring at epoch + TTL;
        repeating the call (or a seat) returns the same ids; a zero epoch means no expiry."""
        epoch = clock.now()
        ids = await enqueue_revival_heartbeat(book, ["s1", "s2", "s1"], reset_epoch=epoch, ttl_seconds=600)
        assert ids[0] == ids[2] != ids[1]
        r = await row(book, ids[1])
        assert (r.kind, r.deliver_to, r.dedup_key) == ("revival_ping", "s2", f"revival:s2:{epoch}")
        assert r.expires_at.timestamp() == epoch + 600 and r.ack_required is False
        assert await enqueue_revival_heartbeat(book, ["s1", "s2"], reset_epoch=epoch) == ids[:2]
        [zero] = await enqueue_revival_heartbeat(book, ["s3"], reset_epoch=0)
        assert (await row(book, zero)).expires_at is None
