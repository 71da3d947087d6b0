"""Real HTTP servers on 127.0.0.1 for the HTTP channels' tests, misbehaving on purpose.

:func:`serve` starts an ``aiohttp.web`` server on an ephemeral port that answers every POST per its
``behaviour`` and records every request it received (``server.received``; ``server.effects()`` counts
them — a request counts once its body was read, i.e. the provider took the content):

- ``accept`` / ``reject``: the provider's documented acceptance / refusal (``PROFILES``);
- ``rate_limited``: ``429`` with ``Retry-After`` (``retry_after``: seconds or an HTTP date);
- ``fail_then_accept``: ``failures`` answers ``fail_answer`` (a 500), then acceptance;
- ``slow``: acceptance after ``delay`` seconds (longer than the test's deadline);
- ``hang_after_body``: reads the body, then waits until ``release()``, then accepts (a late completion);
- ``reset_after_body``: reads the body, then aborts the connection (a TCP reset, no answer);
- ``reset_then_accept``: the first request is reset after its body, the next accepted.

:func:`unreachable` is a port whose TCP connect never completes: a listening socket with a backlog
of 0 that never calls ``accept()``, its accept queue filled by one connection of our own, so the
kernel drops further SYNs and a client's connect hangs until its timeout — the request is never
written (a server that accepts and never reads would not do: the kernel would take the request's
bytes into its buffers, so headers would have left). :func:`closed_port` is a port nobody listens
on (connect refused at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

PROFILES: dict[str, dict[str, tuple[int, Any]]] = {
    # https://api.slack.com/messaging/webhooks#handling_errors: text bodies
    "slack_webhook": {"accept": (200, "ok"), "reject": (400, "invalid_payload")},
    # https://api.slack.com/methods/chat.postMessage: always JSON, ok true / false
    "slack_bot": {"accept": (200, {"ok": True, "channel": "C0", "ts": "1700000000.000100"}),
                  "reject": (200, {"ok": False, "error": "channel_not_found"})},
    # https://developer.pagerduty.com/docs/events-api-v2/overview/#response-codes--retry-logic
    "pagerduty": {"accept": (202, {"status": "success", "message": "Event processed", "dedup_key": "k"}),
                  "reject": (400, {"status": "invalid event", "message": "Event object is invalid",
                                   "errors": ["'routing_key' is invalid"]})},
    "webhook": {"accept": (200, {"received": True}), "reject": (422, "unprocessable")},
}
BEHAVIOURS = ("accept", "reject", "rate_limited", "fail_then_accept", "slow", "hang_after_body", "reset_after_body",
              "reset_then_accept")


@dataclass
class Received:
    """One request the server read: path, headers and body."""

    path: str
    headers: dict[str, str]
    body: bytes
    peer: Any = None


@dataclass
class HttpServer:
    """A running server (see the module). ``answer``: override the (status, body) of ``accept``."""

    profile: str
    behaviour: str
    failures: int = 1
    fail_answer: tuple[int, Any] = (500, "upstream failed")
    retry_after: str | None = "7"
    delay: float = 5.0
    answer: tuple[int, Any] | None = None
    received: list[Received] = field(default_factory=list)
    url: str = ""
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    def effects(self) -> int:
        """Requests whose content the server took."""
        return len(self.received)

    def release(self) -> None:
        """Let ``hang_after_body`` requests answer."""
        self._release.set()

    def _reply(self, kind: str) -> web.Response:
        status, body = self.answer if kind == "accept" and self.answer else PROFILES[self.profile][kind]
        if isinstance(body, str):
            return web.Response(status=status, text=body)
        return web.json_response(body, status=status)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.received.append(Received(request.path_qs, dict(request.headers), body, peer))
        seen = len(self.received)
        b = self.behaviour
        if b == "reject":
            return self._reply("reject")
        if b == "rate_limited":
            headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
            return web.json_response({"ok": False, "error": "ratelimited"}, status=429, headers=headers)
        if b == "fail_then_accept" and seen <= self.failures:
            status, text = self.fail_answer
            return web.Response(status=status, text=text) if isinstance(text, str) else web.json_response(text, status=status)
        if b == "slow":
            await asyncio.sleep(self.delay)
        if b == "hang_after_body":
            await self._release.wait()
        if b == "reset_after_body" or (b == "reset_then_accept" and seen == 1):
            assert request.transport is not None
            request.transport.abort()  # RST: the body was read, no answer ever comes
            await asyncio.sleep(3600)  # never answers (aiohttp cancels the handler when the peer is gone)
        return self._reply("accept")


@contextlib.asynccontextmanager
async def serve(profile: str, behaviour: str = "accept", **options: Any) -> AsyncIterator[HttpServer]:
    """Start an :class:`HttpServer` on 127.0.0.1 (an ephemeral port); stopped on exit."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {behaviour!r}; behaviours are {', '.join(BEHAVIOURS)}")
    server = HttpServer(profile, behaviour, **options)
    app = web.Application()
    app.router.add_post("/{tail:.*}", server.handle)
    # access_log=None: the fake provider's own access log would show the secret path (it is not ours to check)
    runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    server.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield server
    finally:
        server.release()
        await runner.cleanup()


@contextlib.contextmanager
def unreachable() -> Iterator[str]:
    """A base URL whose TCP connect never completes (see the module); closed on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):  # fill the accept queue until a connect stays pending
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
            _, writable, _ = select.select([], [filler], [], 0.2)
            if not writable:
                break
        else:
            raise RuntimeError("could not fill the accept queue: connects to the test port keep completing")
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in (*fillers, listener):
            s.close()


def closed_port() -> str:
    """A base URL nobody listens on (connect refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"
