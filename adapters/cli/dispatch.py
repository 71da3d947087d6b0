"""``statebook dispatch``: inspect, acknowledge, retry, expedite, purge and deliver outbox rows.

There is no enqueue command: producers use the library API (specs/outbox.md O18). Ack tokens are
capabilities, so ``ls`` and ``show`` mask them (in the row and in the payload) unless ``--reveal``: both
print the :class:`~statebook.outbox.Dispatch` model's dump, which masks them.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

from statebook.lifecycle import Actor, Book
from statebook.lifecycle.inputs import INT32, integer
from statebook.outbox import (
    ArgvTransport,
    DeliveryWorker,
    Dispatch,
    Retention,
    ack_dispatch,
    deliver_due_dispatches,
    expedite_dispatch,
    get_dispatch,
    list_dispatches,
    purge_dispatch,
    purge_dispatches,
    retry_dispatch,
)
from statebook.outbox.dispatch.schema import DISPATCH_STATUSES

from .app import (YES_HELP, app, confirm, emit_json, fail, format_time, parse_time, print_table,
                  require_consent, run, with_book)

dispatch_app = typer.Typer(help="The dispatch outbox: inspect, ack, retry, expedite, purge, deliver.",
                            no_args_is_help=True)
app.add_typer(dispatch_app, name="dispatch")

FAILED_COUNTERS = ("retried", "dead_letter", "expired")
"""Counters of a delivery pass that mean a delivery failed (``deliver --once`` exits 1)."""


def operator() -> Actor:
    """``operator:<login name>`` from $USER (or the OS account)."""
    name = os.environ.get("USER") or os.environ.get("USERNAME")
    if not name:
        try:
            name = getpass.getuser()
        except Exception:
            name = "unknown"
    return Actor("operator", name)


@dispatch_app.command("ls")
def ls_cmd(
    status: str = typer.Option(None, "--status", help=f"Only this status ({', '.join(DISPATCH_STATUSES)})."),
    limit: int = typer.Option(50, "--limit", min=1, help="At most this many rows, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    reveal: bool = typer.Option(False, "--reveal", help="Show ack tokens instead of masking them."),
) -> None:
    """List dispatches, newest first."""
    integer("--limit", limit, low=1, high=INT32[1])

    async def go(book: Book) -> list[Dispatch]:
        return await list_dispatches(book, status=status, limit=limit)

    rows = run(with_book(go)())
    if as_json:
        emit_json([r.dump(reveal=reveal) for r in rows])  # the model masks ack tokens unless revealed
        return
    from rich.table import Column, Table

    table = Table(
        Column("id", no_wrap=True, min_width=32),  # whole, so it can be copied
        "kind", "deliver_to", Column("status", no_wrap=True), "attempt", "next attempt (UTC)", "last error",
    )
    for r in rows:
        table.add_row(
            r.id, r.kind, r.deliver_to, r.status, f"{r.attempt}/{r.max_attempts}",
            format_time(r.next_attempt_at) if r.status in ("pending", "delivering") else "-",
            (r.last_error or "")[:60],
        )
    print_table(table)


@dispatch_app.command("show")
def show_cmd(
    dispatch_id: str = typer.Argument(..., metavar="ID"),
    reveal: bool = typer.Option(False, "--reveal", help="Show the ack token instead of masking it."),
) -> None:
    """Print one dispatch as JSON."""

    async def go(book: Book) -> Dispatch | None:
        return await get_dispatch(book, dispatch_id)

    row = run(with_book(go)())
    if row is None:
        raise fail(f"dispatch {dispatch_id} does not exist")
    emit_json(row.dump(reveal=reveal))


@dispatch_app.command("ack")
def ack_cmd(dispatch_id: str = typer.Argument(..., metavar="ID"), token: str = typer.Argument(..., metavar="TOKEN")) -> None:
    """Acknowledge a dispatch with its token."""

    async def go(book: Book) -> bool:
        return await ack_dispatch(book, dispatch_id, token, actor=operator())

    if not run(with_book(go, writes=True)()):
        raise fail(f"dispatch {dispatch_id} changed concurrently and was not acknowledged; try again")
    typer.echo(f"acked {dispatch_id}")


@dispatch_app.command("retry")
def retry_cmd(dispatch_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Send a dead_letter or expired dispatch again (attempts reset to 0)."""

    async def go(book: Book) -> tuple[bool, str | None]:
        done = await retry_dispatch(book, dispatch_id, actor=operator())
        row = await get_dispatch(book, dispatch_id)
        return done, row.status if row else None

    done, status = run(with_book(go, writes=True)())
    if not done:  # a wrong status raised (exit 2); False is a race lost to another writer
        raise fail(f"dispatch {dispatch_id} changed while it was retried (it is {status} now); run the command again "
                   "if it still needs a retry", 1)
    typer.echo(f"retried {dispatch_id}")


