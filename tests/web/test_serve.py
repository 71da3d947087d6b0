"""Serving the console: where it listens (specs/console.md W6) and mounting it in another ASGI app."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from statebook.adapters.errors import ConfigError
from statebook.adapters.settings import Settings
from statebook.adapters.web.serve import check_bind

from .conftest import web_settings


def test_a_non_loopback_address_without_sign_in_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a loopback address"):
        check_bind("0.0.0.0", Settings())
    check_bind("127.0.0.1", Settings())
    check_bind("::1", Settings())
    check_bind("0.0.0.0", web_settings())  # users configured: people sign in


def test_statebook_web_serves_and_stops(tmp_path: Path) -> None:
    """The command prints its address, serves pages, and ends cleanly on SIGTERM."""
    cli = Path(sys.executable).with_name("statebook")
    proc = subprocess.Popen([str(cli), "--db", f"sqlite:///{tmp_path / 'c.db'}", "web", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "NO_COLOR": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
        assert found, line
        with urllib.request.urlopen(found.group(1) + "/healthz", timeout=10) as answer:
            assert answer.read() == b"ok"
        refused = subprocess.run([str(cli), "web", "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                                 text=True, cwd=tmp_path, timeout=60)
        assert refused.returncode == 2 and "not a loopback address" in refused.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


async def test_the_console_mounted_under_a_path_links_under_it(book: Any) -> None:
    from statebook.adapters.web import create_app

    outer = Starlette(routes=[Mount("/ops", create_app(book, web_settings()))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=outer), base_url="http://t") as client:
        page = await client.get("/ops/sign-in")
        assert page.status_code == 200
        assert 'href="/ops/static/console.css"' in page.text and 'action="/ops/sign-in"' in page.text
        assert (await client.get("/ops/static/htmx.min.js")).status_code == 200


async def test_the_console_opens_its_book_with_the_chain_key(tmp_path: Path, monkeypatch: Any) -> None:
    """The console's actions write facts: on a keyed database they must be keyed like the CLI's writes."""
    from statebook.adapters.cli.web import open_console_book

    monkeypatch.setenv("TEST_CHAIN_KEY", "c" * 32)
    settings = Settings(db=f"sqlite:///{tmp_path / 'k.db'}", audit={"chain_key": {"env": "TEST_CHAIN_KEY"}})
    book = await open_console_book(settings)
    try:
        assert book.chain_key is not None and book.chain_key == settings.audit.key()
    finally:
        await book.engine.dispose()
    plain = await open_console_book(Settings(db=f"sqlite:///{tmp_path / 'p.db'}"))
    try:
        assert plain.chain_key is None
    finally:
        await plain.engine.dispose()
