"""``statebook notify``: inspect notifications and their channel attempts, recover failures, answer them,
apply retention (specs/notifications.md).

There is no send command: producers use the library API (``send_notification``), as for dispatches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from statebook.lifecycle import Actor, Book
from statebook.lifecycle.inputs import INT32, duration, integer
from statebook.outbox.notifications import (
    ChannelAttempt, DeadLetter, Notification, NotificationResponse, Replayed, TimeoutCallback, RetentionReport, ack_notification, apply_notification_retention, dismiss_notification, get_notification,
    get_response, list_dead_letters, list_notifications, notification_attempts, replay_notification,
    resolve_notification, timeout_callbacks,
)
from statebook.outbox.notifications.policy import NOTIFICATION_STATUSES, RESPONSE_STATUSES

ANSWERS = tuple(s for s in RESPONSE_STATUSES if s not in NOTIFICATION_STATUSES)
"""Response statuses ``notify ls --status`` takes besides the notification's own (``pending`` is the
notification's: a response's ``pending`` is the absence of an answer)."""

from .app import (YES_HELP, app, confirm, emit_json, fail, format_time, parse_time, print_table,
                  require_consent, run, with_book)
from .dispatch import operator, progress_bar

notify_app = typer.Typer(help="Notifications: list them, show one with its channel attempts, recover failures, "
                              "answer them, apply retention.",
                         no_args_is_help=True)
app.add_typer(notify_app, name="notify")


@notify_app.command("ls")
def ls_cmd(
    status: str = typer.Option(None, "--status", help=f"Only this status ({', '.join(NOTIFICATION_STATUSES)}), or "
                                                       f"this answer ({', '.join(ANSWERS)})."),
    dead_letter: bool = typer.Option(False, "--dead-letter", help="Only dead letters (failed, visible to operators)."),
    limit: int = typer.Option(50, "--limit", min=1, help="At most this many rows, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List notifications, newest first."""
    integer("--limit", limit, low=1, high=INT32[1])
    if status is not None and status not in NOTIFICATION_STATUSES and status not in ANSWERS:
        raise fail(f"--status: unknown status {status[:60]!r}; statuses are {', '.join(NOTIFICATION_STATUSES)}, "
                   f"and answers {', '.join(ANSWERS)}")
    answer = status if status in ANSWERS else None

    async def go(book: Book) -> list[Notification]:
        return await list_notifications(book, status=None if answer else status, response=answer,
                                        dead_letter=True if dead_letter else None, limit=limit)

    rows = run(with_book(go)())
    if as_json:
        emit_json([r.dump() for r in rows])
        return
    from rich.table import Column, Table

    table = Table(Column("id", no_wrap=True, min_width=32), "recipient", "mode", "channels",
                  Column("status", no_wrap=True), "cycle", "attempts", "next attempt (UTC)", "last error")
    for r in rows:
        status_text = r.status + (" (dead letter)" if r.dead_letter else "")
        due = format_time(r.next_attempt_at) if r.status in ("pending", "rate_limited") else "-"
        table.add_row(r.id, r.recipient, r.mode, ",".join(r.channels), status_text, str(r.cycle),
                      f"{r.cycle_attempts}/{r.max_cycle_attempts} ({r.attempts} in all)", due,
                      (r.last_error or "")[:60])
    print_table(table)


async def _both(book: Book, notification_id: str) -> tuple[Notification | None, list[ChannelAttempt]]:
    row = await get_notification(book, notification_id)
    return row, ([] if row is None else await notification_attempts(book, notification_id))


