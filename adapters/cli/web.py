"""``statebook web``: serve the console (docs/console.md); ``statebook web hash-password``: a password hash for
``[web.users]``."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import typer

from .app import app, cli_registry, ctx_state, fail, run, settings_file

web_app = typer.Typer(help="Serve the web console and the responders' pages (the web extra).",
                      invoke_without_command=True, no_args_is_help=False)
app.add_typer(web_app, name="web")


@web_app.callback()
def web_cmd(
    ctx: typer.Context,
    config: str = typer.Option(None, "--config", "-c", help="Settings file (TOML; default: the global --config, else ./statebook.toml)."),
    host: str = typer.Option(None, "--host", help="Address to listen on (default [web] host, 127.0.0.1)."),
    port: int = typer.Option(None, "--port", help="Port to listen on (default [web] port, 8780; 0: any free one)."),
) -> None:
    """Serve the console until SIGINT/SIGTERM."""
    if ctx.invoked_subcommand is not None:
        return
    from statebook.adapters.settings import load_settings

    settings = load_settings(settings_file(config), db=ctx_state.db_url, app=ctx_state.app)
    host = host or settings.web.host
    port = settings.web.port if port is None else port
    if not 0 <= port <= 65535:
        raise fail(f"--port {port} is not a port; use 0 (any free one) to 65535")
    run(_serve(settings, host, port))


async def open_console_book(settings: Any) -> Any:
    """The book the console serves: the settings' database and registry, with their bounds and chain key
    (its actions write facts, which a keyed chain must carry keyed)."""
    from statebook.adapters.db import open_book

    return await open_book(settings.db, registry=cli_registry(settings.app), limits=settings.book_limits(),
                           chain_key=settings.audit.key(), app=settings.app or "", must_exist=False)


async def _serve(settings: Any, host: str, port: int) -> None:
    from statebook.adapters.web.serve import check_bind, serving

    check_bind(host, settings)
    book = await open_console_book(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with serving(book, settings, host, port) as url:
            mode = "sign-in required" if settings.web.sign_in else "local mode: no sign-in, this machine only"
            typer.echo(f"statebook console on {url}/ ({mode}); Ctrl-C stops it")
            await stop.wait()
    finally:
        await book.engine.dispose()


@web_app.command("hash-password")
def hash_password_cmd() -> None:
    """Read a password (prompted twice, or one line on stdin) and print its argon2 hash for [web.users]."""
    from statebook.adapters.extras import require

    require("argon2", extra="web", feature="statebook web hash-password")
    from statebook.adapters.web.auth import hash_password

    if sys.stdin.isatty():
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise fail("an empty password cannot sign anyone in")
    typer.echo(hash_password(password))