@dispatch_app.command("expedite")
def expedite_cmd(dispatch_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Deliver a pending dispatch now instead of after its backoff (its attempts and their bound stay)."""

    async def go(book: Book) -> bool:
        return await expedite_dispatch(book, dispatch_id, actor=operator())

    if not run(with_book(go, writes=True)()):
        raise fail(f"dispatch {dispatch_id} changed while it was expedited; run the command again if it still "
                   "waits", 1)
    typer.echo(f"expedited {dispatch_id}: due now; a running worker (statebook run, statebook dispatch deliver) "
               "sends it")


@dispatch_app.command("purge")
def purge_cmd(
    dispatch_id: str = typer.Argument(None, metavar="[ID]", help="One dispatch to purge."),
    status: list[str] = typer.Option(None, "--status", help="Bulk: purge this status (repeatable; default terminal)."),
    before: str = typer.Option(None, "--before", help="Bulk: rows last changed before this time (POSIX or ISO-8601)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Bulk: list what would be purged."),
    force: bool = typer.Option(False, "--force", help="Allow purging pending/delivering rows."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Bulk: " + YES_HELP),
) -> None:
    """Delete a dispatch (or, with --before, many) leaving an audited tombstone in its history.

    A bulk purge names how many (and which) dispatches it will purge and asks first, unless --yes;
    without a terminal to ask on it needs --yes."""
    if dispatch_id is not None:
        if status or before is not None or dry_run:
            raise fail("give either an ID or --status/--before/--dry-run for a bulk purge, not both")

        async def one(book: Book) -> bool:
            return await purge_dispatch(book, dispatch_id, actor=operator(), force=force)

        if not run(with_book(one, writes=True)()):
            raise fail(f"dispatch {dispatch_id} does not exist")
        typer.echo(f"purged {dispatch_id}")
        return
    if before is None:
        raise fail("give a dispatch ID, or --before TIME (with optional --status) for a bulk purge")
    cutoff = parse_time(before, "--before")
    if not dry_run:
        require_consent("dispatch purge --before", yes)

    async def bulk(book: Book, preview: bool) -> list[str]:
        with progress_bar("purging", enabled=not preview) as tick:
            return await purge_dispatches(
                book, statuses=status or None, before=cutoff, dry_run=preview, force=force, actor=operator(),
                progress=tick,
            )

    if not dry_run and not yes:
        chosen = run(with_book(bulk, writes=False)(True))
        if not chosen:
            typer.echo("purged 0 dispatch(es): none matches", err=True)
            return
        statuses = ", ".join(status) if status else "terminal"
        confirm(f"this purges {len(chosen)} dispatch(es) ({statuses}, last changed before {format_time(cutoff)}), "
                "leaving a tombstone in each history:", chosen, yes=yes)
    ids = run(with_book(bulk, writes=not dry_run)(dry_run))
    for did in ids:
        typer.echo(did)
    typer.echo(f"{'would purge' if dry_run else 'purged'} {len(ids)} dispatch(es)", err=True)


@contextlib.contextmanager
def progress_bar(what: str, *, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on standard error when it is a terminal (nothing otherwise): yields the
    ``progress(done, total)`` callback a long operation reports to."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield tick


@dispatch_app.command("deliver")
def deliver_cmd(
    once: bool = typer.Option(False, "--once", help="Run one delivery pass, print its counters as JSON, exit."),
    config: Path = typer.Option(None, "--config", help="Settings file (TOML) with dispatch.notify_template "
                                "(default: the global --config, else ./statebook.toml)."),
) -> None:
    """Deliver due dispatches with the configured notify_template (until Ctrl-C unless --once)."""
    from statebook.adapters.daemon import resolve_settings
    from statebook.adapters.db import open_book
    from statebook.adapters.settings import load_settings

    from .app import cli_registry, ctx_state, settings_file

    # {python} and {config_dir} in the template are filled in as `statebook run` fills them in.
    path = settings_file(config)
    settings = resolve_settings(load_settings(path), str(path) if path is not None else None)
    registry = cli_registry(settings.app)
    cfg = settings.dispatch
    transport = ArgvTransport(cfg.notify_template, timeout=cfg.transport_timeout_seconds)
    if transport.problem is not None:  # every claim would be a failed attempt: refuse before the database
        raise fail(f"{transport.problem}; `dispatch deliver` needs a transport to send with: nothing was claimed")

    async def go() -> dict[str, int] | None:
        book = await open_book(ctx_state.db_url or settings.db, registry=registry, must_exist=True, create=True,
                               limits=settings.book_limits(), app=ctx_state.app or settings.app or "",
                               chain_key=settings.audit.key())
        try:
            if once:
                return await deliver_due_dispatches(
                    book, transport=transport, batch_size=cfg.batch_size, concurrency=cfg.concurrency
                )
            await _serve(book, transport, settings)
            return None
        finally:
            await book.engine.dispose()

    counts = run(go())
    if counts is not None:
        typer.echo(json.dumps(counts, sort_keys=True))
        failed = {k: counts.get(k, 0) for k in FAILED_COUNTERS if counts.get(k, 0)}
        if failed:
            raise fail("deliveries failed this pass: " + ", ".join(f"{k} {v}" for k, v in sorted(failed.items())), 1)


async def _serve(book: Book, transport: ArgvTransport, settings: Any) -> None:
    import signal

    wakeups = None
    if book.dialect == "postgresql":
        from statebook.adapters.pgnotify import listen

        wakeups = listen(book)
    retention = (
        Retention(settings.retention.delivered_days, settings.retention.failed_days)
        if settings.retention.enabled
        else None
    )
    worker = DeliveryWorker(
        book, transport, batch_size=settings.dispatch.batch_size, concurrency=settings.dispatch.concurrency,
        tick_seconds=settings.scheduler.tick_seconds, retention=retention, extra_wakeups=wakeups,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, worker.stop)
    typer.echo("delivering; Ctrl-C to stop", err=True)
    await worker.run_until_stopped()
    typer.echo(json.dumps(worker.totals, sort_keys=True))