@notify_app.command("show")
def show_cmd(notification_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Print one notification as JSON, with its channel attempts cycle by cycle."""

    async def go(book: Book) -> tuple[Notification | None, list[ChannelAttempt]]:
        return await _both(book, notification_id)

    async def extra(book: Book) -> tuple[NotificationResponse | None, list[TimeoutCallback]]:
        return await get_response(book, notification_id), await timeout_callbacks(book, notification_id)

    row, attempts = run(with_book(go)())
    if row is None:
        raise fail(f"notification {notification_id} does not exist")
    response, callbacks = run(with_book(extra)())
    cycles: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        cycles.setdefault(str(a.cycle), []).append(a.dump())
    emit_json({**row.dump(), "attempts_by_cycle": cycles, "response": None if response is None else response.dump(),
               "callbacks": [c.dump() for c in callbacks]})


@notify_app.command("attempts")
def attempts_cmd(
    notification_id: str = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """A notification's channel attempts, in the order they were made."""

    async def go(book: Book) -> tuple[Notification | None, list[ChannelAttempt]]:
        return await _both(book, notification_id)

    row, attempts = run(with_book(go)())
    if row is None:
        raise fail(f"notification {notification_id} does not exist")
    if as_json:
        emit_json([a.dump() for a in attempts])
        return
    from rich.table import Table

    table = Table("cycle", "attempt", "channel", "result", "admitted (UTC)", "ended (UTC)", "retries", "duplicate risk",
                  "detail")
    for a in attempts:
        table.add_row(str(a.cycle), str(a.attempt), a.channel, a.status, format_time(a.started_at),
                      format_time(a.ended_at), str(a.provider_retries), "yes" if a.duplicate_risk else "",
                      (a.detail or "")[:60])
    print_table(table)


# -- recovery: the dead-letter view, replay, resolve (specs/notifications.md N25-N29) -----------------
@notify_app.command("dead-letters")
def dead_letters_cmd(
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, oldest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Dead letters (failed, awaiting an operator), each with what blocks its replay, if anything."""
    integer("--limit", limit, low=1, high=INT32[1])

    async def go(book: Book) -> list[DeadLetter]:
        return await list_dead_letters(book, limit=limit)

    rows = run(with_book(go)())
    if as_json:
        emit_json([r.dump() for r in rows])
        return
    from rich.table import Column, Table

    table = Table(Column("id", no_wrap=True, min_width=32), "recipient", "cycle", "attempts", "failed (UTC)",
                  "replay", "last error")
    for r in rows:
        replay = "ok" if r.replay_block_reason is None else (
            r.replay_block_reason + (f" by {r.replay_blocked_by}" if r.replay_blocked_by else ""))
        table.add_row(r.id, r.recipient, str(r.cycle), str(r.attempts), format_time(r.updated_at),
                      replay, (r.last_error or "")[:60])
    print_table(table)


@notify_app.command("replay")
def replay_cmd(
    notification_id: str = typer.Argument(..., metavar="ID"),
    note: str = typer.Option(None, "--note", help="Why (kept in the replay's fact)."),
) -> None:
    """Replay a failed notification: a new delivery cycle, same id, its obligation taken back. Refused
    (exit 2, with the reason and the blocker) while someone else holds the obligation."""

    async def go(book: Book) -> Replayed:
        return await replay_notification(book, notification_id, actor=operator(), note=note)

    done = run(with_book(go, writes=True)())
    covered = f"; took over {', '.join(done.covered)}" if done.covered else ""
    typer.echo(f"replayed {done.id} (cycle {done.cycle}){covered}")


@notify_app.command("resolve")
def resolve_cmd(
    notification_id: str = typer.Argument(..., metavar="ID"),
    reason: str = typer.Option(..., "--reason", help="Why the failure needs nothing more (audited)."),
) -> None:
    """Resolve a dead letter: it stays failed, leaves the dead-letter view, and the fact records who and why."""

    async def go(book: Book) -> Notification:
        return await resolve_notification(book, notification_id, reason=reason, actor=operator())

    row = run(with_book(go, writes=True)())
    typer.echo(f"resolved {row.id} by {row.resolved_by}")


# -- responses: acknowledge, dismiss (specs/notifications.md N31-N39) ------------------------------------
ACTOR_FORMAT = "type:id (e.g. operator:alice)"


def parse_actor(text: str, option: str = "--actor") -> Actor:
    """``type:id`` as an :class:`Actor`; anything else (no ``:``, an empty type or id) is refused in one line."""
    kind, colon, ident = text.partition(":")
    if not colon or not kind.strip() or not ident.strip():
        raise fail(f"{option}: expected {ACTOR_FORMAT}, got {text[:60]!r}")
    try:
        return Actor(kind, ident)
    except ValueError as exc:
        raise fail(f"{option}: {exc}; expected {ACTOR_FORMAT}") from None


def _answer(notification_id: str, actor: str, note: str | None, target: str) -> None:
    who = parse_actor(actor)

    async def go(book: Book) -> NotificationResponse:
        answer = ack_notification if target == "acked" else dismiss_notification
        return await answer(book, notification_id, actor=who, note=note)

    response = run(with_book(go, writes=True)())
    typer.echo(f"{response.status} {response.id} by {response.responder}")


@notify_app.command("ack")
def ack_cmd(
    notification_id: str = typer.Argument(..., metavar="ID"),
    actor: str = typer.Option(..., "--actor", help="Who acknowledges, as type:id (e.g. operator:alice)."),
    note: str = typer.Option(None, "--note", help="Kept with the answer."),
) -> None:
    """Acknowledge a delivered notification (a follower's answers its owner). Asking again as the same
    actor prints the original answer; another answer already recorded is refused (exit 2)."""
    _answer(notification_id, actor, note, "acked")


@notify_app.command("dismiss")
def dismiss_cmd(
    notification_id: str = typer.Argument(..., metavar="ID"),
    actor: str = typer.Option(..., "--actor", help="Who dismisses, as type:id (e.g. operator:alice)."),
    note: str = typer.Option(None, "--note", help="Kept with the answer."),
) -> None:
    """Dismiss a delivered notification; the same rules as ``ack``."""
    _answer(notification_id, actor, note, "dismissed")
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
    yes: bool = typer.Option(False, "--yes", "-y", help=YES_HELP),
) -> None:
    """Explicit retention: remove settled notifications (never unsettled work, dead letters or what they link to).

    Says what it will remove and asks first, unless --yes or --dry-run; without a terminal to ask on it
    needs --yes."""
    cutoff = parse_time(before, "--before")
    seconds = parse_duration(horizon, "--horizon")
    if not dry_run:
        require_consent("notify retain", yes)
        confirm(f"this removes every settled notification last changed before {format_time(cutoff)} and older "
                f"than {horizon.strip()} (with its attempts and answers; never unsettled work or dead letters); "
                "`--dry-run` lists them first", yes=yes)

    async def go(book: Book) -> RetentionReport:
        with progress_bar("removing", enabled=not dry_run) as tick:
            return await apply_notification_retention(book, before=cutoff, horizon=seconds, dry_run=dry_run,
                                                      actor=operator(), progress=tick)

    report = run(with_book(go, writes=True)())  # a dry run records its run too
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
