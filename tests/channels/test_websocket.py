"""The WebSocket hub and channel against real subscribers (websockets clients on 127.0.0.1).

Faults injected: a missing, wrong, malformed or another recipient's token, an unknown recipient and a
wrong path (refused at the handshake, nothing delivered); a subscriber that stops reading (its send
cannot complete: dropped); one that disconnects while its send waits; a connection that never
finishes its handshake; a refused guard before the second socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from statebook.adapters.channels.contract import ChannelContract, RecordingGuard, Scenario
from statebook.adapters.channels.secrets import SecretError, SecretRef
from statebook.adapters.channels.websocket import (
    WebSocketChannel, WebSocketConfig, WebSocketHub, parse_tokens,
)
from statebook.lifecycle import verify
from statebook.outbox.notifications import (
    Delivery, LeaseLost, ProviderOutcome, get_notification, notification_attempts, send_notification,
)
from statebook.outbox.notifications.delivery import deliver_due_notifications

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-9876543210xyz"}
CLIENT_LOG = logging.getLogger("tests.channels.subscriber")
"""The test subscribers' own logger: a client logs the headers it sends at DEBUG, tokens included."""
BIG = {"title": "disk full", "body": "x" * 256 * 1024}
"""Content larger than a small-buffered hub's buffers: a send to a subscriber that stopped reading waits."""
SMALL_BUFFERS = 16 * 1024


@contextlib.asynccontextmanager
async def running(**kwargs) -> AsyncIterator[WebSocketHub]:
    hub = WebSocketHub(TOKENS, port=0, **kwargs)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.stop()


class Subscriber:
    """A real client of one recipient that keeps every frame it receives (``frames``); ``slow``: its
    socket's receive buffer is small and it stops reading right after the handshake."""

    def __init__(self, client: ClientConnection, *, reads: bool = True) -> None:
        self.client = client
        self.frames: list[dict] = []
        self._reader = asyncio.create_task(self._read() if reads else asyncio.sleep(0))

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.client:
                self.frames.append(json.loads(message))

    def disconnect(self) -> None:
        """Vanish without a close handshake (a TCP reset, as when a laptop lid shuts)."""
        self.client.transport.abort()

    async def close(self) -> None:
        self.client.transport.abort()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader


async def subscribe(hub: WebSocketHub, recipient: str, token: str | None, *, slow: bool = False,
                    header: str | None = None) -> Subscriber:
    headers = {} if token is None and header is None else {"Authorization": header or f"Bearer {token}"}
    sock = None
    if slow:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (hub.host, hub.port))
    client = await connect(hub.url_for(recipient), additional_headers=headers, compression=None, max_size=None,
                           logger=CLIENT_LOG, close_timeout=0.2, open_timeout=2, **({"sock": sock} if sock else {}))
    if slow:
        client.transport.pause_reading()
    return Subscriber(client, reads=not slow)


