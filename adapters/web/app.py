"""The console's ASGI app: routes of every part, static files, error pages, sessions and security headers."""

from __future__ import annotations

import contextlib
import importlib
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from statebook.adapters.errors import ConfigError
from statebook.lifecycle import Book

from . import auth
from .errors import http_error
from .state import Console

STATIC = Path(__file__).resolve().parent / "static"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]
INTERNAL = (b"<!doctype html><title>Internal error</title><h1>Internal error</h1>"
            b"<p>The server failed to answer this request; its log has the details.</p>")
PARTS = ("overview", "live", "browse", "graph", "audit_view", "actions", "respond", "providers")
"""The modules under this package that contribute ``routes`` (each part of the console is one module)."""


class Framing:
    """Adds the security headers to every response and the session cookie :func:`auth.store` asked for."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def framed(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() not in {k for k, _ in HEADERS}]
                headers += HEADERS
                cookie = state.get("statebook_set_cookie")
                if cookie:
                    headers.append((b"set-cookie", cookie.encode()))
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await framed(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            if not started:  # the page names no internals; the traceback goes to the server's log
                await tracked({"type": "http.response.start", "status": 500,
                               "headers": [(b"content-type", b"text/html; charset=utf-8")]})
                await tracked({"type": "http.response.body", "body": INTERNAL})
            raise


async def healthz(request: Request) -> Response:
    """``ok``: the process serves (for a load balancer; reads nothing)."""
    return PlainTextResponse("ok")


def session_key(settings: Any) -> bytes:
    """The key that signs sessions: ``[web] session_key``, else random for this process."""
    ref = settings.web.session_key
    if ref is None:
        return secrets.token_bytes(32)
    from statebook.adapters.channels.secrets import SecretError

    try:
        key: bytes = ref.reveal().encode()
        return key
    except SecretError as exc:
        raise ConfigError(f"[web] session_key: {exc}") from None


def part_modules(parts: Sequence[str] = PARTS) -> list[ModuleType]:
    """The part modules that exist, in :data:`PARTS` order."""
    found = []
    for name in parts:
        try:
            found.append(importlib.import_module(f"{__package__}.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{name}":
                continue  # a part not written yet (while the console is being built)
            raise
    return found


def lifespan(c: Console, modules: Sequence[ModuleType]) -> Any:
    """Each part's optional ``startup(console)`` / ``shutdown(console)`` around the app's life."""

    @contextlib.asynccontextmanager
    async def span(app: Starlette) -> AsyncIterator[None]:
        started = []
        try:
            for module in modules:
                if hasattr(module, "startup"):
                    await module.startup(c)
                started.append(module)
            yield
        finally:
            for module in reversed(started):
                if hasattr(module, "shutdown"):
                    await module.shutdown(c)

    return span


def create_app(book: Book, settings: Any = None, *, debug: bool = False) -> Starlette:
    """The console over ``book`` with ``settings`` (a :class:`~statebook.adapters.settings.Settings`;
    default: all defaults, i.e. local mode on loopback with no responders' links)."""
    from statebook.adapters.settings import Settings

    settings = settings if settings is not None else Settings()
    c = Console(book=book, settings=settings, session_key=session_key(settings))
    if settings.web.public_url is not None:
        try:
            from .links import LinkSigner

            c.links = LinkSigner.from_settings(settings.web, book.clock)
        except ModuleNotFoundError:
            pass
    modules = part_modules()
    routes: list[BaseRoute] = [
        Route("/healthz", healthz, name="healthz"),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        *auth.routes,
        *(route for module in modules for route in module.routes),
    ]
    app = Starlette(debug=debug, routes=routes, middleware=[Middleware(Framing)], lifespan=lifespan(c, modules),
                    exception_handlers={HTTPException: http_error})
    app.state.console = c
    return app
