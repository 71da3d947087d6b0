"""statebook.scheduler — triggers, admission gates, isolated child runs, follow-ups."""

from .policy import SCHEDULE, SCHEDULE_RUN
from .schema import schedule_runs, schedules

__all__ = ["SCHEDULE", "SCHEDULE_RUN", "schedule_runs", "schedules"]
