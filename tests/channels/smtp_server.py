"""Real SMTP servers on 127.0.0.1 for the email channel's tests, some misbehaving on purpose.

aiosmtpd's ``SMTP`` protocol runs on the test's own event loop (``loop.create_server``), not in a
``Controller`` thread: a handler that hangs is a coroutine waiting on an ``asyncio.Event`` of the same
loop, and stopping the server closes every connection it accepted, so nothing outlives the test.

>>> async with smtp_server("accept") as server:          # doctest: +SKIP
...     ...  # server.port, server.messages (the effects: each content the server received)

Behaviours (:data:`BEHAVIOURS`): ``accept``; ``reject_recipient`` (550 on RCPT); ``reject_content``
(554 after the content); ``transient_once`` (451 after the first content, then accept: two effects);
``transient_always`` (451 after every content);
``greylist_once`` (450 on the first RCPT, then accept: one effect); ``hang_after_content`` (the content
is received, then no reply until :meth:`SmtpServer.release`). :func:`silent_server` accepts TCP and
never greets (a hang before anything was sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

BEHAVIOURS = ("accept", "reject_recipient", "reject_content", "transient_once", "transient_always",
              "greylist_once", "hang_after_content")
HOST = "127.0.0.1"


@dataclass
class SmtpServer:
    """A running test server: where it listens, what it received, and how to let a hang finish."""

    port: int
    behaviour: str
    messages: list[bytes] = field(default_factory=list)
    """Every message content the server received (the provider effects), accepted or not."""
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    rcpt_calls: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    late_replies: int = 0
    """Replies a hanging handler gave after its release (a late completion)."""

    def release(self) -> None:
        """Let a ``hang_after_content`` handler answer 250 (late)."""
        self.released.set()

    def effects(self) -> int:
        return len(self.messages)


class _Handler:
    """aiosmtpd hooks playing ``server.behaviour``."""

    def __init__(self, server: SmtpServer) -> None:
        self.server = server

    async def handle_RCPT(self, smtp: Any, session: Any, envelope: Any, address: str, options: list[str]) -> str:
        s = self.server
        s.rcpt_calls += 1
        if s.behaviour == "reject_recipient":
            return "550 5.1.1 <%s>: no such user here" % address
        if s.behaviour == "greylist_once" and s.rcpt_calls == 1:
            return "450 4.2.0 greylisted, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, smtp: Any, session: Any, envelope: Any) -> str:
        s = self.server
        s.messages.append(bytes(envelope.original_content or envelope.content))
        s.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        if s.behaviour == "transient_once" and len(s.messages) == 1:
            return "451 4.3.0 temporary failure, try again"
        if s.behaviour == "transient_always":
            return "451 4.3.0 still busy, try again"
        if s.behaviour == "reject_content":
            return "554 5.6.0 message content refused"
        if s.behaviour == "hang_after_content":
            await s.released.wait()
            s.late_replies += 1
            return "250 OK queued late"
        return "250 OK queued as %d" % len(s.messages)


@contextlib.asynccontextmanager
async def smtp_server(behaviour: str = "accept", *, password: str | None = None, username: str = "alerts",
                      tls: ssl.SSLContext | None = None, implicit_tls: ssl.SSLContext | None = None,
                      echo_credentials: bool = False) -> AsyncIterator[SmtpServer]:
    """A server playing ``behaviour``; with ``password``, AUTH is required (``username`` / ``password``);
    ``tls`` offers STARTTLS with that context (and requires it), ``implicit_tls`` speaks TLS from the
    first byte; ``echo_credentials``: a refused login's 535 repeats the password it was given (as a
    careless server might)."""
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown behaviour {behaviour!r}; behaviours are {', '.join(BEHAVIOURS)}")
    loop = asyncio.get_running_loop()
    state = SmtpServer(0, behaviour)
    handler = _Handler(state)
    protocols: list[SMTP] = []

    def authenticate(smtp: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and data.login == username.encode() and data.password == (password or "").encode()
        if ok:
            state.logins.append(username)
        echo = None
        if not ok and echo_credentials and isinstance(data, LoginPassword):
            echo = f"535 5.7.8 bad password {data.password.decode(errors='replace')} for {data.login.decode(errors='replace')}"
        return AuthResult(success=ok, handled=False, message=echo)  # handled=False: aiosmtpd sends the 235 or 535

    def factory() -> SMTP:
        with warnings.catch_warnings():  # "AUTH without TLS": on purpose, on 127.0.0.1
            warnings.simplefilter("ignore", UserWarning)
            protocol = _smtp()
        protocols.append(protocol)
        return protocol

    def _smtp() -> SMTP:
        return SMTP(handler, hostname="localhost", loop=loop, tls_context=tls, require_starttls=tls is not None,
                    auth_required=password is not None, auth_require_tls=tls is not None,  # implicit TLS: aiosmtpd sees only STARTTLS
                    authenticator=authenticate if password is not None else None, timeout=30)

    server = await loop.create_server(factory, HOST, 0, ssl=implicit_tls)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        state.release()
        server.close()
        for protocol in protocols:
            if protocol.transport is not None:
                protocol.transport.close()
        await asyncio.sleep(0)  # let connection_lost cancel the handlers
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A TCP server that accepts connections and never sends its greeting; yields its port."""
    writers: list[asyncio.StreamWriter] = []
    stop = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await stop.wait()

    server = await asyncio.start_server(hold, HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        stop.set()
        server.close()
        for writer in writers:
            writer.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)


def self_signed(folder: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1 and localhost (``cert.pem``, ``key.pem`` in ``folder``),
    made by the ``openssl`` command (the Python ``cryptography`` package is not installed); None
    without ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=30)
    return cert, key


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The server side of TLS with the test certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
