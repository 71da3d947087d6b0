"""The ``statebook`` command: one Typer app; each part's commands live in their own module."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import traceback
from datetime import datetime, timezone
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from statebook.lifecycle import Book, Registry, StatebookError
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.inputs import Limits, timestamp

from .funnel import classify, mask

class FunnelGroup(TyperGroup):
    """The root command: every error a command raises becomes one line and an exit code (funnel.py).

    Usage errors too (a bad option, a value typer cannot convert, an unknown command): one line
    naming the help to read, instead of typer's box, exit 2."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except typer.TyperException as exc:
            raise _usage(exc) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise  # our own exits
        except typer.TyperException as exc:
            raise _usage(exc) from None
        except BaseException as exc:  # noqa: BLE001 - the one place every error is turned into a line
            if isinstance(exc, SystemExit):
                raise
            code, line = classify(exc, hint=app_hint())
            if debug_enabled():
                traceback.print_exception(exc, file=sys.stderr)
            raise fail(line, code) from None


def _usage(exc: Any) -> BaseException:
    """typer's usage error as one line; help shown for a command given no arguments stays as it is."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # not an error: typer shows the help it carries
        return exc
    context = getattr(exc, "ctx", None)
    where = f" (see '{context.command_path} --help')" if context is not None else ""
    return fail(f"{exc.format_message()}{where}", getattr(exc, "exit_code", 2) or 2)


app = typer.Typer(
    cls=FunnelGroup,
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
    debug: bool = False
    _registry: Registry | None = None


ctx_state = Context()


@app.callback()
def _root(
    db: str = typer.Option(None, "--db", envvar="STATEBOOK_DB", help=DB_HELP),
    app_: str = typer.Option(None, "--app", "-a", envvar="STATEBOOK_APP", metavar="MODULE:ATTR", help=APP_HELP),
    debug: bool = typer.Option(False, "--debug", envvar="STATEBOOK_DEBUG",
                               help="On an error, print the traceback too (for a bug report)."),
) -> None:
    ctx_state.db_url = db
    ctx_state.app = app_
    ctx_state.debug = debug
    ctx_state._registry = None


def debug_enabled() -> bool:
    """``--debug`` or ``STATEBOOK_DEBUG`` (read again here: an error may come before the option was seen)."""
    return ctx_state.debug or os.environ.get("STATEBOOK_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


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
    """Print a one-line error (secrets masked) and return the exit to raise."""
    line = " ".join(mask(str(message)).split())
    err_console.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; its errors reach the funnel (``FunnelGroup``) like any command's."""
    return asyncio.run(coro)


async def open_cli_book(*, must_exist: bool = True, create: bool = False, limits: Limits | None = None) -> Book:
    """The book the CLI works on. An operator command on a missing SQLite file is an error."""
    from statebook.adapters.db import open_book

    return await open_book(ctx_state.db_url, registry=cli_registry(), must_exist=must_exist, create=create,
                           limits=limits, app=cli_app_spec())


def cli_app_spec() -> str:
    """The ``--app`` the command runs with ('' for the built-in registry), for the upgrade command it names."""
    return ctx_state.app or os.environ.get("STATEBOOK_APP") or ""


def with_book(
    fn: Callable[..., Awaitable[T]], *, must_exist: bool = True, create: bool = False, limits: Limits | None = None
) -> Callable[..., Coroutine[Any, Any, T]]:
    """Wrap ``async fn(book, ...)`` so the book is opened (with ``limits``, default the built-in ones)
    and disposed around it."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        book = await open_cli_book(must_exist=must_exist, create=create, limits=limits)
        try:
            return await fn(book, *args, **kwargs)
        finally:
            await book.engine.dispose()

    return wrapper


def parse_time(text: str, option: str) -> float:
    """POSIX seconds or an ISO-8601 time (UTC unless it names a zone), from 1970 to 9999 as the API
    takes it (``inputs.timestamp``: no NaN, no infinity); anything else is InvalidArgument naming ``option``."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise fail(f"{option} {text!r} is neither POSIX seconds nor an ISO-8601 time (e.g. 2026-05-01T09:00:00Z)") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        try:
            seconds = parsed.timestamp()
        except (OverflowError, ValueError, OSError):
            seconds = -1.0  # outside what a timestamp holds: refused below
    try:
        return timestamp(option, seconds)
    except InvalidArgument as exc:  # name what was typed, not the float it became ("1e400" is inf)
        raise InvalidArgument(f"{option}: {text.strip()!r} is not a time from 1970 to 9999 "
                              f"({str(exc).split(': ', 1)[1]})", argument=option, rule=exc.rule) from None


def format_time(ts: float | None) -> str:
    """``2026-05-01 09:00:00Z`` (UTC), or ``-`` for no time."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def emit_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False))
