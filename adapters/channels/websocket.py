"""The WebSocket channel: a hub the daemon serves, and a best-effort channel that pushes to it.

A subscriber connects to ``ws://HOST:PORT/notifications/<recipient>`` (the recipient percent-encoded)
with ``Authorization: Bearer <token>``: the recipient's own token, compared in constant time. No token,
a wrong token, another recipient's token or an unknown recipient: ``401`` at the handshake, logged
without the token, nothing delivered. The token travels in a header, never in the query string (query
strings end up in access logs); browsers, which cannot set headers on a WebSocket, connect through a
proxy that adds it. What a subscriber sends is ignored.

Each notification reaches every open socket of its recipient as one JSON text frame::

    {"attempt": 1, "content": {...}, "cycle": 1, "notification_id": "...", "recipient": "alice"}

with ``"links": {"acked": URL, "dismissed": URL}`` when the delivery has response links.

>>> hub, channel = WebSocketConfig(tokens=SecretRef(file="/etc/statebook/ws-tokens.json")).build()  # doctest: +SKIP
>>> await hub.start()   # the daemon does this; hub.url is then ws://127.0.0.1:8765/notifications  # doctest: +SKIP

The tokens file is a JSON object of recipient -> token (``{"alice": "…", "bob": "…"}``): each token
at least 16 characters and used by one recipient only.

Outcomes: SUCCESS when at least one socket took the frame (its ``send`` completed: the frame is in
the socket's buffers — not a read receipt); NOT_STARTED when the recipient has no subscriber (nothing
was sent, and no subscriber is not a refusal: admitting first only to report REJECTED would draw a
rate token and write a started fact for a send that could not happen, and a REJECTED without
admission is recorded as UNKNOWN by the runtime); UNKNOWN when frames were handed over but none
completed (a subscriber too slow, or gone mid-send: part of the frame may have reached it); REJECTED
when every subscriber left between the admission and the hand-over. A socket whose send does not
complete within ``send_seconds`` (and the call's remaining deadline) is dropped: a subscriber that
cannot keep up reconnects instead of growing the hub's buffers.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from pydantic import BaseModel, ConfigDict, Field, field_validator

from statebook.lifecycle.codec import dumps
from statebook.outbox.notifications.channels import Delivery, Guard, Observation, ProviderOutcome

from ..extras import require
from .links import ordered
from .secrets import SecretError, SecretRef

require("websockets", extra="channels", feature="the WebSocket channel")  # one line, not an ImportError traceback
from websockets.asyncio.server import Server, ServerConnection, serve  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.http11 import Request, Response  # noqa: E402
from websockets.protocol import State  # noqa: E402

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
MARGIN_SECONDS = 0.05
"""Kept back from the call's remaining deadline, so the channel answers before the runtime cuts it."""
_SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_DUMMY = "\x00" * 32  # compared against when the recipient has no token: the same work either way


