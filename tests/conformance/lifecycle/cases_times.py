"""L20a: a time goes in as an aware datetime or POSIX seconds and comes out as an aware UTC datetime; what is
stored and hashed is the seconds, the same on every backend."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from statebook.lifecycle import Book, FakeClock, as_of, history, replay, transition, verify
from statebook.lifecycle.errors import InvalidArgument

from .support import STARTED, SYSTEM, count_facts, new_task, row

PARIS = timezone(timedelta(hours=1), "CET")


class TimeCases:
    """Mixed into LifecycleConformance: each backend runs them (tests/conformance)."""

    async def test_a_facts_time_is_an_aware_datetime_equal_to_its_stored_seconds(self, book: Book, clock: FakeClock):
        """L20a: every fact read back has ``at`` as stored (seconds, the hashed value) and ``time``, the same moment
        as an aware UTC datetime; the row's ``updated_at`` is the last fact's seconds, and verify is clean."""
        clock.set(datetime(2026, 12, 5, 20, 30, 0, 123456, tzinfo=PARIS))
        task = await new_task(book)
        clock.advance(1.5)
        await transition(book, "task", task.entity_id, "working", expected="open", reason=STARTED, actor=SYSTEM)
        facts = await history(book, "task", task.entity_id)
        assert [f.at for f in facts] == [1_796_499_000.123456, 1_796_499_001.623456]
        for fact in facts:
            assert fact.time.tzinfo is timezone.utc
            assert fact.time == datetime.fromtimestamp(fact.at, timezone.utc)
            assert "time" not in fact.to_json()  # history --json and exports keep their fields
        assert facts[0].time == datetime(2026, 12, 5, 19, 30, 0, 123456, tzinfo=timezone.utc)
        assert (await row(book, task.entity_id))["updated_at"] == facts[-1].at
        assert (await verify(book)).ok

    async def test_as_of_takes_a_datetime_or_seconds_alike(self, book: Book, clock: FakeClock):
        """L20a: ``as_of`` at an aware datetime (any zone) gives what it gives at the same POSIX seconds; between
        the two facts it is the created row, after them the current one."""
        task = await new_task(book)
        clock.advance(60)
        await transition(book, "task", task.entity_id, "working", expected="open", reason=STARTED, actor=SYSTEM)
        first, second = await history(book, "task", task.entity_id)
        middle = first.time + timedelta(seconds=30)
        assert await as_of(book, "task", task.entity_id, middle) == await as_of(book, "task", task.entity_id,
                                                                                 first.at + 30)
        assert (await as_of(book, "task", task.entity_id, middle.astimezone(PARIS)))["status"] == "open"
        assert await as_of(book, "task", task.entity_id, second.time) == await replay(book, "task", task.entity_id)
        assert await as_of(book, "task", task.entity_id, first.time - timedelta(seconds=1)) is None

    @pytest.mark.parametrize("when,rule", [
        pytest.param(datetime(2026, 12, 5, 19, 30), "naive", id="naive"),
        pytest.param(datetime(1969, 12, 31, 23, 59, tzinfo=timezone.utc), "range", id="before-1970"),
        pytest.param(True, "type", id="bool"),
        pytest.param(float("nan"), "finite", id="nan"),
        pytest.param("2026-12-05", "type", id="text"),
    ])
    async def test_a_time_that_is_not_one_is_refused_before_any_read(self, book: Book, when, rule: str):
        """L20a: a naive datetime (which zone it means would be a guess), a time before 1970, a bool, NaN and text
        are one InvalidArgument naming ``when``; a naive one says to add a tzinfo."""
        task = await new_task(book)
        before = await count_facts(book)
        with pytest.raises(InvalidArgument) as caught:
            await as_of(book, "task", task.entity_id, when)
        assert (caught.value.argument, caught.value.rule) == ("when", rule)
        assert str(caught.value).startswith("when: ") and "\n" not in str(caught.value)
        if rule == "naive":
            assert "tzinfo" in str(caught.value)
        assert await count_facts(book) == before
