"""``statebook notify``: inspect notifications and their channel attempts; explicit retention (specs/notifications.md).

There is no send command: producers use the library API (``send_notification``), as for dispatches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from statebook.lifecycle import Book
from statebook.lifecycle.inputs import INT32, duration, integer
from statebook.outbox.notifications import (
    RetentionReport, apply_notification_retention, get_notification, list_notifications, notification_attempts,
)
from statebook.outbox.notifications.policy import NOTIFICATION_STATUSES

from .app import app, console, emit_json, fail, format_time, parse_time, run, with_book
from .dispatch import operator, progress_bar

notify_app = typer.Typer(help="Notifications: list them, show one with its channel attempts, apply retention.",
                         no_args_is_help=True)
app.add_typer(notify_app, name="notify")


@notify_app.command("ls")
def ls_cmd(
    status: str = typer.Option(None, "--status", help=f"Only this status ({', '.join(NOTIFICATION_STATUSES)})."),
    dead_letter: bool = typer.Option(False, "--dead-letter", help="Only dead letters (failed, visible to operators)."),
    limit: int = typer.Option(50, "--limit", min=1, help="At most this many rows, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List notifications, newest first."""
    integer("--limit", limit, low=1, high=INT32[1])

    async def go(book: Book) -> list[dict[str, Any]]:
        return await list_notifications(book, status=status, dead_letter=True if dead_letter else None, limit=limit)

    rows = run(with_book(go)())
    if as_json:
        emit_json(rows)
        return
    from rich.table import Column, Table

    table = Table(Column("id", no_wrap=True, min_width=32), "recipient", "mode", "channels",
                  Column("status", no_wrap=True), "cycle", "attempts", "next attempt (UTC)", "last error")
    for r in rows:
        status_text = r["status"] + (" (dead letter)" if r["dead_letter"] else "")
        due = format_time(r["next_attempt_at"]) if r["status"] in ("pending", "rate_limited") else "-"
        table.add_row(r["id"], r["recipient"], r["mode"], ",".join(r["channels"]), status_text, str(r["cycle"]),
                      f"{r['cycle_attempts']}/{r['max_cycle_attempts']} ({r['attempts']} in all)", due,
                      (r["last_error"] or "")[:60])
    console.print(table)


async def _both(book: Book, notification_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    row = await get_notification(book, notification_id)
    return row, ([] if row is None else await notification_attempts(book, notification_id))


@notify_app.command("show")
def show_cmd(notification_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Print one notification as JSON, with its channel attempts cycle by cycle."""

    async def go(book: Book) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return await _both(book, notification_id)

    row, attempts = run(with_book(go)())
    if row is None:
        raise fail(f"notification {notification_id} does not exist")
    cycles: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        cycles.setdefault(str(a["cycle"]), []).append(a)
    emit_json({**row, "attempts_by_cycle": cycles})


@notify_app.command("attempts")
def attempts_cmd(
    notification_id: str = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """A notification's channel attempts, in the order they were made."""

    async def go(book: Book) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return await _both(book, notification_id)

    row, attempts = run(with_book(go)())
    if row is None:
        raise fail(f"notification {notification_id} does not exist")
    if as_json:
        emit_json(attempts)
        return
    from rich.table import Table

    table = Table("cycle", "attempt", "channel", "result", "admitted (UTC)", "ended (UTC)", "retries", "duplicate risk",
                  "detail")
    for a in attempts:
        table.add_row(str(a["cycle"]), str(a["attempt"]), a["channel"], a["status"],
                      format_time(a["started_at"]) if a["started_at"] is not None else "-",
                      format_time(a["ended_at"]) if a["ended_at"] is not None else "-", str(a["provider_retries"]),
                      "yes" if a["duplicate_risk"] else "", (a["detail"] or "")[:60])
    console.print(table)


UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_duration(text: str, option: str) -> float:
    """Seconds, or a number with a unit (``90s``, ``30m``, ``12h``, ``7d``, ``2w``); checked as the API
    checks a duration (``inputs.duration``: finite, at most a century)."""
    raw = text.strip().lower()
    scale = UNITS.get(raw[-1:], 1.0) if raw else 1.0
    number = raw[:-1] if raw[-1:] in UNITS else raw
    try:
        seconds = float(number) * scale
    except ValueError:
        raise fail(f"{option} {text!r} is not a duration: give seconds or a number with s, m, h, d or w "
                   "(e.g. 7d)") from None
    return duration(option, seconds, positive=True)


@notify_app.command("retain")
def retain_cmd(
    before: str = typer.Option(..., "--before", help="Remove settled notifications last changed before this time "
                                                       "(POSIX or ISO-8601)."),
    horizon: str = typer.Option(..., "--horizon", help="The minimum idempotency horizon: no notification younger "
                                                         "than this goes (seconds, or e.g. 7d); the cutoff must be "
                                                         "at least this old."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed; remove nothing (the run is "
                                                          "recorded)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Explicit retention: remove settled notifications (never unsettled work, dead letters or what they link to)."""
    cutoff = parse_time(before, "--before")
    seconds = parse_duration(horizon, "--horizon")

    async def go(book: Book) -> RetentionReport:
        with progress_bar("removing", enabled=not dry_run) as tick:
            return await apply_notification_retention(book, before=cutoff, horizon=seconds, dry_run=dry_run,
                                                      actor=operator(), progress=tick)

    report = run(with_book(go)())
    if as_json:
        emit_json(dataclasses.asdict(report))
        return
    for nid in report.notifications:
        typer.echo(nid)
    done = "would remove" if dry_run else "removed"

    def line(kind: str, c: dict[str, Any]) -> str:
        why = ", ".join(f"{k} {v}" for k, v in c["protected_by"].items())
        return f"{kind}: {c['removed']} {done}, {c['protected']} protected" + (f" ({why})" if why else "")

    kinds = "; ".join(line(kind, c) for kind, c in report.counts.items())
    typer.echo(f"run {report.run_id}: {kinds}", err=True)
