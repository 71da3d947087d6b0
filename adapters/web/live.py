"""``GET /live``: server-sent events telling open pages to refresh their figures.

One :class:`Hub` per console fans the book's change signals out to every connected page:

- the in-process commit signal (``Book.on_commit``): a write by this process (the console's own actions, or
  the daemon's when ``statebook run --web-port`` serves the console), on either backend;
- on PostgreSQL, ``LISTEN`` on the channels the registry's lifecycles ``NOTIFY`` when an entity is created
  (``statebook_dispatch``, ``statebook_notification``): an enqueue by any process;
- a cheap probe of the fact log's highest ``seq`` every :data:`PROBE_SECONDS` while a page listens: the
  writes of other processes that send no notification (a daemon delivering, on SQLite or PostgreSQL).

A page is told ``refresh`` (at most once per :data:`MIN_INTERVAL` seconds) and fetches its figures'
fragment; a comment goes out every :data:`HEARTBEAT_SECONDS` so proxies keep the stream open. A page of one
entity (``/live?entity=type/id``) is told only when that entity's version moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from statebook.lifecycle import Book
from statebook.lifecycle.facts import facts_table

from .auth import requires
from .state import Console, console

__all__ = ["HEARTBEAT_SECONDS", "MIN_INTERVAL", "PROBE_SECONDS", "EventStream", "Hub", "Subscription", "live", "routes",
           "shutdown", "startup"]

log = logging.getLogger("statebook.adapters.web.live")

HEARTBEAT_SECONDS = 15.0
MIN_INTERVAL = 1.0
PROBE_SECONDS = 2.0
ANY = "*"
"""A change whose entity types are unknown (a probe saw the log grow, a NOTIFY from another process)."""


class Subscription:
    """One page's view of the hub: the entity types changed since it last looked, and a wake-up."""

    def __init__(self, hub: Hub, entity: tuple[str, str] | None) -> None:
        self.hub = hub
        self.entity = entity
        self.changed: set[str] = set()
        self.wake = asyncio.Event()

    def push(self, entity_type: str) -> None:
        """Note a change of ``entity_type`` (or :data:`ANY`) and wake the page's stream."""
        if self.entity is not None and entity_type not in (ANY, self.entity[0]):
            return
        self.changed.add(entity_type)
        self.wake.set()

    def take(self) -> set[str]:
        """The changes noted since the last call, cleared."""
        found, self.changed = self.changed, set()
        self.wake.clear()
        return found


class Hub:
    """Fans one book's change signals out to many server-sent-event streams.

    Its sources start with the first subscriber and stop with the last one (or :meth:`close`), so an idle
    console holds no listening connection and runs no probe.
    """

    def __init__(self, book: Book, *, heartbeat: float = HEARTBEAT_SECONDS, min_interval: float = MIN_INTERVAL,
                 probe_seconds: float = PROBE_SECONDS, listen: bool = True) -> None:
        self.book = book
        self.heartbeat = heartbeat
        self.min_interval = min_interval
        self.probe_seconds = probe_seconds
        self.listen = listen and book.dialect == "postgresql"
        self.subscribers: set[Subscription] = set()
        self.closed = asyncio.Event()
        self.listening = asyncio.Event()
        """Set once LISTEN is connected on every channel (PostgreSQL): a NOTIFY sent from then on reaches the pages."""
        self._channels: list[str] = []
        self._connected: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._hooked = False

    # -- sources ------------------------------------------------------------------------------
    def changed(self, entity_type: str) -> None:
        """Tell every subscriber ``entity_type`` changed (the ``Book.on_commit`` hook; :data:`ANY`: unknown)."""
        for sub in list(self.subscribers):
            sub.push(entity_type)

    def _start(self) -> None:
        if not self._hooked:
            self.book.on_commit.append(self.changed)
            self._hooked = True
        if self.probe_seconds > 0:
            self._tasks.append(asyncio.create_task(self._probe(), name="statebook-live-probe"))
        if self.listen:
            self._channels = sorted({lc.notify_channel for lc in self.book.registry if lc.notify_channel})
            self._tasks += [asyncio.create_task(self._listen(c), name=f"statebook-live-{c}") for c in self._channels]

    async def _stop(self) -> None:
        if self._hooked:
            with contextlib.suppress(ValueError):
                self.book.on_commit.remove(self.changed)
            self._hooked = False
        tasks, self._tasks = self._tasks, []
        self._connected.clear()
        self.listening.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _probe(self) -> None:
        top: int | None = None  # None: not read yet
        query = sa.select(sa.func.coalesce(sa.func.max(facts_table.c.seq), 0))
        while True:
            try:
                async with self.book.read() as conn:
                    now = int((await conn.execute(query)).scalar_one())
                if top is not None and now != top:
                    self.changed(ANY)
                top = now
            except Exception as exc:  # noqa: BLE001 - a page keeps its figures; the next probe tries again
                log.warning("live probe failed (%s: %s)", type(exc).__name__, exc)
            await asyncio.sleep(self.probe_seconds)

    async def _listen(self, channel: str) -> None:
        from statebook.adapters.pgnotify import CONNECTED, listen

        stream = listen(self.book, channel)
        try:
            async for payload in stream:
                if payload == CONNECTED:
                    self._connected.add(channel)
                    if self._connected >= set(self._channels):
                        self.listening.set()
                else:
                    self.changed(ANY)
        finally:
            await stream.aclose()

    # -- subscribers --------------------------------------------------------------------------
    def subscribe(self, entity: tuple[str, str] | None = None) -> Subscription:
        """A new subscription (the hub's sources start with the first one)."""
        sub = Subscription(self, entity)
        if not self.subscribers and not self.closed.is_set():
            self._start()
        self.subscribers.add(sub)
        return sub

    async def unsubscribe(self, sub: Subscription) -> None:
        """Drop ``sub``; the sources stop with the last subscriber."""
        self.subscribers.discard(sub)
        if not self.subscribers:
            await self._stop()

    async def close(self) -> None:
        """End every stream and stop the sources (the app's shutdown; call it before waiting for connections,
        or an open stream keeps the server waiting)."""
        self.closed.set()
        for sub in list(self.subscribers):
            sub.wake.set()
        await self._stop()

    async def _version(self, entity: tuple[str, str]) -> int | None:
        """The entity's version now (None: no such row, or an unknown type)."""
        if entity[0] not in self.book.registry:
            return None
        table = self.book.policy(entity[0]).table
        async with self.book.read() as conn:
            return (await conn.execute(sa.select(table.c.version).where(table.c.id == entity[1]))).scalar()

    async def events(self, sub: Subscription) -> AsyncIterator[str]:
        """The stream of one subscription as server-sent-event text: ``refresh`` events and heartbeats."""
        loop = asyncio.get_running_loop()
        seen = await self._version(sub.entity) if sub.entity is not None else None
        yield "retry: 5000\n: connected\n\n"  # a dropped stream is retried by the browser after 5 s
        last = float("-inf")
        while not self.closed.is_set():
            try:
                await asyncio.wait_for(sub.wake.wait(), timeout=self.heartbeat)
            except TimeoutError:
                yield ": heartbeat\n\n"
                continue
            if self.closed.is_set():
                break
            pause = last + self.min_interval - loop.time()
            if pause > 0:  # a burst of commits becomes one refresh
                await asyncio.sleep(pause)
            types = sub.take()
            if sub.entity is not None:
                now = await self._version(sub.entity)
                if now == seen:
                    continue
                seen = now
            last = loop.time()
            data = json.dumps({"types": sorted(types)})
            yield f"event: refresh\ndata: {data}\n\n"