def parse_tokens(text: str, *, source: str = "the tokens") -> dict[str, str]:
    """Recipient -> token from a JSON object; :class:`SecretError` naming what is wrong (never a value).

    >>> parse_tokens('{"alice": "a-long-enough-token-1"}')
    {'alice': 'a-long-enough-token-1'}
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SecretError(f"{source} are not JSON (line {getattr(exc, 'lineno', '?')}); expected an object "
                          "of recipient -> token") from None
    if not isinstance(value, dict) or not value:
        raise SecretError(f"{source} must be a non-empty JSON object of recipient -> token")
    return check_tokens(value, source=source)


def check_tokens(tokens: Mapping[Any, Any], *, source: str = "the tokens") -> dict[str, str]:
    """``tokens`` as recipient -> token, each recipient non-blank, each token a string of at least
    :data:`MIN_TOKEN_CHARS` characters used by no other recipient (:class:`SecretError` otherwise)."""
    checked: dict[str, str] = {}
    owners: dict[str, str] = {}
    for recipient, token in tokens.items():
        if not isinstance(recipient, str) or not recipient.strip():
            raise SecretError(f"{source}: a recipient must be a non-blank string")
        if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_CHARS:
            raise SecretError(f"{source}: the token of {recipient!r:.80} must be a string of at least "
                              f"{MIN_TOKEN_CHARS} characters")
        token = token.strip()
        if token in owners:
            raise SecretError(f"{source}: {owners[token]!r:.80} and {recipient!r:.80} share a token; "
                              "each recipient needs its own")
        owners[token] = recipient
        checked[recipient] = token
    return checked


class _Redacting(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The websockets library's logger with credential headers masked (it logs every request header
    at DEBUG)."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if len(args) == 2 and isinstance(args[0], str) and args[0].lower() in _SENSITIVE_HEADERS:
            args = (args[0], "****")
        super().log(level, msg, *args, **kwargs)


class WebSocketHub:
    """The endpoint subscribers connect to (``start``/``stop``; ``url``; ``subscribers(recipient)``).

    ``tokens``: recipient -> token (see :func:`check_tokens`). ``send_buffer_bytes``: when set, how much
    of a subscriber's backlog the hub holds (its write buffer and the socket's send buffer, each)
    before a send waits; ``None`` keeps the defaults (about 32 KiB plus what the kernel gives).
    Counters for operators and tests: ``handed`` (frames handed to a socket), ``taken`` (sends that
    completed), ``dropped`` (slow sockets closed), ``refused`` (handshakes refused).
    """

    def __init__(self, tokens: Mapping[str, str], *, host: str = "127.0.0.1", port: int = 8765,
                 path: str = "/notifications", send_buffer_bytes: int | None = None,
                 close_seconds: float = 1.0) -> None:
        self._tokens = check_tokens(tokens)
        self.host, self.port, self.path = host, port, _checked_path(path)
        self.send_buffer_bytes = send_buffer_bytes
        self.close_seconds = close_seconds
        self._server: Server | None = None
        self._sockets: dict[str, dict[ServerConnection, None]] = {}  # insertion-ordered sets
        self.handed = self.taken = self.dropped = self.refused = 0

    def __repr__(self) -> str:
        return f"WebSocketHub(url={self.url!r}, recipients={len(self._tokens)})"

    @property
    def url(self) -> str:
        """The endpoint's base URL (a subscriber appends ``/<recipient>``: :meth:`url_for`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return f"ws://{host}:{self.port}{self.path}"

    def url_for(self, recipient: str) -> str:
        """The URL a subscriber of ``recipient`` connects to."""
        return f"{self.url}/{quote(recipient, safe='')}"

    def subscribers(self, recipient: str) -> int:
        """How many open sockets ``recipient`` has now."""
        return len(self.open_sockets(recipient))

    def open_sockets(self, recipient: str) -> list[ServerConnection]:
        """The recipient's open sockets, oldest first."""
        return [ws for ws in self._sockets.get(recipient, ()) if ws.state is State.OPEN]

    async def start(self) -> None:
        """Listen (``port`` 0 picks a free port; :attr:`url` then names it)."""
        if self._server is not None:
            return
        extra: dict[str, Any] = {} if self.send_buffer_bytes is None else {"write_limit": self.send_buffer_bytes}
        self._server = await serve(
            self._serve, self.host, self.port, process_request=self._authorize, compression=None,
            max_size=4096, close_timeout=self.close_seconds, logger=_Redacting(logging.getLogger("websockets.server")),
            **extra)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("websocket hub listening on %s", self.url)

    async def stop(self) -> None:
        """Close every subscriber (``1001 going away``) and stop listening."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def __aenter__(self) -> WebSocketHub:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the handshake and the subscriber's life ---------------------------------------------------
    def _recipient(self, path: str) -> str | None:
        prefix = f"{self.path}/"
        if not path.startswith(prefix) or "?" in path or len(path) == len(prefix):
            return None
        recipient = unquote(path[len(prefix):])
        return recipient if recipient.strip() else None

    def _authorize(self, connection: ServerConnection, request: Request) -> Response | None:
        """Refuse (401) unless the request presents the named recipient's own token."""
        recipient = self._recipient(request.path)
        if recipient is None:
            self.refused += 1
            return connection.respond(HTTPStatus.NOT_FOUND, f"subscribe at {self.path}/<recipient>\n")
        header = request.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            return self._refuse(connection, recipient, "no bearer token")
        expected = self._tokens.get(recipient)
        if hmac.compare_digest((expected or _DUMMY).encode(), presented.encode()) and expected is not None:
            if self.send_buffer_bytes is not None:
                sock = connection.transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
            return None
        if expected is None:
            why = "no token is configured for this recipient"
        elif any(hmac.compare_digest(t.encode(), presented.encode()) for r, t in self._tokens.items() if r != recipient):
            why = "another recipient's token"
        else:
            why = "a wrong token"
        return self._refuse(connection, recipient, why)

    def _refuse(self, connection: ServerConnection, recipient: str, why: str) -> Response:
        self.refused += 1
        peer = connection.remote_address
        log.warning("refused a websocket subscriber of %r from %s: %s", recipient[:80],
                    peer[0] if peer else "?", why)
        response = connection.respond(HTTPStatus.UNAUTHORIZED, "a subscriber presents its recipient's token "
                                                               "as Authorization: Bearer <token>\n")
        response.headers["WWW-Authenticate"] = 'Bearer realm="statebook"'
        return response

    async def _serve(self, connection: ServerConnection) -> None:
        recipient = self._recipient(connection.request.path) if connection.request else None
        assert recipient is not None  # _authorize let it through
        sockets = self._sockets.setdefault(recipient, {})
        sockets[connection] = None
        log.info("websocket subscriber of %r connected (%d open)", recipient[:80], len(sockets))
        try:
            async for _ in connection:  # what a subscriber sends is ignored; reading keeps pings and closes flowing
                pass
        except ConnectionClosed:
            pass
        finally:
            sockets.pop(connection, None)
            if not sockets:
                self._sockets.pop(recipient, None)

    # -- pushing -----------------------------------------------------------------------------------
    async def push(self, connection: ServerConnection, frame: str, seconds: float) -> str:
        """Hand ``frame`` to one socket and wait at most ``seconds`` for the send to complete:
        ``"took"``, ``"gone"`` (it closed mid-send) or ``"slow"`` (dropped). Cancelled, it drops the
        socket too."""
        self.handed += 1
        try:
            async with asyncio.timeout(seconds):
                await connection.send(frame)
        except TimeoutError:
            self._drop(connection, f"did not take a frame within {seconds:.2f}s")
            return "slow"
        except ConnectionClosed:
            return "gone"
        except asyncio.CancelledError:
            self._drop(connection, "had not taken a frame when the call ended")
            raise
        self.taken += 1
        return "took"

    def _drop(self, connection: ServerConnection, why: str) -> None:
        self.dropped += 1
        recipient = self._recipient(connection.request.path) if connection.request else None
        log.warning("dropped a websocket subscriber of %r that %s", (recipient or "?")[:80], why)
        connection.transport.abort()


