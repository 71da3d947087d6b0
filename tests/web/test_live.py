"""Live updates (docs/console.md, "Overview and live updates"): the hub turns commits into ``refresh``
events, on SQLite and PostgreSQL, and lets go of a stream when its client leaves."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any

import httpx
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


def assert_after_a_dispatch_commit(types: list[str]) -> None:
    """The refresh a dispatch's commit causes names it (the commit signal of this process) or "*" (on
    PostgreSQL its NOTIFY may reach the hub first; a probe may see the log grow first)."""
    assert types and set(types) <= {"dispatch", "*"}, types


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


# -- GET /live ----------------------------------------------------------------------------------------

class Stream:
    """``GET path`` on the ASGI app itself, streamed (httpx's ASGI transport waits for a whole body)."""

    def __init__(self, app: Any, client: httpx.AsyncClient, path: str) -> None:
        target, _, query = path.partition("?")
        cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
        self.scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                      "method": "GET", "scheme": "http", "path": target, "raw_path": target.encode(),
                      "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 40000),
                      "server": ("console.test", 80), "headers": [(b"host", b"console.test"), (b"cookie", cookie.encode())]}
        self.sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.gone = asyncio.Event()
        self.asked = False
        self.task = asyncio.create_task(app(self.scope, self.receive, self.sent.put))

    async def receive(self) -> dict[str, Any]:
        if not self.asked:
            self.asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def start(self) -> dict[str, Any]:
        message = await asyncio.wait_for(self.sent.get(), 10)
        assert message["type"] == "http.response.start"
        return message

    async def event(self, timeout: float = 10.0) -> str:
        """The next chunk that is not a comment."""
        async def first() -> str:
            while True:
                message = await self.sent.get()
                body = message.get("body", b"").decode()
                if not message.get("more_body", False):
                    raise AssertionError(f"the stream ended ({body!r})")
                if body and not body.startswith((":", "retry:")):
                    return body
        return await asyncio.wait_for(first(), timeout)

    async def ended(self, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self.task, timeout)


async def test_sse_sends_a_refresh_after_a_commit_and_stops_on_disconnect(app: Any, client: httpx.AsyncClient,
                                                                         sign_in: Any, book: Book) -> None:
    await sign_in("viewer")
    stream = Stream(app, client, "/live")
    start = await stream.start()
    headers = dict(start["headers"])
    assert start["status"] == 200 and headers[b"content-type"].startswith(b"text/event-stream")
    assert b"content-security-policy" in headers
    hub: Hub = app.state.console.live
    await asyncio.sleep(0.1)
    assert len(hub.subscribers) == 1
    await enqueue_dispatch(book, kind="k", deliver_to="ok")
    assert_after_a_dispatch_commit(refreshed(await stream.event()))
    stream.gone.set()  # the client goes away
    await stream.ended()
    assert not hub.subscribers and not hub._tasks  # its subscription and the hub's sources are gone


async def test_sse_for_one_entity(app: Any, client: httpx.AsyncClient, sign_in: Any, book: Book) -> None:
    await sign_in("viewer")
    first = await enqueue_dispatch(book, kind="k", deliver_to="bad", max_attempts=1)
    await deliver_due_dispatches(book, transport=CallableTransport(refuse))
    stream = Stream(app, client, f"/live?entity=dispatch/{first}")
    await stream.start()
    await asyncio.sleep(0.1)
    assert await retry_dispatch(book, first, actor=Actor("operator", "olga"))
    assert_after_a_dispatch_commit(refreshed(await stream.event()))
    stream.gone.set()
    await stream.ended()


async def test_sse_ends_when_the_app_shuts_down(book: Book, settings: Any) -> None:
    from statebook.adapters.web import create_app

    application = create_app(book, settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
            page = await client.get("/sign-in")
            token = re.search(r'name="csrf-token" content="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            await client.post("/sign-in", data={"name": "vic", "password": "viewer-pass", "next": "/",
                                                "csrf_token": token})
            stream = Stream(application, client, "/live")
            await stream.start()
            await asyncio.sleep(0.1)
    await stream.ended()  # the hub closed with the app: the stream ended by itself


