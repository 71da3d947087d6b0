"""The email channel against real aiosmtpd servers on 127.0.0.1 (issue 15): the contract, each fault
the servers inject and the outcome it produces, TLS and AUTH, and one delivery through the runtime."""

from __future__ import annotations

import contextlib
import email
import socket
import time
from collections.abc import AsyncIterator
from email.policy import default as default_policy
from pathlib import Path

import pytest

from smtp_server import self_signed, server_context, silent_server, smtp_server
from statebook.adapters.channels.contract import ChannelContract, RecordingGuard, Scenario
from statebook.adapters.channels.email import EmailChannel, EmailConfig
from statebook.adapters.channels.secrets import SecretRef
from statebook.outbox.notifications import Delivery, LeaseLost, Mode, ProviderOutcome, notification_attempts, send_notification
from statebook.outbox.notifications.calls import run_attempt
from statebook.outbox.notifications.delivery import claim_due, finalize

PASSWORD = "pa55-w0rd-SMTP-test-only"
USER = "alerts"
DEADLINE = 1.0


def channel(port: int, monkeypatch: pytest.MonkeyPatch | None = None, *, auth: bool = False, **settings) -> EmailChannel:
    """An email channel for a test server on 127.0.0.1:port (no STARTTLS unless asked)."""
    values = {"host": "127.0.0.1", "port": port, "starttls": False, "sender": "statebook@example.org",
              "to": "{recipient}@example.org", "local_hostname": "client.test", **settings}
    if auth:
        assert monkeypatch is not None
        monkeypatch.setenv("TEST_SMTP_PASSWORD", PASSWORD)
        values |= {"username": USER, "password": SecretRef(env="TEST_SMTP_PASSWORD")}
    return EmailConfig(**values).build()


def delivery(recipient: str = "alice", content: dict | None = None) -> Delivery:
    return Delivery("n" * 26, recipient, content or {"title": "disk full", "body": "/var is at 97%"}, cycle=1,
                    attempt=1, channel="email")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestEmailContract(ChannelContract):
    """The channel contract on aiosmtpd servers (SMTP has no rate-limit reply: a 4xx is transient)."""

    deadline = DEADLINE
    unsupported = frozenset({"rate_limited"})

    @contextlib.asynccontextmanager
    async def scenario(self, name: str) -> AsyncIterator[Scenario]:
        if name == "hang_before_admission":
            async with silent_server() as port:
                yield Scenario(self._channel(port), effects=lambda: 0, secrets=(PASSWORD,))
            return
        behaviour = {"accept": "accept", "reject": "reject_recipient", "retry_then_accept": "transient_once",
                     "hang_after_admission": "hang_after_content"}[name]
        async with smtp_server(behaviour, password=PASSWORD, username=USER) as server:
            yield Scenario(self._channel(server.port), effects=server.effects, secrets=(PASSWORD,),
                           release=server.release)

    def _channel(self, port: int) -> EmailChannel:
        with pytest.MonkeyPatch.context() as mp:
            return channel(port, mp, auth=True)


# -- faults, one by one -------------------------------------------------------------------------------
async def test_accept_delivers_the_message_with_subject_body_and_a_stable_message_id():
    async with smtp_server("accept") as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await channel(server.port).send(delivery(), guard)
        assert observed.outcome is ProviderOutcome.SUCCESS and observed.detail.startswith("250"), observed
        assert guard.events == [("guard", 0), ("admit", 0)]  # the lease check before connecting, then admission
        [raw] = server.messages
        msg = email.message_from_bytes(raw, policy=default_policy)
        assert (msg["Subject"], msg["To"], msg["From"]) == ("disk full", "alice@example.org", "statebook@example.org")
        assert msg["Message-ID"] == f"<{'n' * 26}.1@example.org>"
        assert msg.get_content().strip() == "/var is at 97%"
        assert server.envelopes == [("statebook@example.org", ["alice@example.org"])]


async def test_a_refused_recipient_is_rejected_with_no_content_sent_and_admitted_after_the_refusal():
    async with smtp_server("reject_recipient") as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await channel(server.port).send(delivery(), guard)
        assert observed.outcome is ProviderOutcome.REJECTED and observed.detail.startswith("RCPT TO: 550"), observed
        assert guard.admitted and guard.events == [("guard", 0), ("admit", 0)]
        assert server.messages == [] and server.rcpt_calls == 1  # a refusal is not retried


