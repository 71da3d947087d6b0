"""The Apprise channel against a real HTTP server on 127.0.0.1 (Apprise's ``json://`` URL posts the
notification as JSON to it), including servers that fail, refuse, hang or never answer."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

pytest.importorskip("apprise")

from smtp_server import silent_server  # noqa: E402  (a TCP server that never answers)
from statebook.adapters.channels.apprise import AppriseChannel, AppriseConfig, AppriseUnavailable  # noqa: E402
from statebook.adapters.channels.contract import ChannelContract, RecordingGuard, Scenario  # noqa: E402
from statebook.adapters.channels.secrets import SecretRef  # noqa: E402
from statebook.outbox.notifications import Delivery, Mode, ProviderOutcome, notification_attempts, send_notification  # noqa: E402
from statebook.outbox.notifications.calls import attempt_channel, run_attempt  # noqa: E402
from statebook.outbox.notifications.delivery import claim_due, finalize  # noqa: E402

SECRET = "hunter2-apprise-token"
DEADLINE = 1.0


@dataclass
class HookServer:
    """An aiohttp server at ``/hook`` answering ``status``; ``hang``: it reads the body, then waits for
    :meth:`release`. ``received``: every body it read (the effects)."""

    status: int = 200
    hang: bool = False
    port: int = 0
    received: list[dict] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self.released.set()

    def effects(self) -> int:
        return len(self.received)

    def url(self, password: str = SECRET) -> str:
        return f"json://statebook:{password}@127.0.0.1:{self.port}/hook"

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        self.authorizations.append(request.headers.get("Authorization"))
        if self.hang:
            await self.released.wait()
        return web.json_response({"ok": self.status < 400}, status=self.status)


@contextlib.asynccontextmanager
async def hook_server(status: int = 200, *, hang: bool = False) -> AsyncIterator[HookServer]:
    server = HookServer(status, hang)
    app = web.Application()
    app.router.add_post("/hook", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server
    finally:
        server.release()
        await runner.cleanup()


def channel(*urls: str, monkeypatch: pytest.MonkeyPatch | None = None) -> AppriseChannel:
    with pytest.MonkeyPatch.context() as mp:
        (monkeypatch or mp).setenv("TEST_APPRISE_URLS", " ".join(urls))
        return AppriseConfig(urls=SecretRef(env="TEST_APPRISE_URLS")).build()


def delivery() -> Delivery:
    return Delivery("n" * 26, "alice", {"title": "disk full", "body": "/var is at 97%"}, 1, 1, "apprise")


async def entered(guard: RecordingGuard, chan: AppriseChannel):
    """The call as the runtime makes it for a channel that does not report its admission."""
    await guard.admit()
    return await chan.send(delivery(), guard)


class TestAppriseContract(ChannelContract):
    """Apprise answers true or false: no refusal, no rate limit, and no visible retry of its own."""

    deadline = DEADLINE
    unsupported = frozenset({"reject", "retry_then_accept", "rate_limited"})

    @contextlib.asynccontextmanager
    async def scenario(self, name: str) -> AsyncIterator[Scenario]:
        if name == "hang_before_admission":
            async with silent_server() as port:
                yield Scenario(channel(f"json://statebook:{SECRET}@127.0.0.1:{port}/hook"), effects=lambda: 0,
                               secrets=(SECRET,))
            return
        async with hook_server(hang=name == "hang_after_admission") as server:
            yield Scenario(channel(server.url()), effects=server.effects, secrets=(SECRET,), release=server.release)


async def test_accept_posts_title_and_body_with_the_urls_credentials():
    async with hook_server() as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await entered(guard, channel(server.url()))
        assert observed.outcome is ProviderOutcome.SUCCESS, observed
        [body] = server.received
        assert (body["title"], body["message"]) == ("disk full", "/var is at 97%")
        assert server.authorizations == ["Basic " + base64.b64encode(f"statebook:{SECRET}".encode()).decode()]
        assert guard.events == [("admit", 0)]  # its entry only: it does not guard provider attempts


@pytest.mark.parametrize("status", [500, 400, 429])
async def test_a_failing_or_refusing_server_is_unknown(status):
    async with hook_server(status) as server:
        observed = await entered(RecordingGuard(server.effects, DEADLINE), channel(server.url()))
        assert observed.outcome is ProviderOutcome.UNKNOWN and "cannot tell" in observed.detail, observed
        assert server.effects() >= 1 and SECRET not in observed.detail


@pytest.mark.serial  # a deadline kept within 0.3 s: measured with the machine to itself
async def test_a_server_that_never_answers_is_unknown_within_the_deadline():
    async with silent_server() as port:
        started = time.monotonic()
        observed = await entered(RecordingGuard(lambda: 0, DEADLINE), channel(f"json://u:{SECRET}@127.0.0.1:{port}/hook"))
        assert observed.outcome is ProviderOutcome.UNKNOWN and time.monotonic() - started <= DEADLINE + 0.3, observed


async def test_a_hang_after_the_body_is_unknown_and_the_late_answer_changes_nothing():
    async with hook_server(hang=True) as server:
        observed = await entered(RecordingGuard(server.effects, DEADLINE), channel(server.url()))
        assert observed.outcome is ProviderOutcome.UNKNOWN and server.effects() == 1, observed
        server.release()


async def test_one_good_url_and_one_failing_url_is_unknown():
    async with hook_server() as good, hook_server(500) as bad:
        observed = await entered(RecordingGuard(good.effects, DEADLINE), channel(good.url(), bad.url()))
        assert observed.outcome is ProviderOutcome.UNKNOWN and good.effects() == bad.effects() == 1, observed


def test_the_repr_names_schemes_not_urls_and_bad_urls_are_refused_without_showing_them():
    chan = channel(f"json://u:{SECRET}@127.0.0.1:9/hook", f"form://u:{SECRET}@127.0.0.1:9/x")
    assert repr(chan) == "AppriseChannel(2 urls: form, json)" and SECRET not in str(chan)
    with pytest.raises(AppriseUnavailable) as caught:
        channel(f"nosuchscheme://{SECRET}@host")
    assert SECRET not in str(caught.value) and "URL 1 of 1" in str(caught.value)


@pytest.mark.parametrize("url", [f"u:{SECRET}@example.org", f"{SECRET}", f"json:{SECRET}@host/x", f"{SECRET}://host"])
def test_a_url_without_a_readable_scheme_is_refused_without_showing_any_of_it(url):
    """N43: a URL pasted without its scheme (or with a token where the scheme goes) shows no part of itself."""
    with pytest.raises(AppriseUnavailable) as caught:
        channel(url)
    assert SECRET[:6] not in str(caught.value) and "URL 1 of 1" in str(caught.value), str(caught.value)


def test_a_missing_extra_is_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_apprise(name, *args, **kwargs):
        if name == "apprise":
            raise ImportError("No module named 'apprise'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_apprise)
    with pytest.raises(AppriseUnavailable, match=r"statebook\[apprise\]"):
        AppriseChannel(["json://127.0.0.1/hook"])


async def test_apprise_log_lines_never_show_the_urls_secret(caplog):
    async with silent_server() as port:
        caplog.set_level(logging.DEBUG)
        url = f"json://u:{SECRET}@127.0.0.1:{port}/hook"
        await entered(RecordingGuard(lambda: 0, 0.3), channel(url))
        logging.getLogger("apprise").warning("could not notify %s", url)  # as a plugin reporting its URL would
        assert "could not notify" in caplog.text
        assert SECRET not in caplog.text


# -- through the runtime ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_notification_is_delivered_by_apprise_through_the_runtime(book):
    async with hook_server() as server:
        accepted = await send_notification(book, recipient="alice", content={"title": "disk full", "body": "97%"},
                                           mode=Mode.GUARANTEED, channels=["apprise"])
        [lease], _ = await claim_due(book, now=book.clock.now(), limit=1)
        result = await run_attempt(book, lease, {"apprise": channel(server.url())}, deadline=2.0)
        assert await finalize(book, lease, result, now=book.clock.now()) == "delivered"
        [attempt] = await notification_attempts(book, accepted.id)
        assert (attempt.channel, attempt.status, attempt.started_at is not None) == ("apprise", "success", True)
        assert server.received[0]["message"] == "97%" and SECRET not in repr(attempt)


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_failing_apprise_server_through_the_runtime_is_an_unknown_attempt(book):
    async with hook_server(500) as server:
        accepted = await send_notification(book, recipient="alice", content={"body": "97%"}, mode=Mode.GUARANTEED,
                                           channels=["apprise"])
        [lease], _ = await claim_due(book, now=book.clock.now(), limit=1)
        recorded = await attempt_channel(book, lease, channel(server.url()), deadline=2.0)
        assert recorded.observation.outcome is ProviderOutcome.UNKNOWN
        [attempt] = await notification_attempts(book, accepted.id)
        assert (attempt.status, attempt.started_at is not None) == ("unknown", True), attempt
        assert server.effects() >= 1 and SECRET not in repr(attempt)


async def test_a_delivery_with_links_ends_its_message_with_one_line_per_link():
    links = {"acked": "https://book.example.org/r/ACKtoken", "dismissed": "https://book.example.org/r/DIStoken"}
    linked = Delivery("n" * 26, "alice", {"title": "disk full", "body": "/var is at 97%"}, 1, 1, "apprise", links)
    async with hook_server() as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        await guard.admit()
        assert (await channel(server.url()).send(linked, guard)).outcome is ProviderOutcome.SUCCESS
        [body] = server.received
    assert body["message"].splitlines() == ["/var is at 97%", "", f"Acknowledge: {links['acked']}",
                                            f"Dismiss: {links['dismissed']}"]
