"""The global options ``--db``, ``--app`` and ``--config`` (specs/cli.md C16): the state they set for the running
command, the parameters that let a command take them after its name, and the settings file a command reads.

Light like the root: typer only (``statebook --help`` imports this module).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from statebook.lifecycle import Registry


DB_HELP = ("Database URL (sqlite:///PATH or postgresql://...); default $STATEBOOK_DB, then the settings' db key, "
           "then sqlite:///./statebook.db")
APP_HELP = (
    "The application's registry as module:attr (a Registry, or a callable returning one), e.g. "
    "myapp.lifecycles:registry; default $STATEBOOK_APP, then the settings' app key, then the built-in lifecycles"
)


CONFIG_HELP = ("Settings file (TOML) for every command: its [audit] chain_key keys the facts writers append; "
               "default $STATEBOOK_CONFIG, else ./statebook.toml when there is one (named on a terminal)")
DEFAULT_SETTINGS = "statebook.toml"
"""The settings file a command reads from the working directory when no --config names one."""


class Context:
    """The root options of the running command (``--db``, ``--app``, ``--config``, ``--debug``) and its registry,
    once loaded. ``db_url`` and ``app`` not given (nor in the environment) are the settings file's ``db`` and
    ``app`` keys, when the command reads one (:func:`settings_file`)."""

    _db_url: str | None = None
    _app: str | None = None
    config: Path | None = None
    debug: bool = False
    _registry: Registry | None = None
    given: dict[str, tuple[str, str]] = {}
    """option -> (its value, the command path it followed) for the global options typed on the command line"""
    command_path: str = "statebook"
    """the command the root looked up to run (``statebook dispatch``)"""
    parsed: dict[Path, dict[str, Any]] = {}
    """settings files read for their db and app keys this command (:func:`_from_settings`)"""
    default_named: bool = False
    """whether the ./statebook.toml line was printed (once per command)"""


    @property
    def db_url(self) -> str | None:
        """``--db`` (or ``$STATEBOOK_DB``), else the settings file's ``db``, else None (the default file)."""
        return self._db_url if self._db_url is not None else _from_settings("db")

    @db_url.setter
    def db_url(self, value: str | None) -> None:
        self._db_url = value

    @property
    def app(self) -> str | None:
        """``--app`` (or ``$STATEBOOK_APP``), else the settings file's ``app``, else None (the built-in registry)."""
        return self._app if self._app is not None else _from_settings("app")

    @app.setter
    def app(self, value: str | None) -> None:
        self._app = value


def _from_settings(key: str) -> str | None:
    """The settings file's top-level ``key`` (``db`` or ``app``), read without validating the rest of the file: a
    read command needs the database, not a channel's secret. A file that is not TOML, or a value that is not
    text, is a one-line error naming the file."""
    from .app import fail

    path = settings_file()
    if path is None or not path.is_file():
        return None  # a missing --config file is the settings' own one-line error, where they are loaded
    parsed = ctx_state.parsed.get(path)
    if parsed is None:  # read once per command: the options are asked for at several places
        import tomllib

        try:
            parsed = ctx_state.parsed[path] = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise fail(f"{path}: cannot read the settings ({exc})") from None
    value = parsed.get(key)
    if value is not None and not isinstance(value, str):
        raise fail(f"{path}: {key} is text (a {'database URL' if key == 'db' else 'module:attr'}), not {value!r}")
    return value


ctx_state = Context()

GLOBAL_OPTIONS = {"--db": ("db_url", DB_HELP), "--app": ("app", APP_HELP), "--config": ("config", CONFIG_HELP)}
"""The root options a command also takes after its name: option -> (the ``Context`` field it sets, its help)."""


def take_global(option: str, value: str, where: str) -> None:
    """Record a global option typed after ``where`` (a command path); a different value typed at another place
    is an error naming both."""
    _refuse_conflict(option, value, where)
    ctx_state.given[option] = (value, where)
    field = GLOBAL_OPTIONS[option][0]
    setattr(ctx_state, field, Path(value) if option == "--config" else value)
    if option == "--app":
        ctx_state._registry = None