async def test_refused_content_is_rejected():
    async with smtp_server("reject_content") as server:
        observed = await channel(server.port).send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.REJECTED and observed.detail.startswith("DATA: 554"), observed
        assert len(server.messages) == 1


@pytest.mark.serial  # a deadline kept within 0.2 s: measured with the machine to itself
async def test_a_server_that_never_greets_is_not_started_within_the_deadline():
    async with silent_server() as port:
        guard = RecordingGuard(lambda: 0, DEADLINE)
        started = time.monotonic()
        observed = await channel(port).send(delivery(), guard)
        took = time.monotonic() - started
        assert observed.outcome is ProviderOutcome.NOT_STARTED, observed
        assert not guard.admitted and took <= DEADLINE + 0.2, (took, observed)


@pytest.mark.serial  # a deadline kept within 0.2 s: measured with the machine to itself
async def test_a_hang_after_the_content_is_unknown_and_the_late_reply_changes_nothing():
    async with smtp_server("hang_after_content") as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        started = time.monotonic()
        observed = await channel(server.port).send(delivery(), guard)
        assert observed.outcome is ProviderOutcome.UNKNOWN and "DATA" in observed.detail, observed
        assert guard.admitted and len(server.messages) == 1 and time.monotonic() - started <= DEADLINE + 0.2
        server.release()


async def test_a_4xx_after_the_content_is_retried_behind_a_lease_check():
    async with smtp_server("transient_once") as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await channel(server.port).send(delivery(), guard)
        assert (observed.outcome, observed.retries) == (ProviderOutcome.SUCCESS, 1), observed
        # after the admission the retry has ONE lease check, right before the content: the runtime records
        # a retry there (N10b), so a second check before reconnecting would count the one retry twice
        assert guard.events == [("guard", 0), ("admit", 0), ("guard", 1)]
        assert len(server.messages) == 2


async def test_a_greylisted_recipient_is_retried_before_admission():
    async with smtp_server("greylist_once") as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await channel(server.port).send(delivery(), guard)
        assert (observed.outcome, observed.retries) == (ProviderOutcome.SUCCESS, 1), observed
        assert guard.events == [("guard", 0), ("guard", 0), ("admit", 0)]
        assert len(server.messages) == 1 and server.rcpt_calls == 2


async def test_a_transient_failure_that_outlasts_the_deadline_after_the_content_is_unknown():
    async with smtp_server("transient_always") as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await channel(server.port).send(delivery(), guard)
        assert observed.outcome is ProviderOutcome.UNKNOWN and "451" in observed.detail, observed
        assert observed.retries >= 1 and len(server.messages) == observed.retries + 1


async def test_a_refused_connection_is_retried_then_not_started():
    port = free_port()
    guard = RecordingGuard(lambda: 0, DEADLINE)
    observed = await channel(port).send(delivery(), guard)
    assert observed.outcome is ProviderOutcome.NOT_STARTED and "connect" in observed.detail, observed
    assert observed.retries >= 1 and not guard.admitted
    assert all(kind == "guard" for kind, _ in guard.events) and len(guard.events) == observed.retries + 1


async def test_a_lost_lease_before_connecting_makes_no_connection():
    async with smtp_server("accept") as server:
        guard = RecordingGuard(server.effects, DEADLINE, lose_at=1)
        with pytest.raises(LeaseLost):
            await channel(server.port).send(delivery(), guard)
        assert server.rcpt_calls == 0 and server.messages == []


async def test_no_token_at_admission_sends_no_content():
    async with smtp_server("accept") as server:
        from statebook.outbox.notifications import NoToken

        guard = RecordingGuard(server.effects, DEADLINE, no_token=True)
        with pytest.raises(NoToken):
            await channel(server.port).send(delivery(), guard)
        assert server.messages == []


async def test_an_unmapped_recipient_is_not_started_without_contacting_the_server():
    async with smtp_server("accept") as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        chan = channel(server.port, to={"bob": "bob@example.org"})
        observed = await chan.send(delivery("alice"), guard)
        assert observed.outcome is ProviderOutcome.NOT_STARTED and guard.events == [], observed


