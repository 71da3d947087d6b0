"""L20a, O22: the outbox's time parameters take an aware datetime or POSIX seconds and store the seconds; its
read model gives them back as aware UTC datetimes, on every backend."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from statebook.lifecycle import verify
from statebook.outbox import (
    DispatchInvalid, apply_retention, deliver_due_dispatches, enqueue_dispatch, enqueue_dispatches,
    enqueue_revival_heartbeat, get_dispatch, purge_dispatches,
)

from .support import Recorder, facts, row

TOKYO = timezone(timedelta(hours=9), "JST")


class TimeCases:
    """Mixed into OutboxConformance: each backend runs them (tests/conformance)."""

    async def test_expires_at_as_a_datetime_or_seconds_is_stored_alike(self, book, clock):
        """L20a: ``expires_at`` as an aware datetime (in any zone), as its seconds, or in a batch: the same stored
        seconds in the row and in the creation fact's patch; ``Dispatch.expires_at`` is that moment, aware UTC."""
        moment = datetime.fromtimestamp(clock.now() + 3600.25, TOKYO)
        ids = [await enqueue_dispatch(book, kind="k", deliver_to="a", expires_at=moment),
               await enqueue_dispatch(book, kind="k", deliver_to="a", expires_at=moment.timestamp()),
               *await enqueue_dispatches(book, [{"kind": "k", "deliver_to": "a", "expires_at": moment}])]
        patches = [(await facts(book, i))[0].patch["expires_at"] for i in ids]
        assert patches == [moment.timestamp()] * 3 and all(type(p) is float for p in patches)
        for dispatch_id in ids:
            dispatch = await get_dispatch(book, dispatch_id)
            assert dispatch.expires_at == moment and dispatch.expires_at.tzinfo == timezone.utc
            assert dispatch.expires_at.timestamp() == moment.timestamp()
            for value in (dispatch.created_at, dispatch.updated_at, dispatch.next_attempt_at):
                assert value.tzinfo == timezone.utc and value.timestamp() == clock.now()
        assert (await verify(book, "dispatch")).ok

    async def test_a_revival_epoch_as_a_datetime_dedups_with_its_seconds(self, book, clock):
        """L20a, O3: ``reset_epoch`` as an aware datetime gives the dedup key and expiry its float seconds give, so
        the two calls are one ping; seconds keep the key they always had (an int epoch is spelled as an int)."""
        epoch = datetime(2026, 12, 5, 19, 30, tzinfo=timezone.utc)
        [first] = await enqueue_revival_heartbeat(book, ["s1"], reset_epoch=epoch, ttl_seconds=600)
        assert await enqueue_revival_heartbeat(book, ["s1"], reset_epoch=epoch.timestamp(), ttl_seconds=600) == [first]
        stored = await row(book, first)
        assert stored.dedup_key == "revival:s1:1796499000.0" and stored.expires_at == epoch + timedelta(minutes=10)
        [whole] = await enqueue_revival_heartbeat(book, ["s2"], reset_epoch=1_796_499_000)
        assert (await row(book, whole)).dedup_key == "revival:s2:1796499000"

    async def test_a_pass_purge_and_retention_at_a_datetime_act_as_at_its_seconds(self, book, clock):
        """L20a: ``deliver_due_dispatches(now=)``, ``purge_dispatches(before=)`` and ``apply_retention(now=)``
        take an aware datetime: a pass at a moment past a row's expiry expires it, a purge before a moment
        after it removes it, retention counted back from a moment days later removes the delivered row."""
        soon = clock.now() + 10
        expiring = await enqueue_dispatch(book, kind="k", deliver_to="a", expires_at=soon)
        later = datetime.fromtimestamp(soon + 1, TOKYO)
        counts = await deliver_due_dispatches(book, now=later, transport=Recorder().transport)
        assert counts["expired"] == 1 and (await row(book, expiring)).status == "expired"
        clock.advance(20)
        assert await purge_dispatches(book, before=datetime.fromtimestamp(clock.now(), TOKYO), dry_run=True) == [
            expiring]
        delivered = await enqueue_dispatch(book, kind="k", deliver_to="b")
        assert (await deliver_due_dispatches(book, transport=Recorder().transport))["delivered"] == 1
        clock.advance(1)
        week = datetime.fromtimestamp(clock.now(), timezone.utc) + timedelta(days=8)
        assert (await apply_retention(book, now=week))["delivered"] == 1
        assert await get_dispatch(book, delivered) is None and await get_dispatch(book, expiring) is not None
        assert (await verify(book, "dispatch")).ok

    @pytest.mark.parametrize("call,argument", [
        pytest.param(lambda b, t: enqueue_dispatch(b, kind="k", deliver_to="a", expires_at=t), "expires_at",
                     id="expires_at"),
        pytest.param(lambda b, t: enqueue_dispatches(b, [{"kind": "k", "deliver_to": "a", "expires_at": t}]),
                     "items[0].expires_at", id="batch"),
        pytest.param(lambda b, t: enqueue_revival_heartbeat(b, ["s"], reset_epoch=t), "reset_epoch", id="epoch"),
        pytest.param(lambda b, t: purge_dispatches(b, before=t), "before", id="before"),
        pytest.param(lambda b, t: apply_retention(b, now=t), "now", id="retention"),
        pytest.param(lambda b, t: deliver_due_dispatches(b, now=t, transport=Recorder().transport), "now", id="pass"),
    ])
    async def test_a_naive_datetime_is_refused_wherever_a_time_goes_in(self, book, call, argument):
        """L20a, O22: a naive datetime is one DispatchInvalid naming the argument, rule ``naive``, saying to add a
        tzinfo; nothing is written."""
        with pytest.raises(DispatchInvalid) as caught:
            await call(book, datetime(2026, 12, 5, 19, 30))
        assert (caught.value.argument, caught.value.rule) == (argument, "naive")
        assert "tzinfo" in str(caught.value) and "\n" not in str(caught.value)
        assert await enqueue_dispatches(book, []) == [] and (await verify(book)).entities == 0
