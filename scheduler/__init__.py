"""statebook.scheduler — triggers, admission gates, isolated child runs, follow-ups, leadership.

The engine and the schedule commands below are what an application or operator needs; the steps
(evaluation, firing, runs, the launcher) stay importable from their modules.
"""

from typing import TYPE_CHECKING

from statebook.lifecycle.lazy import lazy_names

if TYPE_CHECKING:  # what a type checker and the API reference read; at run time each module loads on first use
    from .engine import SchedulerEngine
    from .errors import CapacityExhausted, LaunchRefused, LeadershipLost, ScheduleError
    from .leadership import Leader
    from .models import Schedule, ScheduleRun
    from .policy import SCHEDULE, SCHEDULE_RUN
    from .polling import Poller, PollResult
    from .requests import CreateScheduleRequest
    from .runs import cancel_run
    from .schema import schedule_runs, schedules
    from .store import (
        create_schedule, delete_schedule, disable_schedule, enable_schedule, find_schedule, get_run, get_schedule,
        list_runs, list_schedules,
    )

_WHERE = {
    ".engine": ("SchedulerEngine",),
    ".errors": ("CapacityExhausted", "LaunchRefused", "LeadershipLost", "ScheduleError"),
    ".leadership": ("Leader",),
    ".models": ("Schedule", "ScheduleRun"),
    ".policy": ("SCHEDULE", "SCHEDULE_RUN"),
    ".polling": ("Poller", "PollResult"),
    ".requests": ("CreateScheduleRequest",),
    ".runs": ("cancel_run",),
    ".schema": ("schedule_runs", "schedules"),
    ".store": (
        "create_schedule", "delete_schedule", "disable_schedule", "enable_schedule", "find_schedule", "get_run",
        "get_schedule", "list_runs", "list_schedules",
    ),
}
"""The module of each public name: ``statebook ...`` commands import only what they use (specs/cli.md C10)."""
_MODULE_OF, __getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())


__all__ = [
    "SCHEDULE", "SCHEDULE_RUN", "CapacityExhausted", "CreateScheduleRequest", "LaunchRefused", "Leader",
    "LeadershipLost", "PollResult", "Poller", "Schedule", "ScheduleError", "ScheduleRun", "SchedulerEngine", "cancel_run", "create_schedule",
    "delete_schedule", "disable_schedule", "enable_schedule", "find_schedule", "get_run", "get_schedule",
    "list_runs", "list_schedules", "schedule_runs", "schedules",
]