# -- AUTH and TLS -------------------------------------------------------------------------------------
async def test_login_with_the_right_password_delivers(monkeypatch):
    async with smtp_server("accept", password=PASSWORD, username=USER) as server:
        observed = await channel(server.port, monkeypatch, auth=True).send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.SUCCESS, observed
        assert server.logins == [USER] and len(server.messages) == 1


async def test_a_refused_login_is_not_started_and_shows_no_password(monkeypatch):
    async with smtp_server("accept", password="another-password", username=USER) as server:
        chan = channel(server.port, monkeypatch, auth=True)
        observed = await chan.send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.NOT_STARTED and observed.detail.startswith("login: 535"), observed
        assert PASSWORD not in observed.detail and PASSWORD not in repr(chan) and "****" in repr(chan)
        assert server.messages == []


async def test_a_server_echoing_the_password_has_it_scrubbed_from_the_detail(monkeypatch):
    async with smtp_server("accept", password="another-password", username=USER, echo_credentials=True) as server:
        observed = await channel(server.port, monkeypatch, auth=True).send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.NOT_STARTED and "bad password ****" in observed.detail, observed
        assert PASSWORD not in observed.detail


async def test_without_login_a_server_requiring_auth_rejects_the_sender():
    async with smtp_server("accept", password=PASSWORD, username=USER) as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await channel(server.port).send(delivery(), guard)
        assert observed.outcome is ProviderOutcome.REJECTED and observed.detail.startswith("MAIL FROM: 530"), observed
        assert server.messages == []


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("no openssl command to make a test certificate (and no cryptography package)")
    return made


async def test_starttls_then_login_delivers_over_tls(certificate, monkeypatch):
    cert, key = certificate
    async with smtp_server("accept", password=PASSWORD, username=USER, tls=server_context(cert, key)) as server:
        chan = channel(server.port, monkeypatch, auth=True, starttls=True, ca_file=cert)
        observed = await chan.send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.SUCCESS, observed
        assert server.logins == [USER]  # the server allows AUTH only after STARTTLS


async def test_starttls_auto_upgrades_when_offered(certificate, monkeypatch):
    cert, key = certificate
    async with smtp_server("accept", password=PASSWORD, username=USER, tls=server_context(cert, key)) as server:
        chan = channel(server.port, monkeypatch, auth=True, starttls="auto", ca_file=cert)
        observed = await chan.send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.SUCCESS and server.logins == [USER], observed


async def test_an_untrusted_certificate_is_not_started(certificate):
    cert, key = certificate
    async with smtp_server("accept", tls=server_context(cert, key)) as server:
        guard = RecordingGuard(server.effects, DEADLINE)
        observed = await channel(server.port, starttls=True).send(delivery(), guard)  # system CAs only
        assert observed.outcome is ProviderOutcome.NOT_STARTED and "certificate" in observed.detail, observed
        assert observed.retries == 0 and server.messages == []


async def test_required_starttls_on_a_server_without_it_is_not_started():
    async with smtp_server("accept") as server:
        observed = await channel(server.port, starttls=True).send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.NOT_STARTED and "STARTTLS" in observed.detail, observed


async def test_implicit_tls_delivers(certificate, monkeypatch):
    cert, key = certificate
    async with smtp_server("accept", password=PASSWORD, username=USER, implicit_tls=server_context(cert, key)) as server:
        chan = channel(server.port, monkeypatch, auth=True, tls=True, ca_file=cert)
        observed = await chan.send(delivery(), RecordingGuard(server.effects, DEADLINE))
        assert observed.outcome is ProviderOutcome.SUCCESS and server.logins == [USER], observed


# -- settings -----------------------------------------------------------------------------------------
def test_settings_refuse_what_cannot_work():
    base = {"host": "smtp.example.org", "sender": "a@example.org"}
    for bad, says in [({"to": "{user}@x.org"}, "{recipient}"), ({"tls": True, "starttls": True}, "exclude"),
                      ({"password": {"env": "X"}}, "username"), ({"sender": "not an address"}, "sender"),
                      ({"username": "u", "password": "literal"}, "password"),
                      ({"to": "{recipient!r}@x.org"}, "{recipient}"), ({"to": "{recipient:>99999999999}"}, "{recipient}")]:
        with pytest.raises(ValueError, match=says):
            EmailConfig(**(base | bad))
    assert EmailConfig(**base, tls=True).build()._port() == 465
    assert EmailConfig(**base, starttls=True).build()._port() == 587


