"""PostgreSQL LISTEN/NOTIFY wake-ups for a :class:`~statebook.outbox.DeliveryWorker`.

Every enqueue on PostgreSQL runs ``pg_notify('statebook_dispatch', id)`` in its transaction, so a
notification arrives only after the row committed — from any process. :func:`listen` keeps one
dedicated asyncpg connection (outside the SQLAlchemy pool) and yields once per notification, and
once per (re)connection, since notifications sent while disconnected are lost.

>>> worker = DeliveryWorker(book, transport, extra_wakeups=listen(book))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

from sqlalchemy.engine import make_url

from statebook.lifecycle import Book
from statebook.outbox.dispatch.policy import NOTIFY_CHANNEL

log = logging.getLogger("statebook.adapters.pgnotify")

RECONNECT_SECONDS = 1.0
CONNECTED = "<connected>"
"""Yielded after each (re)connection: wake up and scan, something may have been missed."""


def asyncpg_dsn(target: Book | str) -> str:
    """A plain ``postgresql://`` DSN for asyncpg from a book or a SQLAlchemy URL."""
    url = target.engine.url if isinstance(target, Book) else make_url(target)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"LISTEN/NOTIFY needs PostgreSQL, not {url.get_backend_name()!r}")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


async def listen(
    target: Book | str, channel: str = NOTIFY_CHANNEL, *, reconnect_seconds: float = RECONNECT_SECONDS
) -> AsyncGenerator[str, None]:
    """Yield each notification's payload on ``channel`` (and :data:`CONNECTED` after connecting).

    Reconnects after ``reconnect_seconds`` when the connection drops. Close the generator (or
    cancel its consumer) to stop listening.
    """
    import asyncpg

    dsn = asyncpg_dsn(target)
    while True:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        try:
            conn = await asyncpg.connect(dsn)
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("LISTEN connection failed (%s); retrying in %ss", exc, reconnect_seconds)
            await asyncio.sleep(reconnect_seconds)
            continue
        try:
            await conn.add_listener(channel, lambda _c, _pid, _ch, payload: queue.put_nowait(payload))
            conn.add_termination_listener(lambda _c: queue.put_nowait(None))
            yield CONNECTED
            while True:
                payload = await queue.get()
                if payload is None:
                    log.warning("LISTEN connection closed; reconnecting")
                    break
                yield payload
        finally:
            if not conn.is_closed():
                try:
                    await asyncio.wait_for(conn.close(), 5)
                except Exception:
                    conn.terminate()
        await asyncio.sleep(reconnect_seconds)
