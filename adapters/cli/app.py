"""The ``statebook`` command: one Typer app; each part's commands live in their own module.

The root is lazy: ``COMMANDS`` names every top-level command, the module that defines it and its one-line
help, so ``statebook --help`` (and ``--version``) import no command module, no SQLAlchemy, no pydantic. A
command's module is imported when the command runs (``LazyGroup.get_command``).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import traceback
from datetime import datetime, timezone
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from typer.core import TyperGroup

from ..masking import mask
from .funnel import classify
from .options import APP_HELP, CONFIG_HELP, DB_HELP, take_global_options
from .options import ctx_state as ctx_state, settings_file as settings_file  # the commands' modules import them from here

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from statebook.lifecycle import Book, Registry
    from statebook.lifecycle.inputs import Limits

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module under statebook.adapters.cli, the short help `statebook --help` shows). A new command
    # module adds one line here; tests/adapters/test_cli_shape.py checks the help against the command's own.
    "history": ("lifecycle", "Every fact of one entity, oldest first; exit 1 (after printing them) when they do not chain."),
    "replay": ("lifecycle", "Fold an entity's facts into its state (now, or as it was at --as-of) and print it as JSON."),
    "verify": ("lifecycle", "Check every row against its facts and every fact against its chain and policy; exit 1 on a finding."),
    "demo": ("lifecycle", "Walk a small example lifecycle through statebook on an embedded SQLite database."),
    "run": ("schedule", "Run the scheduler daemon: fire schedules, deliver their dispatches, until SIGINT/SIGTERM."),
    "export": ("audit", "Write an audit bundle: the facts as JSON Lines, their checkpoint and a manifest (counts, chain heads, file digests), signed with --sign."),
    "check": ("check", "Check an application's registry (and, with --db, its history's policies); exit 1 on a finding."),
    "lifecycle": ("lifecycle", "Inspect the declared lifecycles (works without a database)."),
    "dispatch": ("dispatch", "The dispatch outbox: inspect, ack, retry, expedite, purge, deliver."),
    "notify": ("notify", "Notifications: list them, show one with its channel attempts, recover failures, answer them, apply retention."),
    "schedule": ("schedule", "Create, inspect, pause and fire schedules."),
    "runs": ("schedule", "Inspect or cancel one run of a schedule."),
    "channels": ("channels", "Notification channels: list the configured ones, test one with a real send."),
    "checkpoint": ("audit", "Checkpoints of every entity's chain head (and the key that signs them)."),
    "audit": ("audit", "Check an audit bundle offline: no database, no settings, only the bundle."),
    "db": ("db", "The database schema: upgrade it, show its revision and history, check it."),
    "web": ("web", "Serve the web console and the responders' pages (the web extra)."),
    "stats": ("stats", "Print entities by status, the due backlogs, deliveries, attempt latency, scheduler decisions and runs."),
}


class FunnelGroup(TyperGroup):
    """The root command: every error a command raises becomes one line and an exit code (funnel.py).

    Usage errors too (a bad option, a value typer cannot convert, an unknown command): one line
    naming the help to read, instead of typer's box, exit 2."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        """Parse the command line; a usage error becomes one line."""
        try:
            return super().make_context(*args, **kwargs)
        except typer.TyperException as exc:
            raise _usage(exc) from None

    def invoke(self, ctx: Any) -> Any:
        """Run the command; whatever it raises becomes one line and an exit code."""
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
        shown: BaseException = exc
        return shown
    context = getattr(exc, "ctx", None)
    where = f" (see '{context.command_path} --help')" if context is not None else ""
    return fail(f"{exc.format_message()}{where}", getattr(exc, "exit_code", 2) or 2)


