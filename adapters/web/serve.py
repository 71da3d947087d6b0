"""Serving the console: on its own (``statebook web``) or as a task of the daemon (``statebook run --web-port``).

It binds to 127.0.0.1 unless told otherwise, and refuses a non-loopback address while no sign-in is
configured (anyone who could reach it would act as operator).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from statebook.adapters.errors import ConfigError
from statebook.lifecycle import Book

from .auth import is_loopback

log = logging.getLogger("statebook.web")


def check_bind(host: str, settings: Any) -> None:
    """A :class:`ConfigError` when ``host`` is not a loopback address and nobody can sign in."""
    if not is_loopback(host) and not settings.web.sign_in:
        raise ConfigError(f"the console would listen on {host}, which is not a loopback address, and no sign-in is "
                          "configured: add [web.users] (statebook web hash-password) or [web.proxy], or listen on "
                          "127.0.0.1")


def server(book: Book, settings: Any, host: str, port: int) -> Any:
    """A uvicorn server for the console (not started)."""
    import uvicorn

    from . import create_app

    check_bind(host, settings)
    config = uvicorn.Config(create_app(book, settings), host=host, port=port, log_level="warning",
                            access_log=False, lifespan="on", proxy_headers=False, server_header=False)
    srv = uvicorn.Server(config)
    srv.install_signal_handlers = lambda: None  # type: ignore[attr-defined]  # the caller owns the signals
    return srv


def address(srv: Any) -> str:
    """``http://host:port`` of a started server (the real port when 0 was asked for)."""
    sock = srv.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    return f"http://{host if ':' not in host else f'[{host}]'}:{port}"


@contextlib.asynccontextmanager
async def serving(book: Book, settings: Any, host: str, port: int) -> AsyncIterator[str]:
    """The console served in a task while the block runs; yields its address."""
    srv = server(book, settings, host, port)
    task = asyncio.create_task(srv.serve(), name="statebook-web")
    while not srv.started:
        if task.done():
            task.result()  # the bind failed: its error, now
            raise ConfigError(f"the console could not listen on {host}:{port}")
        await asyncio.sleep(0.02)
    url = address(srv)
    log.info("web console on %s", url, extra={"event": "web_started", "url": url})
    try:
        yield url
    finally:
        console = getattr(srv.config.app.state, "console", None)
        if console is not None and console.live is not None:
            await console.live.close()  # live streams end first: uvicorn waits for every open connection
        srv.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