class WebSocketChannel:
    """The ``websocket`` channel (best effort): one JSON frame to every open socket of the recipient
    (see the module docstring for its outcomes). ``retries`` in its observation counts the sockets
    after the first: each is a further provider effect, behind ``guard_provider_attempt()``."""

    name = "websocket"
    persistent = False
    reports_admission = True
    guards_provider_attempts = True

    def __init__(self, hub: WebSocketHub, *, send_seconds: float = 2.0) -> None:
        self.hub = hub
        self.send_seconds = send_seconds

    def __repr__(self) -> str:
        return f"WebSocketChannel(hub={self.hub!r}, send_seconds={self.send_seconds:g})"

    @staticmethod
    def frame(delivery: Delivery) -> str:
        """The JSON text frame a subscriber receives for ``delivery``."""
        frame = {"notification_id": delivery.notification_id, "cycle": delivery.cycle, "attempt": delivery.attempt,
                 "recipient": delivery.recipient, "content": dict(delivery.content)}
        if links := ordered(delivery.links):
            frame["links"] = dict(links)
        return dumps(frame)

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """Push the delivery's frame to every open socket of its recipient, concurrently, each hand-over
        behind a guard (the first one is the admission)."""
        if not self.hub.open_sockets(delivery.recipient):
            return Observation(ProviderOutcome.NOT_STARTED, "no subscriber connected")
        frame = self.frame(delivery)
        pushes: list[asyncio.Task[str]] = []
        try:
            await guard.admit()
            for connection in self.hub.open_sockets(delivery.recipient):  # whoever is connected now
                if pushes:
                    await guard.guard_provider_attempt()
                seconds = min(self.send_seconds, guard.remaining() - MARGIN_SECONDS)
                if seconds <= 0:
                    if not pushes:
                        return Observation(ProviderOutcome.UNKNOWN, "admitted with no time left to hand the frame over")
                    break
                if connection.state is not State.OPEN:
                    continue  # left during the guard: skipped, nothing handed over
                pushes.append(asyncio.create_task(self.hub.push(connection, frame, seconds)))
                await asyncio.sleep(0)  # the hand-over happens now, before the next guard
            results = [await push for push in pushes]
        finally:
            for push in pushes:
                push.cancel()  # a no-op for finished ones; an unfinished one drops its socket
        return _observed(results)