class LazyGroup(FunnelGroup):
    """The root group: lists commands from ``COMMANDS`` and imports a command's module only when the
    command is looked up to run (or to show its own help). Commands registered on ``app`` some other way
    (a module imported already) are found as before."""

    def list_commands(self, ctx: Any) -> list[str]:
        """Every command: the table's, in its order, then any registered outside it."""
        return list(COMMANDS) + [name for name in super().list_commands(ctx) if name not in COMMANDS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command, importing the module that defines it first (once)."""
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in COMMANDS:
            importlib.import_module(f"{__package__}.{COMMANDS[cmd_name][0]}")
            found = typer.main.get_group(app).commands.get(cmd_name)  # what the module registered on ``app``
            if found is not None:
                self.add_command(found, cmd_name)
        if found is not None:
            ctx_state.command_path = f"{ctx.command_path} {cmd_name}"
            take_global_options(found, ctx)  # typer builds the commands afresh for each run: each gets them
        return found

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The commands section of ``statebook --help``, from the table: no command module is imported."""
        rows = [(name, help_) for name, (_module, help_) in COMMANDS.items()]
        rows += [(name, cmd.get_short_help_str(formatter.width)) for name, cmd in self.commands.items()
                 if name not in COMMANDS and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=LazyGroup,
    rich_markup_mode=None,  # the root's help is plain click (rich's help renderer alone costs ~150 ms)
    name="statebook",
    help="Durable operational state: lifecycles, the dispatch outbox and the scheduler.\n\n"
         "--db, --app and --config go before or after the command (statebook --db URL dispatch ls, or "
         "statebook dispatch ls --db URL); given in both places with different values, they are an error. "
         "Without --config (or $STATEBOOK_CONFIG), a command that reads settings reads ./statebook.toml when "
         "there is one and says so on standard error (a terminal).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def __getattr__(name: str) -> Any:
    """``console`` and ``err_console`` are made on first use: rich is not imported for ``--help``."""
    if name in ("console", "err_console"):
        from rich.console import Console

        stderr = name == "err_console"
        stream = sys.stderr if stderr else sys.stdout
        # Off a terminal (a pipe, a file, typer's runner) nothing wraps: rich would otherwise assume 80
        # columns (or $COLUMNS) and split sentences, ids and table cells (C12).
        wide = {} if _is_tty(stream) else {"width": OFF_TERMINAL_WIDTH, "soft_wrap": True}
        made = Console(stderr=stderr, **wide)  # type: ignore[arg-type]
        globals()[name] = made
        return made
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


T = TypeVar("T")

OFF_TERMINAL_WIDTH = 100_000
"""The width the consoles take off a terminal: wider than any line statebook prints, so none wraps."""


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"statebook {version('statebook')}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="Print statebook's version and exit."),
    db: str = typer.Option(None, "--db", envvar="STATEBOOK_DB", metavar="URL", help=DB_HELP),
    app_: str = typer.Option(None, "--app", "-a", envvar="STATEBOOK_APP", metavar="MODULE:ATTR", help=APP_HELP),
    config: str = typer.Option(None, "--config", envvar="STATEBOOK_CONFIG", metavar="FILE", help=CONFIG_HELP),
    debug: bool = typer.Option(False, "--debug", envvar="STATEBOOK_DEBUG",
                               help="On an error, print the traceback too (for a bug report)."),
) -> None:
    ctx_state.db_url = db
    ctx_state.app = app_
    ctx_state.config = None if config is None else Path(config)
    ctx_state.debug = debug
    ctx_state._registry = None
    ctx_state.given = {}
    ctx_state.parsed = {}
    ctx_state.default_named = False
    for option, name, value in (("--db", "db", db), ("--app", "app_", app_), ("--config", "config", config)):
        source = ctx.get_parameter_source(name)
        if value is not None and getattr(source, "name", "") == "COMMANDLINE":
            ctx_state.given[option] = (str(value), ctx.command_path)


def debug_enabled() -> bool:
    """``--debug`` or ``STATEBOOK_DEBUG`` (read again here: an error may come before the option was seen)."""
    return ctx_state.debug or os.environ.get("STATEBOOK_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def cli_registry(app_spec: str | None = None) -> Registry:
    """The registry the command works on: ``--app`` (or ``$STATEBOOK_APP``, or ``app_spec`` from the
    settings), else the built-in one. A bad value is a one-line error. Loaded once per command."""
    from statebook.adapters.registry import resolve_registry
    from statebook.lifecycle import StatebookError

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
    from rich.markup import escape

    line = " ".join(mask(str(message)).split())
    _console("err_console").print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _console(name: str) -> Console:
    found: Console = getattr(sys.modules[__name__], name)
    return found


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; its errors reach the funnel (``FunnelGroup``) like any command's."""
    import asyncio

    return asyncio.run(coro)


async def open_cli_book(*, must_exist: bool = True, create: bool = False, limits: Limits | None = None,
                        writes: bool | None = None) -> Book:
    """The book the CLI works on. An operator command on a missing SQLite file is an error.

    A command that ``writes`` (default: ``create``) opens it with the chain key the settings name
    (:func:`settings_file`, the environment): a keyed database refuses a writer without it before anything is
    written (``open_book``), and the facts it writes carry the keyed hash."""
    from statebook.adapters.db import open_book

    writes = create if writes is None else writes
    key = None
    if writes:
        from statebook.adapters.settings import load_settings

        key = load_settings(settings_file()).audit.key()
    return await open_book(ctx_state.db_url, registry=cli_registry(), must_exist=must_exist, create=create,
                           limits=limits, app=cli_app_spec(), chain_key=key, writes=writes)


def cli_app_spec() -> str:
    """The ``--app`` the command runs with ('' for the built-in registry), for the upgrade command it names."""
    return ctx_state.app or os.environ.get("STATEBOOK_APP") or ""


def with_book(
    fn: Callable[..., Awaitable[T]], *, must_exist: bool = True, create: bool = False, limits: Limits | None = None,
    writes: bool | None = None,
) -> Callable[..., Coroutine[Any, Any, T]]:
    """Wrap ``async fn(book, ...)`` so the book is opened (with ``limits``, default the built-in ones)
    and disposed around it. A command that appends facts says ``writes=True`` (see :func:`open_cli_book`);
    one that does not and writes anyway is refused on a keyed database."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        book = await open_cli_book(must_exist=must_exist, create=create, limits=limits, writes=writes)
        try:
            return await fn(book, *args, **kwargs)
        finally:
            await book.engine.dispose()

    return wrapper


def parse_time(text: str, option: str) -> float:
    """POSIX seconds or an ISO-8601 time (UTC unless it names a zone), from 1970 to 9999 as the API
    takes it (``inputs.timestamp``: no NaN, no infinity); anything else is InvalidArgument naming ``option``."""
    from statebook.lifecycle.errors import InvalidArgument
    from statebook.lifecycle.inputs import shown, timestamp

    try:
        seconds = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise fail(f"{option} {shown(text)} is neither POSIX seconds nor an ISO-8601 time "
                       "(e.g. 2026-05-01T09:00:00Z)") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        try:
            seconds = parsed.timestamp()
        except (OverflowError, ValueError, OSError):
            seconds = -1.0  # outside what a timestamp holds: refused below
    try:
        return timestamp(option, seconds)
    except InvalidArgument as exc:  # name what was typed, not the float it became ("1e400" is inf)
        raise InvalidArgument(f"{option}: {shown(text.strip())} is not a time from 1970 to 9999 "
                              f"({str(exc).split(': ', 1)[1]})", argument=option, rule=exc.rule) from None


def format_time(ts: float | datetime | None) -> str:
    """``2026-05-01 09:00:00Z`` (UTC), or ``-`` for no time; POSIX seconds or a model's aware datetime."""
    if ts is None:
        return "-"
    when = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, tz=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


YES_HELP = "Do it without asking (needed when standard input is not a terminal)."
SHOWN_IDS = 10
"""A confirmation names at most this many of the rows it will change, then how many more."""


def stdin_is_terminal() -> bool:
    """Whether there is a terminal to ask a question on (tests replace this)."""
    return sys.stdin.isatty()


def require_consent(command: str, yes: bool) -> None:
    """Before a bulk change, before anything is read or written: without ``--yes`` and with no terminal to
    ask on, refuse (one line, exit 2)."""
    if not yes and not stdin_is_terminal():
        raise fail(f"{command} changes many rows and asks first, but standard input is not a terminal: add --yes "
                   "to go ahead (--dry-run shows what it would do)")


def confirm(what: str, ids: list[str] | None = None, *, yes: bool) -> None:
    """Say what a bulk command is about to do (``what``; the first ``SHOWN_IDS`` of ``ids``) on standard
    error and ask; unless ``yes``. Any answer but yes changes nothing: one line, exit 1."""
    if yes:
        return
    err = _console("err_console")
    err.print(what, highlight=False, soft_wrap=True, markup=False)
    for shown in (ids or [])[:SHOWN_IDS]:
        err.print(f"  {shown}", highlight=False, soft_wrap=True, markup=False)
    if ids and len(ids) > SHOWN_IDS:
        err.print(f"  ... and {len(ids) - SHOWN_IDS} more", highlight=False)
    if not typer.confirm("Go ahead?", default=False, err=True):
        raise fail("nothing was changed", 1)


def print_table(table: Table, *, whole: bool = False) -> None:
    """Print a table on standard output. On a terminal it fits the terminal (long cells wrap) unless
    ``whole``; anywhere else (a pipe, a file) it is as wide as its widest row, so no row wraps and no id
    is cut: scripts read them."""
    out = _console("console")
    if out.is_terminal and not whole:
        out.print(table)
        return
    from rich.console import Console
    from rich.measure import Measurement

    natural = Measurement.get(out, out.options.update(width=1_000_000), table).maximum
    if natural <= out.width:
        out.print(table)
        return
    Console(width=natural, force_terminal=out.is_terminal, no_color=out.no_color, highlight=False).print(table)


def emit_json(value: Any) -> None:
    """``value`` as indented JSON on standard output (a listing's ``--json``)."""
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False))
