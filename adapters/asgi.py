"""FastAPI and Starlette: statebook inside the application's own process (docs/how-to/fastapi.md).

:func:`lifespan` is an application's ``lifespan=``: it opens the book when the application starts and, when
asked, runs statebook's daemon beside the handlers (:class:`~statebook.adapters.daemon.Daemon`, the one
``statebook run`` runs: dispatch delivery, and the scheduler under the same leadership); on shutdown it stops
and awaits every task, releases the scheduler lease and disposes of the engine. A handler gets the book with
:func:`book_of`, or a transaction with :func:`transaction_of`: committed when the handler returns, rolled back
when it raises. With FastAPI, ``BookDep`` and ``TransactionDep`` are the two ready to annotate a parameter::

    app = FastAPI(lifespan=lifespan(db="sqlite:///./app.db", registry=registry, delivery=True))

    @app.post("/tickets")
    async def file_ticket(tx: TransactionDep) -> dict[str, str]:
        ...

:func:`embedded` is the same without a framework: an ``async with`` block for any asyncio application.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from statebook.lifecycle import Book, Registry
from statebook.outbox import Transport

from .daemon import Daemon, resolve_settings
from .db import open_book
from .errors import ConfigError
from .extras import require
from .registry import require_builtins, resolve_registry
from .settings import Settings, load_settings

require("starlette", extra="web", feature="statebook.adapters.asgi (FastAPI and Starlette)")
from starlette.requests import HTTPConnection  # noqa: E402  (FastAPI finds the request by this annotation)
from starlette.routing import Mount  # noqa: E402

__all__ = ["STATE_KEY", "BookDep", "TransactionDep", "book_of", "embedded", "lifespan", "transaction_of"]

STATE_KEY = "statebook"
"""The name the book has in the lifespan state (``request.state.statebook``) and on ``app.state``."""

Lifespan: TypeAlias = Callable[[Any], contextlib.AbstractAsyncContextManager[dict[str, Any]]]


def _settings(settings: Settings | None, config: str | Path | None, db: str | None) -> Settings:
    if settings is None:
        settings = load_settings(config)  # the file, then STATEBOOK_* environment variables
    if db is not None:
        settings = settings.model_copy(update={"db": db})
    return resolve_settings(settings, str(config) if config is not None else None)


@contextlib.asynccontextmanager
async def embedded(settings: Settings | None = None, *, config: str | Path | None = None, db: str | None = None,
                   registry: Registry | None = None, delivery: bool = False, scheduler: bool = False,
                   transports: Mapping[str, Transport] | None = None) -> AsyncIterator[Book]:
    """The book, open for the block, with statebook's daemon running in this process when asked.

    Settings come from ``settings``, else from ``config`` (a TOML file) and ``STATEBOOK_*`` variables; ``db``
    overrides their database. The book runs ``registry``, else the one the settings' ``app`` names, else the
    built-in one. ``delivery`` runs the dispatch worker (and notification delivery when channels are
    configured), any number of processes may; ``transports`` (route prefix -> transport, e.g. a
    ``CallableTransport``) go before the argv transport. ``scheduler`` runs the scheduler engine under the
    leadership ``statebook run`` takes (one leader per database; on SQLite, one process per database file).

    On exit every task is stopped and awaited, the lease released and the engine disposed of. A worker's task
    that ended with an error was logged when it did; its error is raised here too, so a shutdown says so.
    """
    settings = _settings(settings, config, db)
    registry = resolve_registry(settings.app) if registry is None else registry
    running = delivery or scheduler
    if running:
        require_builtins(registry, "the in-process daemon")
    # As `statebook run` does: a transaction idle longer than the lease is a frozen process's, ended by the server.
    book = await open_book(settings.db, registry=registry, limits=settings.book_limits(),
                           chain_key=settings.audit.key(), app=settings.app or "",
                           idle_transaction_seconds=settings.scheduler.lease_seconds if scheduler else None)
    daemon = Daemon(book, settings, scheduler=scheduler, delivery=delivery, transports=transports) if running else None
    started = False
    try:
        if daemon is not None:
            await daemon.prepare()
            started = True
            await daemon.start()
        yield book
    finally:
        try:
            if daemon is not None:
                try:
                    if started:
                        await daemon.stop()
                finally:
                    await daemon.close()
        finally:
            await book.engine.dispose()
    if daemon is not None and daemon.failure is not None:
        raise daemon.failure


def lifespan(settings: Settings | None = None, *, config: str | Path | None = None, db: str | None = None,
             registry: Registry | None = None, delivery: bool = False, scheduler: bool = False,
             transports: Mapping[str, Transport] | None = None, console: str | None = None) -> Lifespan:
    """A FastAPI or Starlette ``lifespan=`` running :func:`embedded` (same arguments) for the application's life.

    The book is in the lifespan state (``request.state.statebook``) and on ``app.state.statebook``.
    ``console="/ops"`` also mounts statebook's web console there (the ``web`` extra; docs/console.md) and runs
    its live-update hub. To add your own startup, enter this in yours:
    ``async with statebook_lifespan(app) as state: yield state``.
    """

    @contextlib.asynccontextmanager
    async def run(app: Any) -> AsyncIterator[dict[str, Any]]:
        resolved = _settings(settings, config, db)
        async with embedded(resolved, config=config, registry=registry, delivery=delivery, scheduler=scheduler,
                            transports=transports) as book:
            setattr(app.state, STATE_KEY, book)
            try:
                async with contextlib.AsyncExitStack() as stack:
                    if console is not None:
                        await stack.enter_async_context(_console(app, book, resolved, console))
                    yield {STATE_KEY: book}
            finally:
                delattr(app.state, STATE_KEY)

    return run


@contextlib.asynccontextmanager
async def _console(app: Any, book: Book, settings: Settings, path: str) -> AsyncIterator[None]:
    from .web import create_app

    console = create_app(book, settings)
    mount = Mount(path, app=console)
    app.router.routes.append(mount)
    try:
        async with console.router.lifespan_context(console):  # the console's live-update hub
            yield
    finally:
        app.router.routes.remove(mount)  # a lifespan run again (tests) mounts it once


def book_of(request: HTTPConnection) -> Book:
    """The book :func:`lifespan` opened, for a handler (FastAPI: ``Depends(book_of)``, or ``BookDep``); each
    operation given it runs in a transaction of its own."""
    book = getattr(request.state, STATE_KEY, None) or getattr(request.app.state, STATE_KEY, None)
    if not isinstance(book, Book):
        raise ConfigError("no statebook book on this application: give it "
                          "lifespan=statebook.adapters.asgi.lifespan(...), and run its lifespan (a test client too)")
    return book


async def transaction_of(request: HTTPConnection) -> AsyncIterator[Book]:
    """The book bound to one transaction for a handler: committed when the handler returns, rolled back when it
    raises. With FastAPI declare it as ``Depends(transaction_of, scope="function")`` (or use ``TransactionDep``):
    the commit then happens before the response is sent, so a failed commit is an error response, never a
    success whose writes are lost."""
    async with book_of(request).begin() as tx:
        yield tx


if TYPE_CHECKING:
    BookDep: TypeAlias = Book
    """``Annotated[Book, Depends(book_of)]``"""
    TransactionDep: TypeAlias = Book
    """``Annotated[Book, Depends(transaction_of, scope="function")]``"""


def __getattr__(name: str) -> Any:
    # FastAPI's aliases are made on first use: a Starlette application needs no FastAPI installed.
    if name not in ("BookDep", "TransactionDep"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from typing import Annotated

    from fastapi import Depends

    alias = (Annotated[Book, Depends(book_of)] if name == "BookDep"
             else Annotated[Book, Depends(transaction_of, scope="function")])
    globals()[name] = alias
    return alias