def _observed(results: list[str]) -> Observation:
    """The observation of one push to every socket (see the module docstring)."""
    took, gone, slow = (results.count(r) for r in ("took", "gone", "slow"))
    retries = max(0, len(results) - 1)
    if not results:
        return Observation(ProviderOutcome.REJECTED, "every subscriber left before the frame was handed over")
    summary = f"{took} of {len(results)} subscriber sockets took the frame ({gone} gone mid-send, {slow} too slow)"
    if took:
        return Observation(ProviderOutcome.SUCCESS, summary, retries=retries)
    return Observation(ProviderOutcome.UNKNOWN, summary, retries=retries)


def _checked_path(path: str) -> str:
    if not path.startswith("/") or path.endswith("/") or "?" in path or "#" in path:
        raise ValueError(f"a websocket path starts with '/', does not end with one and has no query: got {path!r}")
    return path


class WebSocketEndpoint(NamedTuple):
    """What :meth:`WebSocketConfig.build` returns: the hub (the daemon starts it) and its channel."""

    hub: WebSocketHub
    channel: WebSocketChannel


class WebSocketConfig(BaseModel):
    """``[notifications.websocket]``: where the hub listens and where the subscribers' tokens live.

    >>> WebSocketConfig(port=8765, tokens=SecretRef(file="/etc/statebook/ws-tokens.json"))  # doctest: +SKIP
    """

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    path: str = "/notifications"
    tokens: SecretRef
    """A JSON object of recipient -> token (see :func:`parse_tokens`)."""
    send_seconds: float = Field(default=2.0, gt=0, le=60)
    """How long one socket may take to take a frame (within the call's deadline) before it is dropped."""
    send_buffer_bytes: int | None = Field(default=None, ge=4096, le=64 * 1024 * 1024)
    close_seconds: float = Field(default=1.0, gt=0, le=60)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _checked_path(value)

    def build(self) -> WebSocketEndpoint:
        """Read the tokens once and make the hub and its channel (the hub is not started)."""
        tokens = parse_tokens(self.tokens.reveal(), source=f"the websocket tokens ({self.tokens})")
        hub = WebSocketHub(tokens, host=self.host, port=self.port, path=self.path,
                           send_buffer_bytes=self.send_buffer_bytes, close_seconds=self.close_seconds)
        return WebSocketEndpoint(hub, WebSocketChannel(hub, send_seconds=self.send_seconds))
