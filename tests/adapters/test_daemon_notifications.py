"""``statebook run`` delivers notifications through the adapters ``[notifications] channels`` names (N11)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from statebook.adapters.daemon import load_channels, run_daemon
from statebook.adapters.db import open_book
from statebook.adapters.errors import ConfigError
from statebook.adapters.settings import load_settings
from statebook.outbox.notifications import get_notification, list_notifications, notification_attempts, send_notification


@pytest.fixture
def channel_module(tmp_path, monkeypatch):
    (tmp_path / "fake_channels.py").write_text(
        "from statebook.outbox.notifications.scripted import ScriptedChannel\n"
        "slack = ScriptedChannel('slack', ['reject'])\n"
        "def email():\n    return ScriptedChannel('email', ['success'])\n"
        "not_a_channel = 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fake_channels"
    sys.modules.pop("fake_channels", None)


def test_the_daemon_delivers_notifications_through_the_named_channels(tmp_path, channel_module):
    """N11: with channels named in the settings, one `statebook run` delivers notifications beside dispatches:
    Slack rejects, email (built by a factory) accepts; the summary counts them."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "{db}"\n[scheduler]\ntick_seconds = 0.5\n[notifications]\ndeadline_seconds = 2\n'
                    f'channels = {{ slack = "{channel_module}:slack", email = "{channel_module}:email" }}\n')

    async def go():
        book = await open_book(db)
        try:
            accepted = await send_notification(book, recipient="ops", content={"text": "x"}, mode="guaranteed",
                                               channels=["slack", "email"])
        finally:
            await book.engine.dispose()
        summary = await run_daemon(load_settings(toml, environ={}), run_for=2.0)
        book = await open_book(db)
        try:
            return summary, await get_notification(book, accepted.id), await notification_attempts(book, accepted.id)
        finally:
            await book.engine.dispose()

    summary, row, attempts = asyncio.run(go())
    assert row.status == "delivered" and row.delivered_channel == "email"
    assert [(a.channel, a.status) for a in attempts] == [("slack", "rejected"), ("email", "success")]
    assert summary["notifications"] == {"delivered": 1}
    assert summary["verify"]["ok"]


def test_channels_that_cannot_be_loaded_are_one_line_config_errors(tmp_path, channel_module):
    """N11: an unknown channel name, a missing module or attribute, or an object that is not a Channel
    named after its key is refused before anything runs."""
    with pytest.raises(ConfigError, match="cannot load"):
        load_channels({"email": "no_such_module_here:email"})
    with pytest.raises(ConfigError, match="cannot load"):
        load_channels({"email": f"{channel_module}:missing"})
    with pytest.raises(ConfigError, match="needs a Channel"):
        load_channels({"email": f"{channel_module}:not_a_channel"})
    with pytest.raises(ConfigError, match="named 'email'"):
        load_channels({"email": f"{channel_module}:slack"})
    toml = tmp_path / "bad.toml"
    toml.write_text('[notifications]\nchannels = { fax = "x:y" }\n')
    with pytest.raises(ConfigError, match="unknown channel 'fax'"):
        load_settings(toml, environ={})


