"""L20a: the one conversion of a time going in (``inputs.timestamp``, by ``clock.posix``) and coming out
(``clock.utc``, ``Fact.time``), without a database."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone, tzinfo

import pytest
from hypothesis import given, strategies as st

from statebook.lifecycle import FakeClock
from statebook.lifecycle.clock import posix, utc
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.facts import Fact
from statebook.lifecycle.inputs import TIME_RANGE, timestamp

ZONES = st.builds(lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(-14 * 60, 14 * 60))
AWARE = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30), timezones=ZONES)
SECONDS = st.floats(min_value=TIME_RANGE[0], max_value=TIME_RANGE[1], allow_nan=False)


@given(AWARE)
def test_a_datetime_and_its_seconds_give_the_same_stored_time(moment):
    """L20a: an aware datetime, in any zone, is stored as its POSIX seconds: the same float its seconds give."""
    stored = timestamp("t", moment)
    assert type(stored) is float and stored == moment.timestamp() == timestamp("t", moment.timestamp())
    assert stored == timestamp("t", moment.astimezone(timezone.utc))


@given(st.one_of(SECONDS, st.integers(0, int(TIME_RANGE[1]))))
def test_seconds_are_stored_as_given(seconds):
    """L20a: seconds go through unchanged (an int stays an int), so a caller passing seconds stores what it
    stored before; their datetime (to the microsecond) comes back to within a microsecond."""
    stored = timestamp("t", seconds)
    assert stored == seconds and type(stored) is type(seconds)
    assert abs(utc(stored).timestamp() - seconds) <= 1e-6 * max(1.0, seconds / 1e9)


def test_a_naive_datetime_is_one_line_saying_to_add_a_tzinfo():
    """L20a: a naive datetime is refused, never read as local time or UTC: rule ``naive``, the argument named,
    one line that says how to fix it."""
    with pytest.raises(InvalidArgument) as caught:
        timestamp("expires_at", datetime(2026, 12, 5, 19, 30))
    assert (caught.value.argument, caught.value.rule) == ("expires_at", "naive")
    assert str(caught.value) == ("expires_at: is a naive datetime (no tzinfo): local time or UTC would be a guess; "
                                 "add one, e.g. tzinfo=timezone.utc")


class Floating(tzinfo):
    """A tzinfo that names no offset: the datetime is still naive."""

    def utcoffset(self, dt):
        return None


@pytest.mark.parametrize("value,rule", [
    pytest.param(datetime(2026, 1, 1, tzinfo=Floating()), "naive", id="tzinfo-without-offset"),
    pytest.param(True, "type", id="bool"),
    pytest.param(False, "type", id="false"),
    pytest.param("1764963000", "type", id="text"),
    pytest.param(datetime(2026, 1, 1).date(), "type", id="date"),
    pytest.param(float("inf"), "finite", id="inf"),
    pytest.param(-1, "range", id="before-1970"),
    pytest.param(datetime(1969, 12, 31, 23, 0, tzinfo=timezone.utc), "range", id="datetime-before-1970"),
    pytest.param(datetime(9999, 12, 31, 23, 0, tzinfo=timezone(-timedelta(hours=5))), "range", id="after-9999"),
])
def test_what_is_not_a_time_is_refused_as_before(value, rule):
    """L20a, L20: bool is not a time; text, a date, a non-finite number and a moment outside 1970-9999 are
    refused with the rule they broke."""
    with pytest.raises(InvalidArgument) as caught:
        timestamp("when", value)
    assert (caught.value.argument, caught.value.rule) == ("when", rule)


@given(SECONDS)
def test_utc_is_aware_and_equal_to_the_seconds(seconds):
    """L20a: stored seconds come out as an aware UTC datetime, the one ``datetime.fromtimestamp`` gives."""
    moment = utc(seconds)
    assert moment.tzinfo is timezone.utc and moment == datetime.fromtimestamp(seconds, timezone.utc)


def test_a_facts_time_is_its_at_and_changes_nothing_hashed():
    """L20a: ``Fact.time`` is ``utc(at)``; ``at``, ``content()`` (what the hash covers) and ``to_json()`` are
    the stored fields only."""
    fact = Fact(id="f", entity_type="t", entity_id="e", prev_fact_id="", previous_status=None, status="open",
                version=1, reason_code="t.open.x", reason_summary="", evidence_refs=[], actor_type="system",
                actor_id="s", at=1_796_499_000.5, patch={}, metadata={}, idempotency_key=None, command_digest=None,
                policy_fingerprint="0" * 16, prev_hash="", hash="h")
    assert fact.time == datetime(2026, 12, 5, 19, 30, 0, 500000, tzinfo=timezone.utc)
    assert fact.content()["at"] == 1_796_499_000.5 and "time" not in fact.content()
    assert set(fact.to_json()) == {f.name for f in dataclasses.fields(Fact)}


def test_a_fake_clock_starts_and_is_set_at_a_datetime_or_seconds():
    """L20a: ``FakeClock(start)`` and ``set(when)`` take an aware datetime or seconds; its ``now()`` stays
    seconds (the engine's port); a naive datetime is a ValueError naming the argument."""
    moment = datetime(2026, 12, 5, 19, 30, tzinfo=timezone.utc)
    assert FakeClock(moment).now() == FakeClock(moment.timestamp()).now() == 1_796_499_000.0
    clock = FakeClock(moment)
    clock.set(moment + timedelta(minutes=1))
    assert clock.now() == 1_796_499_060.0 and type(clock.now()) is float
    with pytest.raises(ValueError, match="^when: is a naive datetime"):
        clock.set(datetime(2027, 1, 1))
    with pytest.raises(ValueError, match="^start: is a naive datetime"):
        FakeClock(datetime(2027, 1, 1))
    assert posix(7) == 7
