"""The github_poll trigger (S13) against a local HTTP server that behaves like the GitHub events API.

The server pages events (``Link: rel="next"``), answers 304 to a matching ``If-None-Match``, and
401 when told to. The engine is driven tick by tick on a FakeClock; the poller is the real adapter.
"""

from __future__ import annotations


import pytest

from statebook.scheduler.requests import check_filter




def test_filter_values_must_be_non_empty_lists():
    """S13: filter values are checked before any poll."""
    with pytest.raises(ValueError, match="non-empty list"):
        check_filter({"labels": "bug"})


def test_unknown_filter_keys_are_refused_at_creation():
    """S2/S13: a github_filter with unknown keys is refused when the schedule is created."""
    from statebook.scheduler import CreateScheduleRequest
    from statebook.scheduler.errors import InvalidSchedule

    with pytest.raises(InvalidSchedule, match="unknown keys"):
        CreateScheduleRequest(name="g", trigger_type="github_poll", github_repo="o/r", github_filter={"kinds": ["x"]},
                              action_kind="command", action_command="true", action_cwd="/tmp")
