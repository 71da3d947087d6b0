"""The scheduler's errors, each a ``StatebookError``; the CLI maps them to one-line messages."""

from __future__ import annotations

from statebook.lifecycle import StatebookError


class ScheduleError(StatebookError):
    """A schedule command that cannot be applied (wrong status, name taken, ...)."""


class CapacityExhausted(ScheduleError):
    """A manual fire found every global slot taken."""


class LeadershipLost(ScheduleError):
    """The lease this daemon fired under was taken over; the transaction rolls back and writes nothing."""


class LaunchRefused(StatebookError):
    """The action cannot be launched; ``reason`` is the schedule_run reason code to record."""

    def __init__(self, message: str, reason: str = "schedule_run.failed.invalid_action") -> None:
        super().__init__(message)
        self.reason = reason
