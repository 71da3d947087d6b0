"""statebook from synchronous code (``statebook.sync``): scripts, Flask and Django views, notebooks.

Each function is the async one of the same name — the same arguments, result and errors — run to completion on
statebook's own event loop, in a thread of its own (docs/how-to/sync.md)::

    from statebook import sync

    book = sync.open_book("sqlite:///./app.db", registry=registry)
    sync.create(book, "ticket", entity_id="T-1", values={"title": "disk full"}, status="open",
                reason=Reason("ticket.open.filed"), actor=Actor("user", "ana"))
    print(sync.verify(book).ok)
    sync.close(book)

The rules:

- **One loop thread per process**, started by the first call. At exit, before Python waits for other threads, the
  books still open are closed and the loop stopped. A forked child starts a loop of its own, where the books the
  parent had open get connections of their own. A book opened here belongs to that loop: use it through these
  functions (or :func:`run`) only.
- **Any number of threads** may call at once: each call waits for its own operation, and the operations run
  side by side on the loop, as many at a time as the book's connection pool allows.
- **Errors come out in the calling thread**: the operation's own exception, with its traceback (the loop's
  frames included). A caller interrupted while it waits (Ctrl-C) cancels its operation.
- **Never from inside a running event loop** (an ``async def``, a notebook cell, a callback of the loop): that
  raises :class:`CalledFromEventLoop` at once instead of blocking the loop or deadlocking; await the async API
  there (a notebook cell can ``await``).
- **It cannot join the caller's own database transaction**: each call commits on its own, on the book's
  connections, never on the application's SQLAlchemy session or connection. The async API can
  (``async with book.begin() as tx``, the application's rows through ``tx.conn``): to commit several writes
  together from synchronous code, put them in one ``async def`` and call it with :func:`run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from statebook import lifecycle as _lifecycle
from statebook import outbox as _outbox
from statebook import scheduler as _scheduler
from statebook.lifecycle import Book, StatebookError
from statebook.outbox import notifications as _notifications

from . import db as _db

__all__ = [
    "CalledFromEventLoop", "ack_dispatch", "ack_notification", "apply_many", "as_of", "cancel_run", "close",
    "create", "create_many", "create_schedule", "delete_schedule", "disable_schedule", "dismiss_notification",
    "enable_schedule", "enqueue_dispatch", "enqueue_dispatches", "expedite_dispatch", "get_dispatch",
    "get_notification", "get_run", "get_schedule", "history", "list_dispatches", "list_notifications", "list_runs",
    "list_schedules", "open_book", "purge", "purge_dispatch", "replay", "replay_notification", "resolve_notification",
    "retry_dispatch", "run", "send_notification", "transition", "verify",
]

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("statebook.sync")

CLOSE_SECONDS = 10.0
"""How long the exit waits for the open books to close before it stops the loop anyway."""


class CalledFromEventLoop(StatebookError, RuntimeError):
    """A ``statebook.sync`` function was called in a thread that runs an event loop; await the async API there."""


class _LoopThread:
    """statebook's event loop, running forever in a daemon thread, and the books opened on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.books: dict[int, Book] = {}
        self.thread = threading.Thread(target=self._main, name="statebook-sync", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:  # stopped at exit: what is still running is cancelled and awaited, then the loop closed
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def stop(self) -> None:
        """Close the books still open, stop the loop and wait for its thread."""
        if not self.thread.is_alive():
            return

        async def close_all() -> None:
            for book in list(self.books.values()):
                with contextlib.suppress(Exception):
                    await book.engine.dispose()
            self.books.clear()

        try:
            asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(CLOSE_SECONDS)
        except Exception as exc:  # noqa: BLE001 - exiting: say so, and stop the loop all the same
            log.warning("statebook.sync: closing the open books at exit failed (%s)", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CLOSE_SECONDS)


_lock = threading.Lock()
_current: _LoopThread | None = None
_inherited: list[Book] = []
"""In a forked child: the books the parent had open, to be given fresh connections on the child's loop."""


def _the_loop() -> _LoopThread:
    global _current
    with _lock:
        if _current is None or _current.pid != os.getpid() or not _current.thread.is_alive():
            _current = _LoopThread()
            for book in _inherited:  # the parent's connections are the parent's: drop them unclosed, as the
                # pool's fork recipe says, so the child's first use opens its own
                asyncio.run_coroutine_threadsafe(book.engine.dispose(close=False), _current.loop).result()
                _current.books[id(book.engine)] = book
            _inherited.clear()
        return _current


def _at_exit() -> None:
    current = _current
    if current is not None and current.pid == os.getpid():
        current.stop()


def _after_fork() -> None:
    # The parent's loop thread does not exist in the child, and its lock may have been held mid-fork.
    global _lock, _current
    if _current is not None:
        _inherited[:] = _current.books.values()
        # The parent's loop, copied here, shares the parent's epoll instance: a parent's connection collected in the
        # child would unregister its socket there, and the parent's reads would never wake. Marked closed, the copy
        # touches nothing of the parent's (asyncio and asyncpg both check it before they unregister).
        _current.loop._closed = True  # type: ignore[attr-defined]
    _lock, _current = threading.Lock(), None


# Python waits for non-daemon threads (aiosqlite's, one per open SQLite connection) before it runs atexit
# handlers, so the books must be closed before that wait: threading's own exit hook, as concurrent.futures uses.
_register = getattr(threading, "_register_atexit", None)
if _register is None:  # pragma: no cover - every CPython statebook supports has it
    import atexit

    _register = atexit.register
_register(_at_exit)
os.register_at_fork(after_in_child=_after_fork)


def _call(name: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``make()`` returns on statebook's loop and wait for it in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise CalledFromEventLoop(
            f"statebook.sync.{name} was called from a running event loop, which it would block: await the async "
            f"function there instead (a notebook cell can await), or call it from a thread (asyncio.to_thread)")
    future = asyncio.run_coroutine_threadsafe(make(), _the_loop().loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()  # the caller was interrupted: its operation stops too (a no-op once it ended)
        raise


def _blocking(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking form of the async function ``fn``: the same signature, run by :func:`_call`."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        return _call(fn.__name__, lambda: fn(*args, **kwargs))

    call.__module__ = __name__
    call.__doc__ = (f"The blocking form of the async ``{fn.__name__}`` (see :mod:`statebook.sync`).\n\n"
                    f"{fn.__doc__ or ''}")
    return call


def _kept(fn: Callable[P, Book]) -> Callable[P, Book]:
    """``fn``, keeping the book it opens for the exit to close."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> Book:
        book = fn(*args, **kwargs)
        _the_loop().books[id(book.engine)] = book
        return book

    call.__doc__ = (":func:`statebook.adapters.db.open_book` on statebook's loop (the same arguments); the book is "
                    "closed at exit unless :func:`close` closed it first.")
    return call


open_book = _kept(_blocking(_db.open_book))


def close(book: Book) -> None:
    """Close ``book``'s connections (``await book.engine.dispose()``); the loop thread stays for other books."""
    _call("close", book.engine.dispose)
    _the_loop().books.pop(id(book.engine), None)


def run(fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``await fn(*args, **kwargs)`` on statebook's loop and return its result: several operations in one
    transaction (``async with book.begin() as tx``), or any async code of your own over a book opened here."""
    return _call(getattr(fn, "__name__", "run"), lambda: fn(*args, **kwargs))


create = _blocking(_lifecycle.create)
create_many = _blocking(_lifecycle.create_many)
transition = _blocking(_lifecycle.transition)
apply_many = _blocking(_lifecycle.apply_many)
purge = _blocking(_lifecycle.purge)
history = _blocking(_lifecycle.history)
replay = _blocking(_lifecycle.replay)
as_of = _blocking(_lifecycle.as_of)
verify = _blocking(_lifecycle.verify)

enqueue_dispatch = _blocking(_outbox.enqueue_dispatch)
enqueue_dispatches = _blocking(_outbox.enqueue_dispatches)
get_dispatch = _blocking(_outbox.get_dispatch)
list_dispatches = _blocking(_outbox.list_dispatches)
ack_dispatch = _blocking(_outbox.ack_dispatch)
retry_dispatch = _blocking(_outbox.retry_dispatch)
expedite_dispatch = _blocking(_outbox.expedite_dispatch)
purge_dispatch = _blocking(_outbox.purge_dispatch)

send_notification = _blocking(_notifications.send_notification)
get_notification = _blocking(_notifications.get_notification)
list_notifications = _blocking(_notifications.list_notifications)
ack_notification = _blocking(_notifications.ack_notification)
dismiss_notification = _blocking(_notifications.dismiss_notification)
replay_notification = _blocking(_notifications.replay_notification)
resolve_notification = _blocking(_notifications.resolve_notification)

create_schedule = _blocking(_scheduler.create_schedule)
get_schedule = _blocking(_scheduler.get_schedule)
list_schedules = _blocking(_scheduler.list_schedules)
enable_schedule = _blocking(_scheduler.enable_schedule)
disable_schedule = _blocking(_scheduler.disable_schedule)
delete_schedule = _blocking(_scheduler.delete_schedule)
list_runs = _blocking(_scheduler.list_runs)
get_run = _blocking(_scheduler.get_run)
cancel_run = _blocking(_scheduler.cancel_run)
