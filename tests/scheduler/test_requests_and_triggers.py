"""Creation validation (S2) and trigger arithmetic including DST (S4)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statebook.scheduler.errors import InvalidSchedule
from statebook.scheduler.requests import CreateScheduleRequest
from statebook.scheduler.triggers import following, next_cron, next_interval, resolve_zone

from conformance.scheduler.support import command_spec

NY = ZoneInfo("America/New_York")


def local(ts: float) -> str:
    return datetime.fromtimestamp(ts, NY).isoformat()


@pytest.mark.parametrize(
    "over, needle",
    [
        ({"trigger_type": "cron", "cron_expr": "not a cron"}, "cron_expr"),
        ({"trigger_type": "interval", "interval_sec": 0}, "interval_sec"),
        ({"trigger_type": "interval", "interval_sec": -5}, "interval_sec"),
        ({"trigger_type": "github_poll", "github_repo": "no-slash"}, "owner/name"),
        ({"trigger_type": "at"}, "at_time"),
        ({"action_kind": "playbook"}, "use 'play'"),
        ({"action_kind": "shell"}, "unknown"),
        ({"action_kind": "flow_yaml", "action_flow_yaml": "   "}, "non-empty"),
        ({"action_kind": "flow_yaml", "action_flow_yaml": "a: [unclosed"}, "not valid YAML"),
        ({"action_command": None}, "action_command"),
        ({"max_runs": 0}, "max_runs: 0 is out of range; allowed: 1"),
        ({"budget_usd": 0.0}, "positive"),
        ({"budget_tokens": -1}, "budget_tokens: -1 is out of range; allowed: 1"),
        ({"notify": {"kind": "k"}}, "deliver_to"),
        ({"on_fail": {"kind": "playbook"}}, "use 'play'"),
        ({"threshold_config": {"metric": "nope", "value": 1, "window_minutes": 5}}, "metric"),
        ({"trigger_type": "at", "at_time": 1.0, "threshold_config": {"metric": "failed_runs", "value": 1,
                                                                      "window_minutes": 5}}, "cron or interval"),
    ],
)
def test_invalid_requests_are_refused_with_the_field_named(over, needle):
    """S2: creation refuses an invalid trigger, action, limit, overlay or notify, naming what is wrong."""
    with pytest.raises(InvalidSchedule) as err:
        CreateScheduleRequest.model_validate(command_spec(**over))
    assert needle in str(err.value)


NASTY = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**31 - 2, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(), st.text(alphabet=st.characters(codec=None)),
    st.sampled_from(["\ud800", "a\x00b", "x" * 5000, "0 0 31 2 *", "Mars/Olympus", "../../etc/passwd", "play"]),
    st.lists(st.text(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers() | st.text(), max_size=3),
)


@given(field=st.sampled_from(sorted(CreateScheduleRequest.model_fields) + ["unknown"]), value=NASTY,
       trigger=st.sampled_from(["cron", "interval", "at", "github_poll"]))
def test_parse_refuses_with_one_invalid_schedule(field, value, trigger):
    """S18: whatever a field holds, parse either returns a request or raises one InvalidSchedule whose
    message starts with the argument it names; never a ValidationError or another exception."""
    spec = command_spec(trigger_type=trigger, cron_expr="0 3 * * *", at_time=1e9, github_repo="octo/repo")
    spec[field] = value
    try:
        CreateScheduleRequest.parse(spec)
    except InvalidSchedule as exc:
        assert str(exc).startswith(exc.argument) and exc.argument


def test_valid_request_stores_one_vocabulary():
    """S2: a valid play schedule keeps 'play' (no alias), and lists default to empty."""
    req = CreateScheduleRequest.model_validate(
        command_spec(action_kind="play", action_play="nightly", action_command=None, trigger_type="cron",
                     cron_expr="0 3 * * *")
    )
    values = req.to_values()
    assert values["action_kind"] == "play"
    assert values["action_extra_args"] == []
    assert values["enabled"] == 1


def test_cron_spring_forward_new_york():
    """S4: on 2026-03-08 02:30 does not exist in New York; it fires once at 03:30 EDT, then daily at 02:30."""
    start = datetime(2026, 3, 7, 12, 0, tzinfo=NY).timestamp()
    first = next_cron("30 2 * * *", start, NY)
    second = next_cron("30 2 * * *", first, NY)
    assert local(first) == "2026-03-08T03:30:00-04:00"
    assert local(second) == "2026-03-09T02:30:00-04:00"
    assert second - first == 23 * 3600


def test_cron_half_hourly_across_spring_gap_is_strictly_increasing():
    """S4: the skipped hour produces no duplicate and no going back in time."""
    t = datetime(2026, 3, 8, 1, 0, tzinfo=NY).timestamp()
    seen = []
    for _ in range(5):
        t = next_cron("*/30 * * * *", t, NY)
        seen.append(local(t))
    assert seen == ["2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00",
                    "2026-03-08T04:00:00-04:00", "2026-03-08T04:30:00-04:00"]


def test_cron_fall_back_fires_repeated_wall_time_once():
    """S4: on 2026-11-01 01:30 happens twice in New York; a daily 01:30 cron fires once, at the first."""
    start = datetime(2026, 10, 31, 12, 0, tzinfo=NY).timestamp()
    first = next_cron("30 1 * * *", start, NY)
    second = next_cron("30 1 * * *", first, NY)
    assert datetime.fromtimestamp(first, timezone.utc).isoformat() == "2026-11-01T05:30:00+00:00"
    assert local(second) == "2026-11-02T01:30:00-05:00"
    assert second - first == 25 * 3600


def test_invalid_timezone_warns_and_falls_back_to_utc(caplog):
    """S4: an unknown IANA zone logs a warning and cron is read in UTC."""
    with caplog.at_level(logging.WARNING, logger="statebook.scheduler"):
        zone = resolve_zone("Mars/Olympus_Mons")
    assert zone is timezone.utc
    assert "Mars/Olympus_Mons" in caplog.text
    assert next_cron("0 * * * *", 3600.5, zone) == 7200.0


def test_interval_skips_past_occurrences_but_keeps_phase():
    """S4: the next interval time is the first after now on the original phase."""
    assert next_interval(100.0, 10, 100.0) == 110.0
    assert next_interval(100.0, 10, 155.0) == 160.0
    assert following({"trigger_type": "at"}, 5.0, 6.0, None) is None
