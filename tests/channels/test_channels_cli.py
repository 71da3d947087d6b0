"""``statebook channels ls`` and ``statebook channels test`` against a real local webhook receiver (N43, N44)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import pytest
from http_server import serve
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import open_book
from statebook.outbox.notifications import ensure_bucket

SIGNING = "cliSIGNINGsecret0123456789abcdef"
PATH_TOKEN = "cliPATHtoken0123456789"


@contextlib.contextmanager
def receiver(behaviour: str):
    """An HTTP receiver on its own loop in a thread (the CLI runs its own event loop)."""
    ready, stop, box = threading.Event(), None, {}

    def main() -> None:
        async def go() -> None:
            nonlocal stop
            stop = asyncio.Event()
            async with serve("webhook", behaviour) as server:
                box["server"] = server
                ready.set()
                await stop.wait()
        loop = asyncio.new_event_loop()
        box["loop"] = loop
        loop.run_until_complete(go())
        loop.close()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield box["server"]
    finally:
        box["loop"].call_soon_threadsafe(stop.set)
        thread.join(10)


def settings(tmp_path, url: str) -> str:
    (tmp_path / "signing.key").write_text(SIGNING)
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "sqlite:///{tmp_path / "c.db"}"\n'
                    '[notifications]\norder = ["webhook", "slack"]\n'
                    'rate_limits = { webhook = { capacity = 4, refill_per_second = 0.5 } }\n'
                    f'[notifications.webhook]\nurl = {{ env = "CLI_HOOK_URL" }}\nsecret = {{ file = "{tmp_path / "signing.key"}" }}\n'
                    '[notifications.slack]\nbot_token = { env = "CLI_UNSET_SLACK_TOKEN" }\nchannel = "#ops"\n')
    return str(toml)


def test_ls_shows_each_channel_its_order_guards_and_bucket_and_never_a_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("CLI_HOOK_URL", f"http://127.0.0.1:9/hook/{PATH_TOKEN}")
    monkeypatch.delenv("CLI_UNSET_SLACK_TOKEN", raising=False)
    toml = settings(tmp_path, "")

    async def seed() -> None:
        book = await open_book(f"sqlite:///{tmp_path / 'c.db'}")
        try:
            await ensure_bucket(book, "webhook", "all", capacity=4, refill_per_second=0.5)
        finally:
            await book.engine.dispose()

    asyncio.run(seed())
    result = CliRunner().invoke(app, ["--db", f"sqlite:///{tmp_path / 'c.db'}", "channels", "ls", "--config", toml, "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["channel"]: r for r in json.loads(result.output)["channels"]}
    hook = rows["webhook"]
    assert (hook["configured"], hook["persistent"], hook["position"]) == (True, True, 1)
    assert (hook["reports_admission"], hook["guards_provider_attempts"]) == (True, True)
    assert hook["bucket"]["tokens"] == 4.0 and hook["bucket"]["capacity"] == 4.0
    assert hook["settings"]["url"] == "env:CLI_HOOK_URL (set)"
    assert rows["slack"]["configured"] and "CLI_UNSET_SLACK_TOKEN" in rows["slack"]["error"]
    assert (rows["websocket"]["configured"], rows["websocket"]["persistent"]) == (False, False)
    table = CliRunner().invoke(app, ["--db", f"sqlite:///{tmp_path / 'c.db'}", "channels", "ls", "--config", toml])
    assert table.exit_code == 0 and "webhook" in table.output
    for output in (result.output, table.output):
        assert SIGNING not in output and PATH_TOKEN not in output


@pytest.mark.parametrize(("behaviour", "code", "outcome"), [("accept", 0, "success"), ("reject", 1, "rejected")])
def test_test_makes_one_real_signed_send_and_prints_the_observation(tmp_path, monkeypatch, behaviour, code, outcome):
    with receiver(behaviour) as server:
        monkeypatch.setenv("CLI_HOOK_URL", f"{server.url}/hook/{PATH_TOKEN}")
        toml = settings(tmp_path, server.url)
        result = CliRunner().invoke(app, ["channels", "test", "webhook", "--to", "oncall", "--text", "hello",
                                          "--config", toml, "--json"])
        received = list(server.received)
    assert result.exit_code == code, result.output
    observed = json.loads(result.output)
    assert (observed["outcome"], observed["admitted"], observed["recipient"]) == (outcome, True, "oncall")
    [request] = received
    assert json.loads(request.body)["recipient"] == "oncall"
    assert request.headers["X-Statebook-Signature"].startswith("v1=")
    assert SIGNING not in result.output and PATH_TOKEN not in result.output
    assert not (tmp_path / "c.db").exists(), "a test send writes nothing to the database"


def test_test_refuses_what_it_cannot_send(tmp_path, monkeypatch):
    monkeypatch.delenv("CLI_UNSET_SLACK_TOKEN", raising=False)
    monkeypatch.setenv("CLI_HOOK_URL", "http://127.0.0.1:9/hook")
    toml = settings(tmp_path, "")
    for args, fragment in ((["sms"], "unknown channel 'sms'"), (["email"], "not configured"),
                           (["websocket"], "served by `statebook run`"), (["slack"], "CLI_UNSET_SLACK_TOKEN")):
        result = CliRunner().invoke(app, ["channels", "test", *args, "--to", "x", "--config", toml])
        assert result.exit_code == 2, (args, result.output)
        assert fragment in " ".join(result.output.split()), (args, result.output)