def _refuse_conflict(option: str, value: str, where: str) -> None:
    """One line naming both places when ``option`` was typed earlier with another value."""
    from .app import fail

    earlier = ctx_state.given.get(option)
    if earlier is not None and earlier[0] != value:
        raise fail(f"{option} is given twice with different values: {earlier[0]!r} after '{earlier[1]}' and "
                   f"{value!r} after '{where}'; give it once")


def _global_after_command(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> None:
    if value is not None and not ctx.resilient_parsing:
        take_global(param.opts[0], value, ctx.command_path)


AFTER = " (a global option: it may also come before the command)"


@functools.cache
def _global_params() -> dict[str, Any]:
    """The global options as parameters a command can take, made by typer itself (its parameter classes
    differ between versions): option -> parameter."""
    carrier = typer.Typer(add_completion=False)

    @carrier.command()
    def _carry(
        db: str = typer.Option(None, "--db", metavar="URL", expose_value=False, callback=_global_after_command,
                               help=DB_HELP + AFTER),
        app_: str = typer.Option(None, "--app", metavar="MODULE:ATTR", expose_value=False,
                                 callback=_global_after_command, help=APP_HELP + AFTER),
        config: str = typer.Option(None, "--config", metavar="FILE", expose_value=False,
                                   callback=_global_after_command, help=CONFIG_HELP + AFTER),
    ) -> None:
        """Carries the global options."""

    return {param.opts[0]: param for param in typer.main.get_command(carrier).params
            if param.opts[0] in GLOBAL_OPTIONS}


def take_global_options(command: Any, ctx: Any) -> None:
    """Give ``command`` (and, for a group, each command below it) the global options it does not define itself,
    so they may follow the command's name. A command's own ``--db`` (``demo``, ``check``) or ``--config`` keeps its
    meaning; :func:`own_or_global` reconciles it with the global one."""
    taken = {name for param in command.params for name in getattr(param, "opts", ())}
    command.params.extend(param for option, param in _global_params().items() if option not in taken)
    for sub in getattr(command, "commands", {}).values():
        take_global_options(sub, ctx)


def own_or_global(option: str, own: str | Path | None, where: str) -> str | None:
    """A command's own ``option`` (``own``) or else the global one; both typed with different values is an error
    naming both."""
    if own is not None:
        _refuse_conflict(option, str(own), where)
        return str(own)
    value = getattr(ctx_state, GLOBAL_OPTIONS[option][0])
    return None if value is None else str(value)


def settings_file(given: str | Path | None = None) -> Path | None:
    """The settings file a command reads: its own ``--config`` (``given``), else the global ``--config`` (or
    ``$STATEBOOK_CONFIG``), else ``./statebook.toml`` when it exists (named on standard error when that is a
    terminal, once), else none
    (the environment and the defaults only). The command's own and the global one typed differently is an
    error."""
    chosen = own_or_global("--config", given, _command_path())
    if chosen is not None:
        return Path(chosen)
    if not Path(DEFAULT_SETTINGS).is_file():
        return None
    if not ctx_state.default_named and stderr_is_terminal():
        # for the person at the terminal, on standard error (a --json listing on standard output stays JSON); off a
        # terminal an error stays the one line of standard error scripts read (C4)
        ctx_state.default_named = True
        typer.echo(f"statebook: settings read from ./{DEFAULT_SETTINGS} (no --config given)", err=True)
    return Path(DEFAULT_SETTINGS)


def stderr_is_terminal() -> bool:
    """Whether standard error is a terminal, where a person reads notices (tests replace this)."""
    import sys

    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def _command_path() -> str:
    """The running command's path as far as the root looked it up (``statebook dispatch``), for an error naming
    where an option was typed."""
    return ctx_state.command_path