async def test_sse_refuses_the_anonymous_and_bad_entities(client: httpx.AsyncClient, sign_in: Any) -> None:
    assert (await client.get("/live")).status_code == 303
    await sign_in("viewer")
    assert (await client.get("/live?entity=nothing")).status_code == 400
    assert (await client.get("/live?entity=nosuchtype/1")).status_code == 404


async def test_a_served_console_streams_and_stops_promptly(book: Book, settings: Any) -> None:
    """Over a real socket: the stream's events arrive as they happen, a closed client frees its subscription,
    and stopping the server ends a stream still open instead of waiting for it."""
    import time

    from statebook.adapters.web.serve import serving

    client = httpx.AsyncClient(timeout=10)
    try:
        async with serving(book, settings, "127.0.0.1", 0) as url:
            page = await client.get(f"{url}/sign-in")
            token = re.search(r'name="csrf-token" content="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            await client.post(f"{url}/sign-in", data={"name": "vic", "password": "viewer-pass", "next": "/",
                                                      "csrf_token": token})
            async with client.stream("GET", f"{url}/live") as answer:
                assert answer.headers["content-type"].startswith("text/event-stream")
                chunks = answer.aiter_text()
                assert (await anext(chunks)).startswith("retry:")
                await enqueue_dispatch(book, kind="k", deliver_to="ok")
                got = ""
                while "event: refresh" not in got:
                    got += await asyncio.wait_for(anext(chunks), 10)
            # The client closed its stream: the server lets go of the subscription (and the hub of its hook).
            for _ in range(100):
                if not any(isinstance(getattr(hook, "__self__", None), Hub) for hook in book.on_commit):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the hub still listens after its last stream closed")
            still_open = client.stream("GET", f"{url}/live")
            answer = await still_open.__aenter__()
            assert answer.status_code == 200
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 5  # the server stopped without waiting for the open stream
        with contextlib.suppress(httpx.HTTPError):
            await still_open.__aexit__(None, None, None)
    finally:
        await client.aclose()


async def test_a_console_mounted_without_its_lifespan_still_streams(book: Book, settings: Any) -> None:
    """Mounted in another app (whose lifespan does not reach it), the console makes its hub on first use."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from statebook.adapters.web import create_app

    console_app = create_app(book, settings)
    outer = Starlette(routes=[Mount("/statebook", console_app)])
    transport = httpx.ASGITransport(app=outer, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
        page = await client.get("/statebook/sign-in")
        token = re.search(r'name="csrf-token" content="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        await client.post("/statebook/sign-in", data={"name": "vic", "password": "viewer-pass", "next": "/",
                                                      "csrf_token": token})
        overview = await client.get("/statebook/")
        assert overview.status_code == 200 and 'data-live="/statebook/live"' in overview.text
        stream = Stream(outer, client, "/statebook/live")
        await stream.start()
        await asyncio.sleep(0.1)
        await enqueue_dispatch(book, kind="k", deliver_to="ok")
        assert_after_a_dispatch_commit(refreshed(await stream.event()))
        stream.gone.set()
        await stream.ended()
    assert not console_app.state.console.live.subscribers


async def test_an_entity_page_listens_to_its_own_changes(client: httpx.AsyncClient, sign_in: Any,
                                                         book: Book) -> None:
    """The entity page carries a hidden notice bound to /live?entity=...; live.js shows it on a refresh."""
    first = await enqueue_dispatch(book, kind="k", deliver_to="ok")
    await sign_in("viewer")
    html = (await client.get(f"/e/dispatch/{first}")).text
    assert f'hidden data-live="/live?entity=dispatch/{first}"' in html
    assert '<script src="/static/live.js" defer></script>' in html
    script = (await client.get("/static/live.js")).text
    assert "EventSource" in script and "region.hidden = false" in script
