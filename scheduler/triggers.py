"""Next fire times. Cron runs on local wall-clock time in an IANA zone; everything stored is a UTC epoch.

DST rules (S4): each matching wall-clock time fires once. A wall time that does not exist (the hour
skipped in spring) fires at the instant PEP 495 gives it (02:30 becomes 03:30 daylight time); a wall
time that occurs twice (the repeated hour in autumn) fires at its first occurrence only. Fire times
are strictly increasing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from croniter import CroniterBadDateError, croniter

from statebook.lifecycle.inputs import KEY_CHARS, shown, text

from .errors import InvalidSchedule

log = logging.getLogger("statebook.scheduler")

DEFAULT_POLL_SECONDS = 300
CRON_CHARS = 255
_PROBE_YEARS = (1970, 2020, 2070)
"""croniter looks at most 50 years ahead: a cron with a year field is tried from each of these."""


@functools.cache
def _iana_keys() -> frozenset[str]:
    return frozenset(available_timezones())


def known_zone(name: str) -> ZoneInfo | timezone | None:
    """The zone an IANA key names (``UTC`` in any case too); None for anything else.

    Only a key of the installed database is looked up, so a path (``../../etc/passwd``), a folder
    (``America``) or a data file (``zone.tab``) never reaches ``ZoneInfo``, which would read it."""
    if name.upper() == "UTC":
        return timezone.utc
    if name not in _iana_keys():
        return None
    try:
        return ZoneInfo(name)
    except Exception:  # noqa: BLE001 - a listed key whose file is unreadable is no zone either
        return None


def check_zone(argument: str, value: Any) -> str:
    """A schedule's own ``timezone``: a real IANA key, else :class:`InvalidSchedule` (S18)."""
    name = _text(argument, value, KEY_CHARS)
    if not name or known_zone(name) is None:
        raise InvalidSchedule(f"{argument}: {shown(name)} is not an IANA time zone; use a name such as "
                              "'Europe/Paris', 'America/New_York' or 'UTC'", argument=argument, rule="zone")
    return name


def resolve_zone(name: str | None) -> ZoneInfo | timezone:
    """The daemon's default zone ``name``; an unknown one logs a warning and falls back to UTC (S4)."""
    if not name:
        return timezone.utc
    zone = known_zone(name) if isinstance(name, str) else None
    if zone is None:
        log.warning("unknown timezone %s; cron schedules fall back to UTC", shown(name))
        return timezone.utc
    return zone


def check_cron(argument: str, value: Any) -> str:
    """A cron expression croniter reads and that matches at least one date, else :class:`InvalidSchedule`."""
    expr = _text(argument, value, CRON_CHARS)
    for year in _PROBE_YEARS:
        try:
            croniter(expr, datetime(year, 1, 1)).get_next(datetime)
            return expr
        except Exception as exc:  # noqa: BLE001 - croniter's errors are many and not one family
            if not _no_date(exc):
                raise InvalidSchedule(f"{argument}: {shown(expr)} is not a cron expression ({_croniter_says(exc)}); "
                                      "use five fields such as '*/5 * * * *'", argument=argument, rule="cron") from None
    raise _never_fires(argument, expr)


def next_cron(expr: str, after: float, zone: ZoneInfo | timezone) -> float:
    """The first fire time of ``expr`` strictly after ``after`` (UTC epochs), read in ``zone``.

    An expression without such a time raises :class:`InvalidSchedule` (``never_fires``)."""
    wall = datetime.fromtimestamp(after, zone).replace(tzinfo=None)
    try:
        it = croniter(expr, wall)
        for _ in range(10_000):
            candidate: datetime = it.get_next(datetime)
            when = candidate.replace(tzinfo=zone).timestamp()
            if when > after:
                return when
    except Exception as exc:  # noqa: BLE001 - translated: no croniter error leaves the scheduler
        if not _no_date(exc):
            raise InvalidSchedule(f"cron_expr: {shown(expr)} is not a cron expression ({_croniter_says(exc)})",
                                  argument="cron_expr", rule="cron") from None
    raise _never_fires("cron_expr", expr, after)


def _never_fires(argument: str, expr: str, after: float | None = None) -> InvalidSchedule:
    since = "" if after is None else f" after {datetime.fromtimestamp(after, timezone.utc):%Y-%m-%dT%H:%MZ}"
    return InvalidSchedule(f"{argument}: {shown(expr)} never fires{since} (no date matches it, e.g. February 31)",
                           argument=argument, rule="never_fires")


def _no_date(exc: Exception) -> bool:
    return isinstance(exc, CroniterBadDateError)


def _croniter_says(exc: Exception) -> str:
    return str(exc).split("]")[-1].strip(" ,.") or type(exc).__name__


def _text(argument: str, value: Any, max_chars: int) -> str:
    try:
        return text(argument, value, max_chars=max_chars)
    except InvalidSchedule:
        raise
    except Exception as exc:  # an InvalidArgument: the same, as a schedule's error
        raise InvalidSchedule(str(exc), argument=argument, rule=getattr(exc, "rule", "type")) from None



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
    """The time zone of ``schedule``, else ``default_zone``, else UTC."""
    return resolve_zone(schedule.get("timezone") or default_zone)


def first_fire(schedule: Mapping[str, Any], now: float, default_zone: str | None) -> float | None:
    """``next_fire_at`` for a new (or re-enabled) schedule."""
    kind = schedule["trigger_type"]
    if kind == "cron":
        return next_cron(schedule["cron_expr"], now, zone_for(schedule, default_zone))
    if kind == "interval":
        interval: float = schedule["interval_sec"]
        return now + interval
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

