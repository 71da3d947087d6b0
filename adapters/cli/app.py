"""The ``statebook`` command: one Typer app; each part's commands live in their own module."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from datetime import datetime, timezone
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import typer
from rich.console import Console

from statebook.lifecycle import Book, Registry, StatebookError
from statebook.lifecycle.errors import UnknownEntityType

app = typer.Typer(
    name="statebook",
    help="Durable operational state: lifecycles, the dispatch outbox and the scheduler.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

T = TypeVar("T")

DB_HELP = "Database URL (sqlite:///PATH or postgresql://...); default $STATEBOOK_DB or sqlite:///./statebook.db"
APP_HELP = (
    "The application's registry as module:attr (a Registry, or a callable returning one), e.g. "
    "myapp.lifecycles:registry; default $STATEBOOK_APP, then the settings' app key, then the built-in lifecycles"
)


class Context:
    db_url: str | None = None
    app: str | None = None
    _registry: Registry | None = None


ctx_state = Context()


@app.callback()
def _root(
    db: str = typer.Option(None, "--db", envvar="STATEBOOK_DB", help=DB_HELP),
    app_: str = typer.Option(None, "--app", "-a", envvar="STATEBOOK_APP", metavar="MODULE:ATTR", help=APP_HELP),
) -> None:
    ctx_state.db_url = db
    ctx_state.app = app_
    ctx_state._registry = None


def cli_registry(app_spec: str | None = None) -> Registry:
    """The registry the command works on: ``--app`` (or ``$STATEBOOK_APP``, or ``app_spec`` from the
    settings), else the built-in one. A bad value is a one-line error. Loaded once per command."""
    from statebook.adapters.registry import resolve_registry

    if ctx_state._registry is None:
        spec = ctx_state.app or app_spec
        if spec and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` would: the app module beside the caller imports
        try:
            ctx_state._registry = resolve_registry(spec)
        except StatebookError as exc:
            raise fail(str(exc)) from None
    return ctx_state._registry


def app_hint() -> str:
    """Appended to an unknown-type error when no application registry was named."""
    return "" if ctx_state.app else "; an application's own types need --app module:attr (or STATEBOOK_APP)"


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a one-line error and return the exit to raise."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine, turning statebook and database errors into a one-line message."""
    import sqlalchemy.exc

    try:
        return asyncio.run(coro)
    except UnknownEntityType as exc:
        raise fail(str(exc) + app_hint()) from None
    except StatebookError as exc:
        raise fail(str(exc)) from None
    except LookupError as exc:
        raise fail(str(exc.args[0] if exc.args else exc)) from None
    except (sqlalchemy.exc.DBAPIError, OSError) as exc:
        detail = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise fail(f"database error: {detail}") from None


async def open_cli_book(*, must_exist: bool = True, create: bool = False) -> Book:
    """The book the CLI works on. An operator command on a missing SQLite file is an error."""
    from statebook.adapters.db import open_book

    return await open_book(ctx_state.db_url, registry=cli_registry(), must_exist=must_exist, create=create)


def with_book(
    fn: Callable[..., Awaitable[T]], *, must_exist: bool = True, create: bool = False
) -> Callable[..., Coroutine[Any, Any, T]]:
    """Wrap ``async fn(book, ...)`` so the book is opened and disposed around it."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        book = await open_cli_book(must_exist=must_exist, create=create)
        try:
            return await fn(book, *args, **kwargs)
        finally:
            await book.engine.dispose()

    return wrapper


def parse_time(text: str, option: str) -> float:
    """POSIX seconds or an ISO-8601 time (UTC unless it names a zone); a bad value fails in one line."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise fail(f"{option} {text!r} is neither POSIX seconds nor an ISO-8601 time (e.g. 2026-05-01T09:00:00Z)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def format_time(ts: float | None) -> str:
    """``2026-05-01 09:00:00Z`` (UTC), or ``-`` for no time."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def emit_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False))
