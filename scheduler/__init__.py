"""statebook.scheduler — triggers, admission gates, isolated child runs, follow-ups."""

from .engine import SchedulerEngine
from .firing import CapacityExhausted
from .launcher import Launch, LaunchRefused, ProcessResult, build_launch, spawn_and_wait
from .policy import SCHEDULE, SCHEDULE_RUN
from .polling import Poller, PollResult
from .requests import CreateScheduleRequest
from .runs import cancel_run, finalize_run, open_run
from .schema import schedule_runs, schedules
from .store import (
    ScheduleError, create_schedule, delete_schedule, disable_schedule, enable_schedule, find_schedule, get_run,
    get_schedule, list_runs, list_schedules,
)

__all__ = [
    "SCHEDULE", "SCHEDULE_RUN", "CapacityExhausted", "CreateScheduleRequest", "Launch", "LaunchRefused",
    "PollResult", "Poller", "ProcessResult", "ScheduleError", "SchedulerEngine", "build_launch", "cancel_run", "create_schedule",
    "delete_schedule", "disable_schedule", "enable_schedule", "finalize_run", "find_schedule", "get_run",
    "get_schedule", "list_runs", "list_schedules", "open_run", "schedule_runs", "schedules", "spawn_and_wait",
]