async def until(predicate: Callable[[], bool], seconds: float = 2.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "the condition did not come true in time"
        await asyncio.sleep(0.005)


def delivery(recipient: str = "alice", content: dict | None = None) -> Delivery:
    return Delivery("n" * 26, recipient, content or {"title": "disk full"}, cycle=1, attempt=2, channel="websocket")


def guard(deadline: float = 2.0, **kwargs) -> RecordingGuard:
    return RecordingGuard(lambda: 0, deadline, **kwargs)


# -- authentication ------------------------------------------------------------------------------------
async def test_a_subscriber_with_its_own_token_receives_the_frame():
    async with running() as hub:
        alice = await subscribe(hub, "alice", TOKENS["alice"])
        await until(lambda: hub.subscribers("alice") == 1)
        g = guard()
        observed = await WebSocketChannel(hub).send(delivery(), g)
        assert observed.outcome is ProviderOutcome.SUCCESS and observed.retries == 0, observed
        assert [kind for kind, _ in g.events] == ["admit"]
        await until(lambda: len(alice.frames) == 1)
        assert alice.frames == [{"notification_id": "n" * 26, "cycle": 1, "attempt": 2, "recipient": "alice",
                                 "content": {"title": "disk full"}}]
        assert (hub.handed, hub.taken, hub.dropped) == (1, 1, 0)
        await alice.close()


@pytest.mark.parametrize("recipient, header", [
    ("alice", None),                                   # no Authorization header
    ("alice", "Bearer not-alices-token-at-all"),       # a wrong token
    ("alice", f"Bearer {TOKENS['bob']}"),              # another recipient's token
    ("alice", f"Basic {TOKENS['alice']}"),             # the right token in another scheme
    ("alice", "Bearer "),                              # an empty token
    ("carol", f"Bearer {TOKENS['alice']}"),            # a recipient with no token
])
async def test_a_subscriber_without_its_recipients_token_is_refused_at_the_handshake(recipient, header):
    async with running() as hub:
        with pytest.raises(InvalidStatus) as refused:
            await subscribe(hub, recipient, None, header=header)
        assert refused.value.response.status_code == 401
        assert refused.value.response.headers["WWW-Authenticate"].startswith("Bearer")
        assert hub.refused == 1 and hub.subscribers(recipient) == 0
        g = guard()
        observed = await WebSocketChannel(hub).send(delivery(recipient), g)
        assert observed.outcome is ProviderOutcome.NOT_STARTED and not g.admitted and hub.handed == 0


async def test_a_path_outside_the_endpoint_is_not_found():
    async with running() as hub:
        for path in ("/", "/notifications", "/notifications/", "/elsewhere/alice"):
            with pytest.raises(InvalidStatus) as refused:
                await connect(f"ws://{hub.host}:{hub.port}{path}", logger=CLIENT_LOG,
                              additional_headers={"Authorization": f"Bearer {TOKENS['alice']}"})
            assert refused.value.response.status_code == 404, path


async def test_a_subscriber_receives_only_its_own_recipients_notifications():
    async with running() as hub:
        alice = await subscribe(hub, "alice", TOKENS["alice"])
        bob = await subscribe(hub, "bob", TOKENS["bob"])
        await until(lambda: hub.subscribers("alice") == hub.subscribers("bob") == 1)
        channel = WebSocketChannel(hub)
        assert (await channel.send(delivery("alice"), guard())).outcome is ProviderOutcome.SUCCESS
        await until(lambda: len(alice.frames) == 1)
        await asyncio.sleep(0.05)
        assert bob.frames == [] and hub.handed == 1
        await alice.close()
        await bob.close()


async def test_the_log_of_a_refused_or_accepted_handshake_never_holds_a_token(caplog):
    """At DEBUG the websockets library logs every request header: the hub masks Authorization."""
    caplog.set_level(logging.DEBUG)
    wrong = "Bearer wrong-token-that-must-not-be-logged"
    async with running() as hub:
        for header in (wrong, f"Bearer {TOKENS['bob']}"):
            with pytest.raises(InvalidStatus):
                await subscribe(hub, "alice", None, header=header)
        alice = await subscribe(hub, "alice", TOKENS["alice"])
        await until(lambda: hub.subscribers("alice") == 1)
        await alice.close()
    ours = [r for r in caplog.records if not r.name.startswith(CLIENT_LOG.name)]
    text = "\n".join(r.getMessage() for r in ours)
    assert "< Authorization: ****" in text, "the library's header log was not seen: the check would prove nothing"
    for secret in (wrong.split()[1], *TOKENS.values()):
        assert secret not in text
    refusals = [r.getMessage() for r in ours if r.name == "statebook.adapters.channels.websocket"
                and r.levelno == logging.WARNING]
    assert refusals == ["refused a websocket subscriber of 'alice' from 127.0.0.1: a wrong token",
                        "refused a websocket subscriber of 'alice' from 127.0.0.1: another recipient's token"]


# -- fan-out, disconnects, slow subscribers --------------------------------------------------------------
async def test_two_subscribers_of_one_recipient_both_receive_and_the_second_is_guarded():
    async with running() as hub:
        first, second = [await subscribe(hub, "alice", TOKENS["alice"]) for _ in range(2)]
        await until(lambda: hub.subscribers("alice") == 2)
        g = RecordingGuard(lambda: hub.handed, 2.0)
        observed = await WebSocketChannel(hub).send(delivery(), g)
        assert observed.outcome is ProviderOutcome.SUCCESS and observed.retries == 1, observed
        assert g.events == [("admit", 0), ("guard", 1)]
        await until(lambda: len(first.frames) == len(second.frames) == 1)
        await first.close()
        await second.close()


async def test_a_refused_guard_before_the_second_socket_stops_the_fan_out():
    async with running() as hub:
        first, second = [await subscribe(hub, "alice", TOKENS["alice"]) for _ in range(2)]
        await until(lambda: hub.subscribers("alice") == 2)
        with pytest.raises(LeaseLost):
            await WebSocketChannel(hub).send(delivery(), RecordingGuard(lambda: hub.handed, 2.0, lose_at=2))
        await until(lambda: len(first.frames) == 1)
        await asyncio.sleep(0.05)
        assert second.frames == [] and hub.handed == 1
        await first.close()
        await second.close()


async def test_a_subscriber_that_disconnects_mid_send_is_skipped_and_the_other_still_receives():
    async with running(send_buffer_bytes=SMALL_BUFFERS) as hub:
        leaving = await subscribe(hub, "alice", TOKENS["alice"], slow=True)
        staying = await subscribe(hub, "alice", TOKENS["alice"])
        await until(lambda: hub.subscribers("alice") == 2)

        async def leave_while_its_send_waits() -> None:
            await until(lambda: hub.handed == 2)
            await asyncio.sleep(0.05)
            leaving.disconnect()

        left = asyncio.create_task(leave_while_its_send_waits())
        started = time.monotonic()
        observed = await WebSocketChannel(hub, send_seconds=5).send(delivery(content=BIG), guard(5))
        await left
        assert time.monotonic() - started < 2, "the call waited for a socket that had gone"
        assert observed.outcome is ProviderOutcome.SUCCESS and observed.retries == 1, observed
        assert "1 of 2" in observed.detail and "1 gone" in observed.detail, observed.detail
        await until(lambda: len(staying.frames) == 1)
        assert staying.frames[0]["content"] == BIG and hub.dropped == 0
        await staying.close()


async def test_a_slow_subscriber_is_bounded_dropped_and_does_not_count(caplog):
    async with running(send_buffer_bytes=SMALL_BUFFERS) as hub:
        slow = await subscribe(hub, "alice", TOKENS["alice"], slow=True)
        quick = await subscribe(hub, "alice", TOKENS["alice"])
        await until(lambda: hub.subscribers("alice") == 2)
        started = time.monotonic()
        observed = await WebSocketChannel(hub, send_seconds=0.3).send(delivery(content=BIG), guard(5))
        took = time.monotonic() - started
        assert observed.outcome is ProviderOutcome.SUCCESS, observed
        assert "1 of 2" in observed.detail and "1 too slow" in observed.detail, observed.detail
        assert 0.25 <= took < 0.3 + 1.0, f"{took:.2f}s with send_seconds=0.3"
        assert hub.dropped == 1 and hub.taken == 1
        assert "dropped a websocket subscriber of 'alice' that did not take a frame within 0.30s" in caplog.text
        await until(lambda: hub.subscribers("alice") == 1)  # the slow one was dropped
        await until(lambda: len(quick.frames) == 1)
        await slow.close()
        await quick.close()


async def test_a_lone_slow_subscriber_is_unknown_within_the_calls_remaining_deadline():
    async with running(send_buffer_bytes=SMALL_BUFFERS) as hub:
        slow = await subscribe(hub, "alice", TOKENS["alice"], slow=True)
        await until(lambda: hub.subscribers("alice") == 1)
        started = time.monotonic()
        observed = await WebSocketChannel(hub, send_seconds=30).send(delivery(content=BIG), guard(0.5))
        took = time.monotonic() - started
        assert observed.outcome is ProviderOutcome.UNKNOWN and "1 too slow" in observed.detail, observed
        assert took < 0.5 + 1.0, f"{took:.2f}s: the send was not bounded by guard.remaining() (0.5 s) but by send_seconds"
        await slow.close()


async def test_a_small_frame_to_a_subscriber_that_never_reads_still_completes():
    """Why ``hang_after_admission`` needs a backlog: with room in the buffers, ``send`` completes at once
    even if the subscriber never reads — SUCCESS means the socket took the frame, not that it was read."""
    async with running() as hub:
        idle = await subscribe(hub, "alice", TOKENS["alice"], slow=True)
        await until(lambda: hub.subscribers("alice") == 1)
        observed = await WebSocketChannel(hub).send(delivery(), guard(0.5))
        assert observed.outcome is ProviderOutcome.SUCCESS
        await idle.close()


async def test_stop_closes_every_subscriber():
    async with running() as hub:
        alice = await subscribe(hub, "alice", TOKENS["alice"])
        await until(lambda: hub.subscribers("alice") == 1)
    await asyncio.wait_for(alice.client.wait_closed(), 2)
    assert alice.client.close_code == 1001
    await alice.close()


# -- configuration ---------------------------------------------------------------------------------------
def test_the_config_reads_the_tokens_file_once_and_shows_no_token(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(TOKENS))
    hub, channel = WebSocketConfig(port=0, path="/ws", tokens=SecretRef(file=path), send_seconds=0.5).build()
    assert (channel.name, channel.persistent, channel.reports_admission, channel.guards_provider_attempts) == (
        "websocket", False, True, True)
    assert channel.hub is hub and channel.send_seconds == 0.5 and hub.url == "ws://127.0.0.1:0/ws"
    assert hub.url_for("a b/c") == "ws://127.0.0.1:0/ws/a%20b%2Fc"
    for text in (repr(hub), repr(channel), str(channel)):
        assert not any(t in text for t in TOKENS.values()), text


@pytest.mark.parametrize("text, says", [
    ("alice secret", "not JSON"),
    ('["alice"]', "non-empty JSON object"),
    ('{"alice": "short"}', "at least 16 characters"),
    ('{"alice": "shared-token-0123456789", "bob": "shared-token-0123456789"}', "share a token"),
    ('{" ": "a-long-enough-token-1"}', "non-blank"),
])
def test_a_bad_tokens_file_names_the_problem_never_a_token(text, says):
    with pytest.raises(SecretError, match=says) as refused:
        parse_tokens(text)
    assert "0123456789" not in str(refused.value) and "short" not in str(refused.value).replace("at least", "")


def test_the_config_refuses_a_literal_token_and_a_bad_path():
    with pytest.raises(ValueError, match="extra"):
        WebSocketConfig(tokens=SecretRef(env="WS_TOKENS"), token="literal-token-0123456789")
    with pytest.raises(ValueError, match="starts with '/'"):
        WebSocketConfig(tokens=SecretRef(env="WS_TOKENS"), path="/notifications/")


# -- through the runtime ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_best_effort_notification_reaches_a_real_subscriber_through_the_runtime(book):
    async with running() as hub:
        alice = await subscribe(hub, "alice", TOKENS["alice"])
        await until(lambda: hub.subscribers("alice") == 1)
        accepted = await send_notification(book, recipient="alice", content={"text": "disk full"},
                                           mode="best_effort", channels=["websocket"])
        lonely = await send_notification(book, recipient="bob", content={"text": "disk full"},
                                         mode="best_effort", channels=["websocket"])
        counts = await deliver_due_notifications(book, {"websocket": WebSocketChannel(hub)}, deadline=2.0)
        assert (counts["delivered"], counts["failed"]) == (1, 1), counts
        row = await get_notification(book, accepted.id)
        assert (row.status, row.delivered_channel) == ("delivered", "websocket")
        [attempt] = await notification_attempts(book, accepted.id)
        assert (attempt.channel, attempt.status, attempt.provider_retries) == ("websocket", "success", 0)
        assert attempt.started_at is not None and attempt.detail.startswith("1 of 1 subscriber sockets took")
        await until(lambda: len(alice.frames) == 1)
        assert alice.frames[0]["notification_id"] == accepted.id and alice.frames[0]["content"] == {"text": "disk full"}
        [none] = await notification_attempts(book, lonely.id)  # bob has no subscriber: nothing was sent
        assert (none.status, none.started_at, none.detail) == ("not_started", None, "no subscriber connected")
        assert (await get_notification(book, lonely.id)).status == "failed"
        for entity_type in ("notification", "channel_attempt"):
            assert (await verify(book, entity_type)).ok
        await alice.close()


# -- the contract ----------------------------------------------------------------------------------------
class TestWebSocketContract(ChannelContract):
    """A WebSocket has no provider refusal and no 429: ``reject`` and ``rate_limited`` cannot happen.

    ``hang_before_admission``: before admission the channel only looks its recipient up in memory, so
    nothing there can hang; the case the scenario stands for — the provider cannot be reached — is a
    recipient whose only would-be subscriber is stuck before its handshake (a TCP connection that never
    sends its request): NOT_STARTED, no effect. ``hang_after_admission``: a subscriber that merely never
    reads does not hang a send (the buffers take a small frame: SUCCESS, see
    ``test_a_small_frame_to_a_subscriber_that_never_reads_still_completes``); what hangs is a frame
    larger than the room left in the hub's write buffer, the socket's send buffer and the subscriber's
    receive window — so the scenario uses a hub with small buffers and a 256 KiB notification. Effects
    are the frames the hub handed to a socket (``hub.handed``)."""

    deadline = 1.0
    unsupported = frozenset({"reject", "rate_limited"})

    @contextlib.asynccontextmanager
    async def scenario(self, name: str) -> AsyncIterator[Scenario]:
        async with running(send_buffer_bytes=SMALL_BUFFERS) as hub:
            subscribers: list[Subscriber] = []
            stuck: socket.socket | None = None
            content: dict = {"title": "disk full", "body": "/var is at 97%"}
            release = None
            chores: list[asyncio.Task] = []
            if name == "accept":
                subscribers.append(await subscribe(hub, "alice", TOKENS["alice"]))
            elif name == "retry_then_accept":  # the first socket's send waits, then it vanishes; the second takes it
                content = BIG
                leaving = await subscribe(hub, "alice", TOKENS["alice"], slow=True)
                subscribers += [leaving, await subscribe(hub, "alice", TOKENS["alice"])]

                async def leave() -> None:
                    await until(lambda: hub.handed >= 1, seconds=30)
                    await asyncio.sleep(0.05)
                    leaving.disconnect()
                chores.append(asyncio.create_task(leave()))
            elif name == "hang_before_admission":
                subscribers.append(await subscribe(hub, "bob", TOKENS["bob"]))
                stuck = socket.create_connection((hub.host, hub.port))  # never sends its handshake
            elif name == "hang_after_admission":
                content = BIG
                paused = await subscribe(hub, "alice", TOKENS["alice"], slow=True)
                subscribers.append(paused)
                release = paused.client.transport.resume_reading
            await until(lambda: sum(hub.subscribers(r) for r in TOKENS) == len(subscribers))
            try:
                yield Scenario(WebSocketChannel(hub, send_seconds=30), effects=lambda: hub.handed,
                               secrets=tuple(TOKENS.values()), recipient="alice", content=content, release=release)
            finally:
                for chore in chores:
                    chore.cancel()
                for subscriber in subscribers:
                    await subscriber.close()
                if stuck is not None:
                    stuck.close()


async def test_a_delivery_with_links_carries_them_in_the_frame():
    links = {"acked": "https://book.example.org/r/ACKtoken", "dismissed": "https://book.example.org/r/DIStoken"}
    linked = Delivery("n" * 26, "alice", {"title": "disk full"}, cycle=1, attempt=2, channel="websocket", links=links)
    async with running() as hub:
        alice = await subscribe(hub, "alice", TOKENS["alice"])
        await until(lambda: hub.subscribers("alice") == 1)
        assert (await WebSocketChannel(hub).send(linked, guard())).outcome is ProviderOutcome.SUCCESS
        assert (await WebSocketChannel(hub).send(delivery(), guard())).outcome is ProviderOutcome.SUCCESS
        await until(lambda: len(alice.frames) == 2)
        assert alice.frames[0]["links"] == links and "links" not in alice.frames[1]
        await alice.close()