class EventStream:
    """An ASGI ``text/event-stream`` response that ends when the client disconnects or the hub closes.

    It listens for ``http.disconnect`` itself, whatever ASGI version the server speaks, so a closed tab
    frees its subscription at once rather than at the next heartbeat's failed write.
    """

    def __init__(self, hub: Hub, sub: Subscription, headers: dict[str, str] | None = None) -> None:
        self.hub = hub
        self.sub = sub
        self.headers = {"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})}

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        raw = [(b"content-type", b"text/event-stream; charset=utf-8")]
        raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]

        async def stream() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": raw})
            async for chunk in self.hub.events(self.sub):
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        tasks = [asyncio.create_task(stream()), asyncio.create_task(disconnected())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = None if task.cancelled() else task.exception()
                if error is not None and not isinstance(error, OSError):  # OSError: the client is gone
                    raise error
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, OSError, Exception):
                    await task
            await self.hub.unsubscribe(self.sub)


# -- the endpoint ---------------------------------------------------------------------------------

def _entity(argument: str | None) -> tuple[str, str] | None:
    """``type/id`` of ``?entity=`` (the id may hold ``/``); None without one."""
    if not argument:
        return None
    entity_type, sep, entity_id = argument.partition("/")
    if not sep or not entity_type or not entity_id:
        raise HTTPException(400, "entity: give it as type/id, e.g. dispatch/0123abcd")
    return entity_type, entity_id


@requires("viewer")
async def live(request: Request) -> Response:
    """``GET /live`` (``?entity=type/id``: only that entity's changes): a ``text/event-stream`` of ``refresh``
    events and heartbeat comments."""
    c = console(request)
    entity = _entity(request.query_params.get("entity"))
    if entity is not None and entity[0] not in c.book.registry:
        raise HTTPException(404, f"no lifecycle is registered for {entity[0][:60]!r}")
    if c.live is None:  # an app mounted in another runs no lifespan of its own: the hub starts here
        c.live = Hub(c.book)
    hub: Hub = c.live
    return EventStream(hub, hub.subscribe(entity))  # type: ignore[return-value]  # an ASGI app, as Response is


async def startup(c: Console) -> None:
    """The app's start: the console's hub (its sources start with its first page)."""
    if c.live is None:
        c.live = Hub(c.book)


async def shutdown(c: Console) -> None:
    """The app's end: every stream ends, the sources stop."""
    if c.live is not None:
        await c.live.close()


routes = [Route("/live", live, name="live")]
