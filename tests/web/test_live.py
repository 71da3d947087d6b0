"""Live updates (docs/console.md, "Overview and live updates"): the hub turns commits into ``refresh``
events, on SQLite and PostgreSQL, and lets go of a stream when its client leaves."""

from __future__ import annotations

import asyncio
import json

import pytest

from statebook.adapters.db import open_book
from statebook.adapters.web.live import Hub
from statebook.lifecycle import Actor, Book
from statebook.outbox import CallableTransport, deliver_due_dispatches, enqueue_dispatch, retry_dispatch


async def refuse(_to: str, _payload: str) -> bool:
    return False


async def next_event(stream, timeout: float = 10.0) -> str:
    """The next event of ``stream`` that is not a comment (a heartbeat or the greeting)."""
    async def first() -> str:
        async for chunk in stream:
            if not chunk.startswith((":", "retry:")):
                return chunk
        raise AssertionError("the stream ended")
    return await asyncio.wait_for(first(), timeout)


def refreshed(chunk: str) -> list[str]:
    event, data = chunk.strip().split("\n")
    assert event == "event: refresh"
    return json.loads(data.removeprefix("data: "))["types"]


async def test_a_commit_in_this_process_sends_a_refresh(book: Book) -> None:
    hub = Hub(book, probe_seconds=0, listen=False, min_interval=0)
    sub = hub.subscribe()
    stream = hub.events(sub)
    assert (await anext(stream)).startswith("retry:")
    waiting = asyncio.ensure_future(next_event(stream))
    await asyncio.sleep(0)
    await enqueue_dispatch(book, kind="k", deliver_to="ok")
    assert refreshed(await waiting) == ["dispatch"]
    await stream.aclose()
    await hub.unsubscribe(sub)
    assert hub.changed not in book.on_commit  # the hook goes with the last subscriber


async def test_another_process_s_write_is_seen_by_the_probe(book: Book, db_url: str) -> None:
    other = await open_book(db_url, create=False)
    hub = Hub(book, probe_seconds=0.05, listen=False, min_interval=0)
    sub = hub.subscribe()
    stream = hub.events(sub)
    try:
        await anext(stream)
        await asyncio.sleep(0.2)  # the probe has read the log's top
        await enqueue_dispatch(other, kind="k", deliver_to="ok")
        assert refreshed(await next_event(stream)) == ["*"]
    finally:
        await stream.aclose()
        await hub.close()
        await other.engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_postgres_notify_from_another_process_sends_a_refresh(book: Book, db_url: str) -> None:
    other = await open_book(db_url, create=False)
    hub = Hub(book, probe_seconds=0, listen=True, min_interval=0)
    sub = hub.subscribe()
    stream = hub.events(sub)
    try:
        await anext(stream)
        await asyncio.wait_for(hub.listening.wait(), 10)
        await enqueue_dispatch(other, kind="k", deliver_to="ok")
        assert refreshed(await next_event(stream)) == ["*"]
    finally:
        await stream.aclose()
        await hub.close()
        await other.engine.dispose()


async def test_an_entity_page_hears_only_of_its_entity(book: Book) -> None:
    first = await enqueue_dispatch(book, kind="k", deliver_to="bad", max_attempts=1)
    await deliver_due_dispatches(book, transport=CallableTransport(refuse))  # dead_letter
    hub = Hub(book, probe_seconds=0, listen=False, min_interval=0)
    sub = hub.subscribe(("dispatch", first))
    stream = hub.events(sub)
    await anext(stream)
    waiting = asyncio.ensure_future(next_event(stream))
    await enqueue_dispatch(book, kind="k", deliver_to="ok")  # another dispatch: this one's version did not move
    await asyncio.sleep(0.2)
    assert not waiting.done()
    assert await retry_dispatch(book, first, actor=Actor("operator", "ana"))
    assert refreshed(await waiting) == ["dispatch"]
    await stream.aclose()
    await hub.close()


async def test_close_ends_every_stream_and_heartbeats_keep_it_open(book: Book) -> None:
    hub = Hub(book, probe_seconds=0, listen=False, heartbeat=0.05)
    sub = hub.subscribe()
    stream = hub.events(sub)
    assert (await anext(stream)).startswith("retry:")
    assert await anext(stream) == ": heartbeat\n\n"
    await hub.close()
    with pytest.raises(StopAsyncIteration):
        while True:
            await asyncio.wait_for(anext(stream), 1.0)
    assert not hub._tasks
