"""The story ``statebook run --for N`` ends with (specs/operations.md O8): what this run did, from the database.

:func:`run_summary` reads what this daemon recorded — its runs by status, with why a run was skipped or
cancelled — and the dispatch of its runs it delivered during the run, with its history; the delivery counts are
its workers' own. :func:`summary` adds the database's totals and a verify. :func:`tell` writes the story as
text, or as one JSON record beside the JSON log lines (``--log-format json``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, history, verify
from statebook.outbox import dispatch_outbox
from statebook.outbox.notifications import notifications
from statebook.scheduler.schema import schedule_runs, schedules

DELIVERED = ("delivered", "acked")
"""Dispatch statuses the run's story ends on: a dispatch whose send went through."""

WHY = {
    "schedule_run.cancelled.shutdown": "running when the daemon stopped",
    "schedule_run.cancelled.operator": "by an operator",
    "schedule_run.skipped.missed_fire": "missed while no daemon ran",
    "schedule_run.skipped.overlap": "the previous run was still running",
    "schedule_run.skipped.deferred_capacity": "no free slot",
}
"""Why a run ended without running to completion, by its reason code, in the story's words."""

SCHEDULER_COUNTS = ("ticks", "fired", "skipped", "deferred", "errors")


async def run_summary(book: Book, daemon_id: str, *, started_at: float, scheduler: Mapping[str, int],
                      deliveries: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """What this run did: the runs this daemon recorded, by status and by reason; the deliveries its workers
    counted; a dispatch of its runs delivered since ``started_at``, with its full history (none otherwise:
    never one an earlier run delivered)."""
    t, r = dispatch_outbox, schedule_runs
    async with book.read() as conn:
        rows = (await conn.execute(sa.select(r.c.status, r.c.status_reason_code, sa.func.count())
                                   .where(r.c.daemon_id == daemon_id)
                                   .group_by(r.c.status, r.c.status_reason_code))).all()
        mine = sa.select(r.c.id).where(r.c.daemon_id == daemon_id)
        delivered = (await conn.execute(
            sa.select(t.c.id).where(t.c.status.in_(DELIVERED), t.c.schedule_run_id.in_(mine),
                                    t.c.updated_at >= started_at)
            .order_by(t.c.updated_at.desc(), t.c.id).limit(1))).scalar()
    runs: dict[str, int] = {}
    reasons: dict[str, dict[str, int]] = {}
    for status, reason, count in rows:
        runs[status] = runs.get(status, 0) + int(count)
        if status not in ("completed", "running"):
            reasons.setdefault(status, {})[reason] = reasons.get(status, {}).get(reason, 0) + int(count)
    return {
        "daemon_id": daemon_id,
        "started_at": started_at,
        "scheduler": {k: int(scheduler.get(k, 0)) for k in SCHEDULER_COUNTS},
        "runs": runs,
        "runs_by_reason": reasons,
        "deliveries": {part: dict(counts) for part, counts in deliveries.items()},
        "delivered_dispatch": delivered,
        "delivered_history": [_fact_line(f) for f in (await history(book, "dispatch", delivered) if delivered else [])],
    }


def _fact_line(f: Any) -> dict[str, Any]:
    return {"at": f.at, "from": f.previous_status, "to": f.status, "reason": f.reason_code,
            "summary": f.reason_summary, "actor": f"{f.actor_type}:{f.actor_id}", "version": f.version}


async def summary(book: Book) -> dict[str, Any]:
    """The whole database's counts by status, the latest dispatch's history, and a verify."""
    out: dict[str, Any] = {}
    async with book.read() as conn:
        parts = [("schedules", schedules), ("runs", schedule_runs), ("dispatches", dispatch_outbox)]
        if "notification" in book.registry:  # an application's registry may leave notifications out
            parts.append(("notifications", notifications))
        for name, table in parts:
            rows = await conn.execute(sa.select(table.c.status, sa.func.count()).group_by(table.c.status))
            out[name] = {status: count for status, count in rows}
        latest = (
            await conn.execute(
                sa.select(dispatch_outbox.c.id).order_by(dispatch_outbox.c.created_at.desc(), dispatch_outbox.c.id).limit(1)
            )
        ).scalar()
    out["latest_dispatch"] = latest
    out["latest_history"] = [
        {"at": f.at, "from": f.previous_status, "to": f.status, "reason": f.reason_code, "actor": f"{f.actor_type}:{f.actor_id}"}
        for f in (await history(book, "dispatch", latest) if latest else [])
    ]
    report = await verify(book)
    out["verify"] = {"ok": report.ok, "findings": len(report.findings)}
    return out


# -- telling it ---------------------------------------------------------------------------------------------

def counted(by_status: Mapping[str, int]) -> str:
    """``3 (completed 2, failed 1)``; ``0`` for nothing."""
    total = sum(by_status.values())
    parts = ", ".join(f"{k} {v}" for k, v in sorted(by_status.items()) if v)
    return f"{total} ({parts})" if parts else str(total)


def _why(reasons: Mapping[str, Mapping[str, int]]) -> str:
    """``cancelled: 1 running when the daemon stopped; skipped: 1 missed while no daemon ran``."""
    said = []
    for status, by_reason in sorted(reasons.items()):
        parts = ", ".join(f"{n} {WHY.get(code, code.rsplit('.', 1)[-1].replace('_', ' '))}"
                          for code, n in sorted(by_reason.items()))
        said.append(f"{status}: {parts}")
    return "; ".join(said)


def lines(result: Mapping[str, Any], when: Callable[[float], str]) -> list[str]:
    """The story as text lines: this run, its deliveries, the history of a dispatch it delivered, the database
    (its last line: scripts look for ``verify ok``). ``when`` writes a time."""
    this = result.get("run") or {}
    sched = this.get("scheduler", {})
    why = _why(this.get("runs_by_reason") or {})
    deferred = f"; deferred {sched['deferred']} (no free slot; not every deferral is a run)" if sched.get("deferred") else ""
    out = [f"this run (daemon {this.get('daemon_id', '?')}): runs {counted(this.get('runs', {}))}"
           + (f" — {why}" if why else "") + deferred]
    for lifecycle, counts in sorted((this.get("deliveries") or {}).items()):
        outcomes = {k: v for k, v in counts.items() if k not in ("attempted", "claimed")}
        tried = counts.get("attempted", counts.get("claimed", 0))
        done = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()) if v) or "none ended"
        out.append(f"this run's {lifecycle} deliveries: {tried} attempted; {done}")
    if this.get("delivered_dispatch"):
        out.append(f"history of dispatch {this['delivered_dispatch']}, delivered in this run:")
        for h in this["delivered_history"]:
            out.append(f"  v{h['version']} {when(h['at'])} {h['from'] or '-'} -> {h['to'] or '(purged)'}  "
                       f"{h['reason']}  ({h['actor']}) {h['summary']}")
    else:
        out.append("no dispatch of this run was delivered")
    notified = result.get("notifications") or {}
    verdict = "ok" if result["verify"]["ok"] else f"FAILED: {result['verify']['findings']} finding(s)"
    out.append(f"database: runs {counted(result['runs'])}; dispatches {counted(result['dispatches'])}; "
               + (f"notifications {counted(notified)}; " if notified else "") + f"verify {verdict}")
    return out


def record(result: Mapping[str, Any]) -> str:
    """The story as one JSON object, shaped like a JSON log line (``event`` ``run_summary``)."""
    from .logs import JsonFormatter

    this = dict(result.get("run") or {})
    database = {k: result.get(k) for k in ("schedules", "runs", "dispatches", "notifications") if k in result}
    entry = logging.LogRecord("statebook.daemon", logging.INFO, __file__, 0, "run summary: %s", (
        f"runs {counted(this.get('runs', {}))}; verify {'ok' if result['verify']['ok'] else 'FAILED'}",), None)
    for key, value in {**this, "event": "run_summary", "database": database, "verify": result["verify"]}.items():
        setattr(entry, key, value)
    return JsonFormatter().format(entry)
