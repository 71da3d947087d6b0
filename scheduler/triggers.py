"""Next fire times. Cron runs on local wall-clock time in an IANA zone; everything stored is a UTC epoch.

DST rules (S4): each matching wall-clock time fires once. A wall time that does not exist (the hour
skipped in spring) fires at the instant PEP 495 gives it (02:30 becomes 03:30 daylight time); a wall
time that occurs twice (the repeated hour in autumn) fires at its first occurrence only. Fire times
are strictly increasing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

log = logging.getLogger("statebook.scheduler")

DEFAULT_POLL_SECONDS = 300


def resolve_zone(name: str | None) -> ZoneInfo | timezone:
    """The IANA zone ``name``; an unknown name logs a warning and falls back to UTC."""
    if not name or name.upper() == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("unknown timezone %r; cron schedules fall back to UTC", name)
        return timezone.utc


def next_cron(expr: str, after: float, zone: ZoneInfo | timezone) -> float:
    """The first fire time of ``expr`` strictly after ``after`` (UTC epochs), read in ``zone``."""
    wall = datetime.fromtimestamp(after, zone).replace(tzinfo=None)
    it = croniter(expr, wall)
    for _ in range(10_000):
        candidate: datetime = it.get_next(datetime)
        when = candidate.replace(tzinfo=zone).timestamp()
        if when > after:
            return when
    raise ValueError(f"cron expression {expr!r} has no fire time after {after}")


def next_interval(anchor: float, interval: float, now: float) -> float:
    """The first ``anchor + k * interval`` (k >= 1) strictly after ``now``."""
    if interval <= 0:
        raise ValueError(f"interval must be positive, got {interval}")
    if anchor > now:
        return anchor
    steps = int((now - anchor) // interval) + 1
    when = anchor + steps * interval
    while when <= now:  # float rounding
        when += interval
    return when


def zone_for(schedule: Mapping[str, Any], default_zone: str | None) -> ZoneInfo | timezone:
    return resolve_zone(schedule.get("timezone") or default_zone)


def first_fire(schedule: Mapping[str, Any], now: float, default_zone: str | None) -> float | None:
    """``next_fire_at`` for a new (or re-enabled) schedule."""
    kind = schedule["trigger_type"]
    if kind == "cron":
        return next_cron(schedule["cron_expr"], now, zone_for(schedule, default_zone))
    if kind == "interval":
        return now + schedule["interval_sec"]
    if kind == "at":
        return float(schedule["at_time"])
    if kind == "github_poll":
        return now
    raise ValueError(f"unknown trigger type {kind!r}")


def following(schedule: Mapping[str, Any], due: float, now: float, default_zone: str | None) -> float | None:
    """The next fire time after the occurrence ``due`` was handled at ``now`` (None: no more).

    Occurrences already in the past are not replayed: the result is always after ``now``.
    """
    kind = schedule["trigger_type"]
    if kind == "cron":
        return next_cron(schedule["cron_expr"], max(due, now), zone_for(schedule, default_zone))
    if kind == "interval":
        return next_interval(due, schedule["interval_sec"], now)
    if kind == "at":
        return None
    if kind == "github_poll":
        return next_interval(due, schedule.get("poll_interval_sec") or DEFAULT_POLL_SECONDS, now)
    raise ValueError(f"unknown trigger type {kind!r}")


def missed_between(schedule: Mapping[str, Any], due: float, now: float, default_zone: str | None, cap: int = 1000) -> int:
    """How many occurrences fell in ``[due, now]`` (evidence for a missed-fire record; capped)."""
    count, when = 0, due
    while when is not None and when <= now and count < cap:
        count += 1
        kind = schedule["trigger_type"]
        if kind == "cron":
            when = next_cron(schedule["cron_expr"], when, zone_for(schedule, default_zone))
        elif kind in ("interval", "github_poll"):
            when = when + (schedule.get("interval_sec") or schedule.get("poll_interval_sec") or DEFAULT_POLL_SECONDS)
        else:
            break
    return count

