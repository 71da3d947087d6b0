"""``statebook demo``: declare a lifecycle of your own, drive entities through it, audit the history.

Read it as an example of embedding statebook: a ``ticket`` lifecycle with its own table sits in a
registry next to the built-ins, every status change goes through ``create``/``transition`` with a
declared reason, and ``verify`` proves afterwards that every row equals the fold of its facts.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlalchemy as sa
from rich.console import Console
from sqlalchemy.engine import make_url

from statebook.lifecycle import (
    Actor,
    Lifecycle,
    Reason,
    TransitionConflict,
    TransitionRejected,
    create,
    edges,
    history,
    managed_table,
    transition,
    verify,
)
from statebook.lifecycle.replay import Report

from .db import normalize_url, open_book
from .errors import ConfigError
from .registry import builtin_registry

# The demo's table lives in its own MetaData: it must not join the schema of every statebook database.
demo_metadata = sa.MetaData()
TICKET_STATUSES = ("open", "in_progress", "resolved", "closed")
tickets = managed_table(
    "demo_tickets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("assignee", sa.Text, nullable=True),
    meta=demo_metadata,
)

TICKET = Lifecycle(
    entity_type="ticket",
    table=tickets,
    statuses=TICKET_STATUSES,
    initial={"open"},
    terminal={"closed"},
    edges=(
        *edges("open", "in_progress", patch="assignee"),  # taking a ticket names who took it
        *edges("in_progress", "open", "resolved"),
        *edges("resolved", "in_progress", "closed"),
        *edges("closed", "open", actors="operator"),  # a terminal status is left only by a gated edge
    ),
    patch_fields={"assignee"},
    reason_prefixes={"ticket"},
    reasons={
        "ticket.open.reported", "ticket.open.reopened", "ticket.open.unassigned", "ticket.in_progress.taken",
        "ticket.in_progress.regressed", "ticket.resolved.fixed", "ticket.closed.confirmed",
    },
    description="A support ticket: reported, taken, resolved, closed; only an operator reopens a closed one.",
)


def _fresh_sqlite_file(db: str) -> str:
    """The demo's URL, after removing the previous demo database (and refusing to touch any other)."""
    url = make_url(normalize_url(db))
    if url.get_backend_name() != "sqlite":
        raise ConfigError(f"the demo runs on an embedded SQLite file, not {url.get_backend_name()}")
    path = Path(url.database or "")
    if path.exists():
        with sqlite3.connect(path) as conn:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if names and tickets.name not in names:
            raise ConfigError(f"{path} is not a demo database; pass another --db or remove it yourself")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return str(url)


async def run_demo(db: str, console: Console) -> Report:
    """Declare the demo ``ticket`` lifecycle, drive a few tickets through it on a fresh SQLite file at ``db``, print
    their history and return the verify report.
    """
    from statebook.adapters.cli.lifecycle import history_table, print_report

    registry = builtin_registry(seal=False)
    registry.register(TICKET)  # validated here: a bad declaration fails before any row is written
    registry.seal()
    book = await open_book(_fresh_sqlite_file(db), registry=registry)
    try:
        async with book.engine.begin() as conn:
            await conn.run_sync(demo_metadata.create_all)
        say = console.print
        ana, bo, root = Actor("user", "ana"), Actor("agent", "bo"), Actor("operator", "root")

        printer = await create(book, "ticket", values={"title": "Printer on fire"}, status="open",
                               reason=Reason("ticket.open.reported", "reported by mail"), actor=ana)
        wifi = await create(book, "ticket", values={"title": "Wi-Fi drops at noon"}, status="open",
                            reason=Reason("ticket.open.reported"), actor=ana)
        say(f"created tickets {printer.entity_id} and {wifi.entity_id} (open)")

        taken = await transition(book, "ticket", printer.entity_id, "in_progress", expected="open",
                                 patch={"assignee": "bo"}, reason=Reason("ticket.in_progress.taken"), actor=bo)
        say(f"bo takes the printer ticket: {taken.kind}, now {taken.status} v{taken.version}")

        try:  # a second agent read "open" a moment ago: the compare-and-set refuses its stale view
            await transition(book, "ticket", printer.entity_id, "in_progress", expected="open",
                             patch={"assignee": "cy"}, reason=Reason("ticket.in_progress.taken"),
                             actor=Actor("agent", "cy"))
        except TransitionConflict as exc:
            say(f"cy tries to take it too: [yellow]conflict[/yellow] (it is {exc.actual} v{exc.version}; "
                "nothing written)")

        try:  # no edge in_progress -> closed: refused before anything is written
            await transition(book, "ticket", printer.entity_id, "closed", expected="in_progress",
                             reason=Reason("ticket.closed.confirmed"), actor=bo)
        except TransitionRejected as exc:
            say(f"bo tries to close it unresolved: [red]rejected[/red] ({exc.rule}): {exc}", highlight=False)

        await transition(book, "ticket", printer.entity_id, "resolved", expected="in_progress",
                         reason=Reason("ticket.resolved.fixed", evidence=("log://printer/42",)), actor=bo)
        await transition(book, "ticket", printer.entity_id, "closed", expected="resolved",
                         reason=Reason("ticket.closed.confirmed"), actor=ana)
        say("bo resolves it; ana's confirmation closes it")

        # A retried command with the same idempotency key returns the first outcome and writes nothing.
        for attempt in (1, 2):
            took = await transition(book, "ticket", wifi.entity_id, "in_progress", expected="open",
                                    patch={"assignee": "cy"}, reason=Reason("ticket.in_progress.taken"),
                                    actor=Actor("agent", "cy"), idempotency_key="cy-takes-wifi")
            say(f"cy takes the Wi-Fi ticket (try {attempt}): {took.kind}, v{took.version}, replayed={took.replayed}")

        try:  # closed is terminal: only an operator may reopen it
            await transition(book, "ticket", printer.entity_id, "open", expected="closed",
                             reason=Reason("ticket.open.reopened"), actor=ana)
        except TransitionRejected as exc:
            say(f"ana tries to reopen it: [red]rejected[/red] ({exc.rule}): {exc}", highlight=False)
        await transition(book, "ticket", printer.entity_id, "open", expected="closed",
                         reason=Reason("ticket.open.reopened", "smoke again"), actor=root)
        say("the operator reopens it")

        say(history_table(await history(book, "ticket", printer.entity_id), "history of the printer ticket"))
        report = await verify(book)
        print_report(report)
        return report
    finally:
        await book.engine.dispose()
