"""Schema commands (specs/migrations.md): ``db upgrade | current | history | check``.

``upgrade`` runs statebook's migrations and then the registry step (missing lifecycle tables, status
CHECKs and status-index predicates brought to ``--app``'s registry); the others only read.
"""

from __future__ import annotations

from typing import Any

import typer

from .app import app, cli_app_spec, cli_registry, ctx_state, emit_json, fail, run

db_app = typer.Typer(help="The database schema: upgrade it, show its revision and history, check it.",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")

JSON_HELP = "print JSON instead of text"


async def _on_connection(fn: Any, *args: Any, must_exist: bool = True) -> Any:
    from statebook.adapters.db import connect

    engine = connect(ctx_state.db_url, must_exist=must_exist)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(fn, *args)
    finally:
        await engine.dispose()


def _command() -> str:
    from statebook.adapters.db import upgrade_command

    return upgrade_command(cli_app_spec())


@db_app.command("upgrade")
def upgrade_cmd() -> None:
    """Upgrade the schema to this statebook's head, then bring the lifecycle tables to the registry's DDL."""
    from statebook.adapters.migrations import UpgradeRefused, upgrade

    registry = cli_registry()
    try:
        report = run(_on_connection(upgrade, registry, must_exist=False))
    except UpgradeRefused as exc:
        raise fail(str(exc), 1) from None
    typer.echo(f"was: {report.before}")
    for line in report.applied:
        typer.echo(f"applied {line}")
    for line in report.ddl:
        typer.echo(f"registry: {line}")
    if not report.applied and not report.ddl:
        typer.echo("nothing to do")
    typer.echo(f"now at {report.after}")


@db_app.command("current")
def current_cmd(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """The database's schema revision ("empty", "pre-migration v2", or a revision) and this statebook's head."""
    from statebook.adapters.migrations import HEAD, read_stamp

    stamp = run(_on_connection(read_stamp))
    if as_json:
        emit_json({"current": stamp.describe(), "kind": stamp.kind, "revision": stamp.revision, "head": HEAD,
                   "at_head": stamp.revision == HEAD})
        return
    typer.echo(f"{stamp.describe()}{' (head)' if stamp.revision == HEAD else f' (head is {HEAD})'}")


@db_app.command("history")
def history_cmd(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Every revision, oldest first, the database's current one marked (works without a database)."""
    from statebook.adapters.migrations import BASELINE, read_stamp
    from statebook.adapters.migrations.upgrade import scripts_of

    here = None
    if ctx_state.db_url or _default_db_exists():
        stamp = run(_on_connection(read_stamp))
        here = stamp.revision if stamp.kind == "revision" else (BASELINE if stamp.kind == "legacy" else None)
    rows = [{"revision": rev, "down_revision": down, "message": msg, "current": rev == here}
            for rev, down, msg in scripts_of()]
    if as_json:
        emit_json(rows)
        return
    for row in rows:
        mark = "  <- current" if row["current"] else ""
        typer.echo(f"{row['revision']}  {row['message']}{mark}")


def _default_db_exists() -> bool:
    """Whether a database is named ($STATEBOOK_DB) or the default file exists: history reads it to mark."""
    import os
    from pathlib import Path

    return bool(os.environ.get("STATEBOOK_DB")) or Path("statebook.db").exists()


@db_app.command("check")
def check_cmd(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Exit 0 only when the database is at head, its lifecycle DDL matches the registry and Alembic finds
    no drift from the expected schema; else exit 1 listing what differs and the command to run."""
    from statebook.adapters.migrations import check

    report = run(_on_connection(check, cli_registry()))
    command = _command()
    if as_json:
        emit_json({"ok": not report.drift, "current": report.before, "head": report.after, "drift": report.drift,
                   "run": None if not report.drift else command})
    elif not report.drift:
        typer.echo(f"ok: at {report.after}, the schema matches the registry")
    else:
        for line in report.drift:
            typer.echo(f"differs: {line}")
        typer.echo(f"run: {command}")
    if report.drift:
        raise typer.Exit(1)