def test_a_ca_file_that_cannot_be_read_is_refused_when_the_channel_is_built(tmp_path):
    """Like a secret (N43): an unreadable file is an error at start, not an exception out of every send."""
    base = {"host": "smtp.example.org", "sender": "a@example.org", "local_hostname": "c", "starttls": True}
    for ca_file in (tmp_path / "missing.pem", tmp_path):
        with pytest.raises(ValueError, match="ca_file"):
            EmailConfig(**base, ca_file=ca_file).build()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="ca_file"):
        EmailConfig(**base, ca_file=tmp_path / "junk.pem").build()


def test_a_content_header_cannot_inject_headers():
    chan = EmailConfig(host="h", sender="a@example.org", local_hostname="c").build()
    raw = chan.message(delivery(content={"title": "x\r\nBcc: evil@example.org", "body": "b"}), "alice@example.org")
    msg = email.message_from_bytes(raw, policy=default_policy)
    assert msg["Bcc"] is None and msg["Subject"] == "x Bcc: evil@example.org"


# -- through the runtime ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_notification_is_delivered_by_email_through_the_runtime(book, monkeypatch):
    async with smtp_server("transient_once", password=PASSWORD, username=USER) as server:
        chan = channel(server.port, monkeypatch, auth=True)
        accepted = await send_notification(book, recipient="alice", content={"title": "disk full", "body": "97%"},
                                           mode=Mode.GUARANTEED, channels=["email"])
        [lease], _ = await claim_due(book, now=book.clock.now(), limit=1)
        result = await run_attempt(book, lease, {"email": chan}, deadline=2.0)
        assert await finalize(book, lease, result, now=book.clock.now()) == "delivered"
        [attempt] = await notification_attempts(book, accepted.id)
        assert (attempt.channel, attempt.status, attempt.provider_retries) == ("email", "success", 1)
        assert attempt.started_at is not None and attempt.detail.startswith("250")
        assert len(server.messages) == 2 and PASSWORD not in repr(attempt)


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_refused_recipient_through_the_runtime_is_a_rejected_attempt(book):
    async with smtp_server("reject_recipient") as server:
        accepted = await send_notification(book, recipient="alice", content={"title": "t", "body": "b"},
                                           mode=Mode.GUARANTEED, channels=["email"])
        [lease], _ = await claim_due(book, now=book.clock.now(), limit=1)
        result = await run_attempt(book, lease, {"email": channel(server.port)}, deadline=2.0)
        assert result.outcome == "retry"
        [attempt] = await notification_attempts(book, accepted.id)
        assert (attempt.status, attempt.started_at is not None) == ("rejected", True), attempt
        assert attempt.detail.startswith("RCPT TO: 550") and server.messages == []


async def test_a_delivery_with_links_ends_its_body_with_one_line_per_link():
    links = {"acked": "https://book.example.org/r/ACKtoken", "dismissed": "https://book.example.org/r/DIStoken"}
    linked = Delivery("n" * 26, "alice", {"title": "disk full", "body": "/var is at 97%"}, cycle=1, attempt=1,
                      channel="email", links=links)
    async with smtp_server("accept") as server:
        observed = await channel(server.port).send(linked, RecordingGuard(server.effects, DEADLINE))
        plain = await channel(server.port).send(delivery(), RecordingGuard(server.effects, DEADLINE))
    assert (observed.outcome, plain.outcome) == (ProviderOutcome.SUCCESS, ProviderOutcome.SUCCESS)
    sent, unlinked = (email.message_from_bytes(raw, policy=default_policy).get_content() for raw in server.messages)
    assert sent.strip().splitlines() == ["/var is at 97%", "", f"Acknowledge: {links['acked']}",
                                         f"Dismiss: {links['dismissed']}"]
    assert unlinked.strip() == "/var is at 97%"
