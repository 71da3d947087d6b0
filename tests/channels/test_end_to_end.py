"""The built-in channels end to end, through ``statebook run`` and its settings (issue 15's end-to-end case):

a GUARANTEED notification whose Slack answers 500, whose SMTP server hangs once it took the content and
whose PagerDuty accepts is delivered by PagerDuty, with all three observations in its history in
fallback order (Slack unknown, email unknown, PagerDuty success); the secrets come from the environment
and appear in no row, fact or log line; acknowledging it then makes the daemon acknowledge the PagerDuty
incident, keyed by the notification id (N40-N45).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from http_server import serve
from smtp_server import smtp_server

from statebook.adapters.daemon import run_daemon
from statebook.adapters.db import open_book
from statebook.adapters.settings import load_settings
from statebook.lifecycle import Actor, verify
from statebook.lifecycle.codec import loads
from statebook.lifecycle.schema import metadata
from statebook.outbox.notifications import (
    ack_notification, get_notification, notification_attempts, send_notification,
)
from statebook.outbox.notifications.responses import follow_ups

HOOK = "e2eHOOKsecretT0KEN0123456789"
ROUTING = "e2eROUTINGkey0123456789abcd"
PASSWORD = "e2eSMTPpassw0rd-0123456789"


def settings_file(tmp_path, db: str, slack_url: str, smtp_port: int, pd_url: str):
    toml = tmp_path / "s.toml"
    toml.write_text(
        f'db = "{db}"\n[scheduler]\ntick_seconds = 0.3\n'
        '[notifications]\ndeadline_seconds = 1.5\nlease_seconds = 30\n'
        f'[notifications.slack]\nwebhook_url = {{ env = "E2E_SLACK_HOOK" }}\nmax_tries = 2\n'
        f'[notifications.email]\nhost = "127.0.0.1"\nport = {smtp_port}\nstarttls = false\n'
        f'username = "alerts"\npassword = {{ env = "E2E_SMTP_PASSWORD" }}\nsender = "statebook@example.org"\n'
        'to = "{recipient}@example.org"\nmax_retries = 0\n'
        f'[notifications.pagerduty]\nrouting_key = {{ file = "{tmp_path / "routing.key"}" }}\nurl = "{pd_url}/v2/enqueue"\n'
    )
    (tmp_path / "routing.key").write_text(ROUTING + "\n")
    return toml


async def rows_and_facts(book) -> str:
    import sqlalchemy as sa

    lines = []
    async with book.read() as conn:
        for table in metadata.sorted_tables:
            lines += [repr(dict(r._mapping)) for r in await conn.execute(sa.select(table))]
    return "\n".join(lines)


def test_slack_500_then_smtp_hang_then_pagerduty_delivers_and_the_incident_follows_the_ack(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("E2E_SMTP_PASSWORD", PASSWORD)
    db = f"sqlite:///{tmp_path / 'e2e.db'}"

    async def go():
        async with serve("slack_webhook", "fail_then_accept", failures=99) as slack, \
                smtp_server("hang_after_content", password=PASSWORD) as smtp, \
                serve("pagerduty", "accept") as pd:
            monkeypatch.setenv("E2E_SLACK_HOOK", f"{slack.url}/services/T0/B0/{HOOK}")
            toml = settings_file(tmp_path, db, slack.url, smtp.port, pd.url)
            book = await open_book(db)
            try:
                accepted = await send_notification(book, recipient="oncall", content={"title": "disk full"},
                                                   mode="guaranteed", channels=["pagerduty", "email", "slack"],
                                                   response_timeout=3600)
            finally:
                await book.engine.dispose()
            await run_daemon(load_settings(toml), run_for=5.0)
            book = await open_book(db)
            try:
                row = await get_notification(book, accepted.id)
                attempts = await notification_attempts(book, accepted.id)
                await ack_notification(book, accepted.id, actor=Actor("operator", "alice"))
            finally:
                await book.engine.dispose()
            await run_daemon(load_settings(toml), run_for=1.5)  # delivers the follow:pagerduty dispatch
            book = await open_book(db)
            try:
                follows = await follow_ups(book, accepted.id)
                everything = await rows_and_facts(book)
                clean = all([(await verify(book, t)).ok for t in ("notification", "channel_attempt", "dispatch")])
            finally:
                await book.engine.dispose()
            return accepted.id, row, attempts, follows, everything, clean, slack.effects(), smtp.effects(), pd.received

    with caplog.at_level(logging.DEBUG):
        nid, row, attempts, follows, everything, clean, slack_effects, smtp_effects, pd_received = asyncio.run(go())
    assert (row.status, row.delivered_channel) == ("delivered", "pagerduty"), row
    seen = [(a.channel, a.status, a.position, a.duplicate_risk) for a in attempts]
    assert seen == [("slack", "unknown", 1, False), ("email", "unknown", 2, True), ("pagerduty", "success", 3, True)], seen
    assert all(a.started_at is not None for a in attempts)
    assert slack_effects == 2 and smtp_effects == 1
    trigger, acknowledge = (loads(r.body) for r in pd_received)
    assert (trigger["event_action"], trigger["dedup_key"]) == ("trigger", nid)
    assert (acknowledge["event_action"], acknowledge["dedup_key"]) == ("acknowledge", nid)
    assert [f.status for f in follows] == ["delivered"]
    assert clean and nid in everything and "e2e.db" not in everything
    for secret in (HOOK, ROUTING, PASSWORD):
        assert secret not in everything, "a secret reached a row or a fact"
        assert secret not in caplog.text, "a secret reached a log line"


@pytest.mark.parametrize("section", [
    '[notifications.slack]\nwebhook_url = "https://hooks.slack.com/services/T/B/literal"\n',
    '[notifications.pagerduty]\nrouting_key = { env = "E2E_UNSET_VARIABLE_XYZ" }\n',
    '[notifications.email]\nhost = "h"\nsender = "a@b"\nsmtp_password = "x"\n',
])
def test_a_channel_section_that_cannot_work_is_refused_before_anything_runs(tmp_path, section, monkeypatch):
    """N43: a secret written into the file, a variable that is not set, an unknown key: one-line errors
    at start, naming the section and never a value."""
    from statebook.adapters.errors import ConfigError

    monkeypatch.delenv("E2E_UNSET_VARIABLE_XYZ", raising=False)
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "sqlite:///{tmp_path / "x.db"}"\n{section}')
    with pytest.raises(ConfigError) as caught:
        asyncio.run(run_daemon(load_settings(toml), run_for=0.1))
    message = str(caught.value)
    assert "notifications." in message and "\n" not in message
    assert "literal" not in message


def test_the_daemon_serves_the_websocket_endpoint_and_delivers_to_its_subscriber(tmp_path):
    """N46: `statebook run` serves [notifications.websocket]; a subscriber with its recipient's token gets
    a BEST_EFFORT notification accepted while the daemon runs; one with a wrong token is refused."""
    import json
    import socket

    import websockets
    from websockets.asyncio.client import connect

    token = "alice-websocket-token-0123456789"
    (tmp_path / "tokens.json").write_text(json.dumps({"alice": token}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    db = f"sqlite:///{tmp_path / 'ws.db'}"
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "{db}"\n[scheduler]\ntick_seconds = 0.3\n[notifications]\ndeadline_seconds = 2\n'
                    f'[notifications.websocket]\nport = {port}\ntokens = {{ file = "{tmp_path / "tokens.json"}" }}\n')
    url = f"ws://127.0.0.1:{port}/notifications/alice"

    async def go():
        daemon = asyncio.create_task(run_daemon(load_settings(toml), run_for=6.0))
        for _ in range(100):  # until the endpoint listens
            try:
                ws = await connect(url, additional_headers={"Authorization": f"Bearer {token}"})
                break
            except OSError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the daemon never served the endpoint")
        try:
            await connect(url, additional_headers={"Authorization": "Bearer wrong-token-wrong-token"})
            refused = False
        except websockets.exceptions.InvalidStatus as exc:
            refused = exc.response.status_code == 401
        book = await open_book(db)
        try:
            accepted = await send_notification(book, recipient="alice", content={"title": "deploy done"},
                                               mode="best_effort", channels=["websocket"])
        finally:
            await book.engine.dispose()
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        await ws.close()
        await daemon
        book = await open_book(db)
        try:
            return accepted.id, frame, refused, await notification_attempts(book, accepted.id)
        finally:
            await book.engine.dispose()

    nid, frame, refused, attempts = asyncio.run(go())
    assert (frame["notification_id"], frame["content"]) == (nid, {"title": "deploy done"})
    assert refused
    assert [(a.channel, a.status) for a in attempts] == [("websocket", "success")]
