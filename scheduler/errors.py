"""The scheduler's errors, each a ``StatebookError``; the CLI maps them to one-line messages."""

from __future__ import annotations

from statebook.lifecycle import StatebookError
from statebook.lifecycle.errors import InvalidArgument


class ScheduleError(StatebookError):
    """A schedule command that cannot be applied (wrong status, name taken, ...)."""


class InvalidSchedule(ScheduleError, InvalidArgument):
    """A schedule's field breaks its rule (specs/scheduler.md S18); nothing was written.

    ``argument`` names the field (``interval_sec``, ``timezone``, ``github_filter.types``), ``rule`` the
    rule (an ``InvalidArgument`` rule, ``never_fires``, ``zone``, ``unknown_field`` or pydantic's error type).
    """


class CapacityExhausted(ScheduleError):
    """A manual fire found every global slot taken."""


class LeadershipLost(ScheduleError):
    """The lease this daemon fired under was taken over; the transaction rolls back and writes nothing."""


class LaunchRefused(StatebookError):
    """The action cannot be launched; ``reason`` is the schedule_run reason code to record."""

    def __init__(self, message: str, reason: str = "schedule_run.failed.invalid_action") -> None:
        super().__init__(message)
        self.reason = reason
