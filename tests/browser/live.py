"""An ASGI app served by uvicorn on 127.0.0.1, on an event loop in a thread of its own.

The browser (Selenium) is synchronous and blocks the test's thread while it waits for a page, so the
server cannot share that thread's loop. Everything asynchronous a scenario touches — the book, the
console, a delivery worker, the SMTP test server — lives on the server's loop; the test hands it
coroutines with :meth:`ServerLoop.run`. An asyncpg connection belongs to the loop that opened it, so
a book opened on the test's loop could not be used by the server.

>>> loop = ServerLoop()                                   # doctest: +SKIP
>>> sock, url = reserve()                                 # doctest: +SKIP
>>> loop.run(loop.serve(app, sock))                       # doctest: +SKIP
>>> loop.close()                                          # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvicorn

T = TypeVar("T")
HOST = "127.0.0.1"
STEP_SECONDS = 60.0
"""The longest one coroutine handed to the loop may take (a PostgreSQL schema reset on a loaded machine)."""
GRACE_SECONDS = 1
"""How long uvicorn waits for open responses (a server-sent event stream never ends by itself) at shutdown."""


class ServerLoop:
    """An event loop running in a daemon thread; :meth:`close` stops what runs on it and the thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        self._thread = threading.Thread(target=self._forever, name="browser-test-server", daemon=True)
        self._thread.start()

    def _forever(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = STEP_SECONDS) -> T:
        """Run ``coro`` on the server's loop and return its result (its exception is raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def enter(self, context: contextlib.AbstractAsyncContextManager[T]) -> T:
        """Enter an async context manager on the server's loop; :meth:`close` exits it, last entered first."""
        return self.run(self._stack.enter_async_context(context))

    def on_close(self, callback: Callable[[], Awaitable[Any]]) -> None:
        """Await ``callback()`` on the server's loop at :meth:`close` (after what was entered later)."""
        self._stack.push_async_callback(callback)

    async def serve(self, app: Any, sock: socket.socket) -> None:
        """Serve ``app`` on ``sock`` (from :func:`reserve`) until :meth:`close`."""
        await self._stack.enter_async_context(_served(app, sock))

    def close(self) -> None:
        """Exit what was entered (the server first when it was entered last), then stop the loop and its thread."""
        if not self._thread.is_alive():
            return
        try:
            self.run(self._stack.aclose())
        finally:
            self.run(_cancel_the_rest())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()


def reserve() -> tuple[socket.socket, str]:
    """A socket bound to a free port of 127.0.0.1, and the base URL it will answer at.

    Bound before the app is built, so the settings can name the address responders' links point at
    (``[web] public_url``), and no other process can take the port before uvicorn listens on it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock, f"http://{HOST}:{sock.getsockname()[1]}"


@contextlib.asynccontextmanager
async def _served(app: Any, sock: socket.socket) -> AsyncIterator[None]:
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="auto",
                            timeout_graceful_shutdown=GRACE_SECONDS)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # uvicorn gave up starting: its exception says why
                raise RuntimeError("uvicorn stopped before it started serving")
            await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, GRACE_SECONDS + 5)
        sock.close()


async def _cancel_the_rest() -> None:
    """Cancel the tasks a scenario left on the loop (a worker it did not stop), and wait for them."""
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
