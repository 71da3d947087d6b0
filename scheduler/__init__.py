"""statebook.scheduler — triggers, admission gates, isolated child runs, follow-ups, leadership.

The engine and the schedule commands below are what an application or operator needs; the steps
(evaluation, firing, runs, the launcher) stay importable from their modules.
"""

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

__all__ = [
    "SCHEDULE", "SCHEDULE_RUN", "CapacityExhausted", "CreateScheduleRequest", "LaunchRefused", "Leader",
    "LeadershipLost", "PollResult", "Poller", "Schedule", "ScheduleError", "ScheduleRun", "SchedulerEngine", "cancel_run", "create_schedule",
    "delete_schedule", "disable_schedule", "enable_schedule", "find_schedule", "get_run", "get_schedule",
    "list_runs", "list_schedules", "schedule_runs", "schedules",
]
