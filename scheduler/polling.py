"""The ``github_poll`` trigger (S13): poll a repository's events, fire once per new event, keep a cursor.

The HTTP client is an edge (``adapters/github.py``) behind the :class:`Poller` protocol; the
composition root injects it into ``SchedulerEngine``, which hands it to :class:`GithubPolling` with its
``Firing`` (admission and claims) as the one collaborator that writes. Without one, a github_poll schedule only
advances its cadence (and a warning is logged once).

One due occurrence of a github_poll schedule:

1. fetch ``GET /repos/{owner}/{repo}/events`` — outside any transaction — with the ETag of the
   last complete poll (a 304 is a healthy poll with no events);
2. select the new events: id above ``github_cursor`` (ids are increasing numbers), or, before the
   first fire, created no earlier than the schedule itself; then ``github_filter``;
3. for each, oldest first, one transaction (``Firing.event``): lock the schedule, pass the gates
   (overlap, budget, max_runs, global slot — ``admission.admit`` with a set of one), and only then
   move the cursor to the event's id and open its run (a compare-and-set on ``github_cursor`` and
   ``next_fire_at``, so an event fires at most once, even with two daemons, S1); the first event
   that cannot fire stops the pass and stays above the cursor;
4. one cadence transition with the health columns: ``last_healthy_poll_at`` and a reset
   ``poller_consecutive_401`` after 200/304, an incremented counter after 401. With events
   still waiting the poll comes back on the next tick rather than after the poll interval.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from .firing import Firing
from .requests import check_filter

log = logging.getLogger("statebook.scheduler")

TITLE_LIMIT = 200
ID_DIGITS = 30
"""an event id longer than this is no GitHub id (it would not fit the cursor's comparisons either)"""
TEXT_LIMIT = 1000

PollStatus = Literal["ok", "not_modified", "unauthorized", "failed"]


@dataclass(frozen=True)
class PollResult:
    """What one poll of the API returned: events (any order, raw API objects) or why there are none."""

    status: PollStatus
    events: tuple[Mapping[str, Any], ...] = ()
    etag: str | None = None
    """the first page's ETag (sent back as If-None-Match next time)"""
    pages: int = 0
    detail: str = ""
    """for a failed or unauthorized poll: the HTTP status and message, for the audit trail"""


class Poller(Protocol):
    """Fetch a repository's events newer than ``cursor`` (an adapter may stop paging once it reaches it)."""

    async def fetch(self, repo: str, *, etag: str | None, cursor: str | None) -> PollResult:
        """The events of ``repo`` newer than ``cursor``, conditional on ``etag``."""
        ...


# -- selecting events ---------------------------------------------------------------------------

def event_number(event: Mapping[str, Any]) -> int | None:
    """The event's id as a number (GitHub event ids are increasing decimal strings); None if it is not one."""
    raw = str(event.get("id"))
    if not raw.isascii() or not raw.isdigit() or len(raw) > ID_DIGITS:
        return None
    return int(raw)


def _labels(payload: Mapping[str, Any]) -> set[str]:
    item = _mapping(payload.get("issue") or payload.get("pull_request"))
    labels = item.get("labels")
    found = {lbl.get("name") for lbl in labels if isinstance(lbl, Mapping)} if isinstance(labels, list) else set()
    if isinstance(payload.get("label"), Mapping):
        found.add(payload["label"].get("name"))
    return {name for name in found if isinstance(name, str) and name}


def matches(event: Mapping[str, Any], flt: Mapping[str, frozenset[str]]) -> bool:
    """True when ``event`` passes the filter's types, actions and labels (each optional)."""
    payload = _mapping(event.get("payload"))
    if "types" in flt and event.get("type") not in flt["types"]:
        return False
    if "actions" in flt and payload.get("action") not in flt["actions"]:
        return False
    return not ("labels" in flt and not _labels(payload) & flt["labels"])


def created_epoch(event: Mapping[str, Any]) -> float | None:
    """The event's ``created_at`` as epoch seconds, or None when it is missing or malformed."""
    try:
        return datetime.fromisoformat(str(event.get("created_at")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def new_events(events: Iterable[Mapping[str, Any]], *, cursor: str | None, not_before: float,
               flt: Mapping[str, frozenset[str]]) -> list[tuple[int, Mapping[str, Any]]]:
    """The events that may fire, oldest first, each once: above the cursor (without one: created at or
    after ``not_before``, compared in whole seconds like the API's timestamps) and matching the filter."""
    floor = int(cursor) if cursor is not None else None
    chosen: dict[int, Mapping[str, Any]] = {}
    for event in events:
        if not isinstance(event, Mapping):
            continue  # not an event: an adapter's or the API's garbage never stops a poll
        number = event_number(event)
        if number is None:
            continue
        if floor is not None:
            if number <= floor:
                continue
        else:
            at = created_epoch(event)
            if at is None or at < int(not_before):
                continue
        if matches(event, flt):
            chosen.setdefault(number, event)
    return sorted(chosen.items(), key=lambda item: item[0])


def _clean(value: Any, limit: int = TEXT_LIMIT) -> str | None:
    """API text as storable text: bounded, a lone surrogate replaced, no NUL (S18: the same on both backends)."""
    if value is None:
        return None
    shown = str(value)[:limit]
    if not shown.isascii():
        shown = shown.encode("utf-8", "replace").decode("utf-8")
    return shown.replace("\x00", "")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def compact(event: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an event a run's trigger context keeps (payloads can be large), as storable JSON."""
    payload = _mapping(event.get("payload"))
    out: dict[str, Any] = {
        "id": _clean(event.get("id")), "type": _clean(event.get("type")),
        "created_at": _clean(event.get("created_at")), "actor": _clean(_mapping(event.get("actor")).get("login")),
        "repo": _clean(_mapping(event.get("repo")).get("name")),
    }
    for key in ("action", "ref", "head"):
        if isinstance(payload.get(key), str):
            out[key] = _clean(payload[key])
    item = payload.get("issue") or payload.get("pull_request")
    if isinstance(item, Mapping):
        number = item.get("number")
        out.update(number=number if type(number) is int and abs(number) < 2**53 else None,
                   title=_clean(item.get("title") or "", TITLE_LIMIT), url=_clean(item.get("html_url")),
                   labels=sorted(_clean(label) or "" for label in _labels(payload)))
    return out


def event_context(base: Mapping[str, Any], repo: str, event: Mapping[str, Any]) -> dict[str, Any]:
    """Trigger context of an event's run; flat keys are usable as ``{event_id}`` in argument templates."""
    ev = compact(event)
    return {**base, "repo": repo, "event_id": ev["id"], "event_type": ev["type"], "event": ev}


# -- one due poll -------------------------------------------------------------------------------

class GithubPolling:
    """Runs the due occurrences of github_poll schedules; each event is admitted and claimed by ``firing``."""

    def __init__(self, firing: Firing, poller: Poller | None, *, tick_seconds: float) -> None:
        self.firing = firing
        self.poller = poller
        self.tick_seconds = tick_seconds
        self.etags: dict[tuple[str, str], str] = {}
        """(schedule id, repo) -> ETag of the last poll that left no event waiting (kept in memory)."""
        self._warned = False

    async def poll(self, s: Mapping[str, Any], due: float, nxt: float | None, context: Mapping[str, Any]) -> str:
        """Handle the occurrence ``due`` of github_poll schedule ``s``; returns what happened."""
        if self.poller is None:
            if not self._warned:
                self._warned = True
                log.warning("github_poll schedules only advance their cadence: no GitHub poller is configured")
            return await self._finish(s, due, nxt, "schedule.active.poll_unconfigured", "no GitHub poller configured", {})
        repo = s["github_repo"]
        try:
            flt = check_filter(s.get("github_filter"))
        except ValueError as exc:
            return await self._finish(s, due, nxt, "schedule.active.poll_failed", str(exc), {})
        key = (s["id"], repo)
        try:
            result = await self.poller.fetch(repo, etag=self.etags.get(key), cursor=s.get("github_cursor"))
        except Exception as exc:  # noqa: BLE001 - an adapter failure is a failed poll, never a dead tick
            result = PollResult("failed", detail=f"poller raised {exc!r}")
        now = self.firing.book.clock.now()
        if result.status == "unauthorized":
            count = int(s.get("poller_consecutive_401") or 0) + 1
            log.warning("GitHub answered 401 for %s (%d in a row); check scheduler.github_token", repo, count)
            return await self._finish(s, due, nxt, "schedule.active.poll_unauthorized",
                                      f"401 from GitHub for {repo} ({count} in a row): {result.detail}"[:500],
                                      {"poller_consecutive_401": count})
        if result.status != "ok" and result.status != "not_modified":
            log.warning("polling %s failed: %s", repo, result.detail)
            return await self._finish(s, due, nxt, "schedule.active.poll_failed",
                                      f"poll of {repo} failed: {result.detail}"[:500], {})
        healthy = {"last_healthy_poll_at": now, "poller_consecutive_401": 0}
        if result.status == "not_modified":
            return await self._finish(s, due, nxt, "schedule.active.poll", f"{repo}: not modified (304)", healthy)
        events = new_events(result.events, cursor=s.get("github_cursor"), not_before=s["created_at"], flt=flt)
        cursor, fired, waiting = s.get("github_cursor"), 0, None
        for number, event in events:
            ctx = event_context(context, repo, event)
            outcome = await self.firing.event(s, due, cursor, str(number), ctx)
            if outcome in ("exhausted", "conflict"):
                return outcome  # the schedule moved on without us: no cadence write
            if outcome != "fired":
                waiting = outcome
                break
            cursor, fired = str(number), fired + 1
        pending = len(events) - fired
        if waiting is None:
            if result.etag:
                self.etags[key] = result.etag
            summary = f"{repo}: {len(result.events)} event(s) on {result.pages} page(s), {fired} fired"
            return await self._finish(s, due, nxt, "schedule.active.poll", summary, healthy, fired=fired)
        # Events wait: forget the ETag (a 304 would hide them) and come back on the next tick.
        self.etags.pop(key, None)
        retry = now + self.tick_seconds
        why = "a run of this schedule is still running" if waiting == "overlap" else "no global slot is free"
        summary = f"{repo}: {fired} fired, {pending} event(s) wait ({why})"
        return await self._finish(s, due, retry if nxt is None else min(nxt, retry), "schedule.active.poll_deferred",
                                  summary, healthy, fired=fired)

    async def _finish(self, s: Mapping[str, Any], due: float, nxt: float | None, code: str, summary: str,
                      patch: Mapping[str, Any], *, fired: int = 0) -> str:
        """The poll's one cadence transition, with the health columns (S13)."""
        if not await self.firing.advance(s, due, nxt, code, summary, patch):
            return "conflict"
        return "fired" if fired else code.rsplit(".", 1)[1]