@pytest.fixture
def callback_module(tmp_path, monkeypatch):
    (tmp_path / "fake_callbacks.py").write_text(
        "import json, pathlib\n"
        "OUT = pathlib.Path(__file__).with_name('events.jsonl')\n"
        "async def page(event):\n    with OUT.open('a') as f:\n        f.write(json.dumps(event) + '\\n')\n"
        "def blocking(event):\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fake_callbacks"
    sys.modules.pop("fake_callbacks", None)


def test_the_daemon_times_out_a_silent_response_and_calls_back(tmp_path, channel_module, callback_module):
    """N35, N36: one `statebook run` delivers the notification, its timeout pass times the silent response
    out at its deadline, and the delivery worker calls the host callback the settings name, once."""
    import json

    from statebook.outbox.notifications import get_response, timeout_callbacks

    db = f"sqlite:///{tmp_path / 'r.db'}"
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "{db}"\n[scheduler]\ntick_seconds = 0.2\n[notifications]\ndeadline_seconds = 2\n'
                    f'channels = {{ email = "{channel_module}:email" }}\n'
                    f'callbacks = {{ page = "{callback_module}:page" }}\n')

    async def go():
        book = await open_book(db)
        try:
            accepted = await send_notification(book, recipient="ops", content={"text": "x"}, mode="guaranteed",
                                               channels=["email"], response_timeout=0.5, timeout_callback="page")
        finally:
            await book.engine.dispose()
        summary = await run_daemon(load_settings(toml, environ={}), run_for=3.0)
        book = await open_book(db)
        try:
            return summary, await get_response(book, accepted.id), await timeout_callbacks(book, accepted.id), accepted.id
        finally:
            await book.engine.dispose()

    summary, response, callbacks, nid = asyncio.run(go())
    assert response.status == "timed_out"
    assert [c.status for c in callbacks] == ["delivered"]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["notification_id"] for e in events] == [nid]
    assert summary["verify"]["ok"]


def test_callbacks_that_cannot_be_loaded_or_block_are_config_errors(callback_module):
    """N38: a missing callback, or one that is not an async def, is refused before anything runs."""
    from statebook.adapters.daemon import load_callbacks

    with pytest.raises(ConfigError, match="cannot load"):
        load_callbacks({"page": "no_such_module_here:page"})
    with pytest.raises(ConfigError, match="async def"):
        load_callbacks({"page": f"{callback_module}:blocking"})
def test_the_daemon_never_removes_notifications(tmp_path, channel_module):
    """N30: no purge at start-up or by a worker: `statebook run` (dispatch retention enabled) over
    notifications settled a year ago leaves every notification, attempt, claim and their facts."""
    import sqlalchemy as sa

    from statebook.lifecycle import FakeClock
    from statebook.lifecycle.facts import facts_table
    from statebook.outbox.notifications import deliver_due_notifications
    from statebook.outbox.notifications.schema import notification_retention_runs
    from statebook.outbox.notifications.scripted import ScriptedChannel

    db = f"sqlite:///{tmp_path / 'd.db'}"
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "{db}"\n[scheduler]\ntick_seconds = 0.5\n[retention]\nenabled = true\ndelivered_days = 1\n'
                    f'[notifications]\ndeadline_seconds = 2\nchannels = {{ email = "{channel_module}:email" }}\n')
    kinds = ("notification", "channel_attempt", "dedup_claim")

    async def snapshot(book):
        async with book.read() as conn:
            facts = (await conn.execute(sa.select(sa.func.count()).select_from(facts_table).where(
                facts_table.c.entity_type.in_(kinds)))).scalar_one()
            runs = (await conn.execute(sa.select(sa.func.count()).select_from(notification_retention_runs))).scalar_one()
        rows = [r.id for r in await list_notifications(book, limit=100)]
        return facts, runs, sorted(rows)

    async def go():
        book = await open_book(db, clock=FakeClock(1_600_000_000.0))  # settled years before the daemon's clock
        try:
            for i in range(3):
                await send_notification(book, recipient="ops", content={"text": str(i)}, mode="guaranteed",
                                        channels=["email"], obligation_key=f"k{i}")
            await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["success"])}, deadline=5)
            seeded = await snapshot(book)
        finally:
            await book.engine.dispose()
        summary = await run_daemon(load_settings(toml, environ={}), run_for=1.5)
        book = await open_book(db)
        try:
            return seeded, await snapshot(book), summary
        finally:
            await book.engine.dispose()

    seeded, after, summary = asyncio.run(go())
    assert seeded[1] == 0 and len(seeded[2]) == 3
    assert after == seeded and summary["verify"]["ok"]
