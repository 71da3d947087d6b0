"""The console in a real browser: one headless Chromium per test session, a console served per test.

``chromium_session`` is Debian's Chromium driven by Selenium (tests/browser/chromium.py). Without it the
browser tests SKIP, saying what to install — unless ``STATEBOOK_REQUIRE_BROWSER=1`` or ``CI=true``: then a
missing browser FAILS them, as ``STATEBOOK_REQUIRE_PG=1`` does for PostgreSQL (.ci/run sets both).

``console`` (per test, on SQLite and on PostgreSQL through ``db_url``) opens a book on a server loop of its own
(tests/browser/live.py) and serves ``create_app(book, settings)`` on 127.0.0.1 when the scenario calls
:meth:`ServedConsole.start`, after it has set up what the settings name (an SMTP server, a channel). Users:
``ana`` (operator), ``vic`` (viewer), ``aude`` (viewer, the auditor); each one's password is ``PASSWORDS[name]``.

``STATEBOOK_SCREENSHOTS=1`` (``make screenshots``) makes :meth:`ServedConsole.screenshot` write docs/img/console-*.png;
otherwise it does nothing, so a test run never changes the tree.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .chromium import Browser, chromium, missing, need_browser, required
from .live import ServerLoop, reserve
from .scenes import SkippingClock

T = TypeVar("T")
SCREENSHOTS = os.environ.get("STATEBOOK_SCREENSHOTS") == "1"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img"
ROLES = {"ana": "operator", "vic": "viewer", "aude": "viewer"}
PASSWORDS = {name: f"{name}-browser-test-passw0rd" for name in ROLES}
LINK_KEY = "browser-test-link-key-0123456789abcdef"


@pytest.fixture(scope="session")
def chromium_session() -> Iterator[Browser]:
    need_browser(missing(), require=required(os.environ))
    with chromium() as browser:
        yield browser


@pytest.fixture
def browser(chromium_session: Browser) -> Iterator[Browser]:
    """The session's browser on a blank page with no cookies, left that way after the test."""
    chromium_session.reset()
    yield chromium_session
    with contextlib.suppress(Exception):  # a browser that died is reported by the test, not by its teardown
        chromium_session.reset()


@pytest.fixture(scope="session")
def password_hashes() -> dict[str, str]:
    from statebook.adapters.web.auth import hash_password

    return {name: hash_password(password) for name, password in PASSWORDS.items()}


class ServedConsole:
    """One scenario's book, console and server, on their own loop; the browser pointed at them."""

    def __init__(self, backend: str, db_url: str, folder: Path, browser: Browser, hashes: dict[str, str]) -> None:
        self.backend, self.db_url, self.folder, self.browser, self.hashes = backend, db_url, folder, browser, hashes
        self.loop = ServerLoop()
        self.clock = SkippingClock()
        self.book: Any = None
        self.settings: Any = None
        self.url = ""
        try:
            self.book = self.run(self._open())
        except BaseException:
            self.loop.close()
            raise

    async def _open(self) -> Any:
        from statebook.adapters.db import open_book, reset_schema

        book = await open_book(self.db_url, clock=self.clock)
        if self.backend == "postgres":
            await reset_schema(book.engine)  # the session's database outlives each test
        self.loop.on_close(book.engine.dispose)
        return book

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the console's loop (where the book lives) and return its result."""
        return self.loop.run(coro, timeout)

    def enter(self, context: contextlib.AbstractAsyncContextManager[T]) -> T:
        """Enter ``context`` on the console's loop for the rest of the test (an SMTP server, a worker)."""
        return self.loop.enter(context)

    def start(self, settings_toml: str = "") -> str:
        """Serve the console with ``settings_toml`` added to the scenario's settings; returns its address."""
        from statebook.adapters.settings import load_settings
        from statebook.adapters.web import create_app

        sock, self.url = reserve()
        key = self.folder / "link.key"
        key.write_text(LINK_KEY + "\n")
        users = "".join(f'{name} = {{ password_hash = "{self.hashes[name]}", role = "{role}" }}\n'
                        for name, role in ROLES.items())
        toml = self.folder / "statebook.toml"
        toml.write_text(f'db = "{self.db_url}"\n{settings_toml}\n'
                        f'[web]\npublic_url = "{self.url}"\nlink_key = {{ file = "{key}" }}\n'
                        f'[web.users]\n{users}')
        self.settings = load_settings(toml, environ={})
        try:
            app = create_app(self.book, self.settings)
            self.run(self.loop.serve(app, sock))
        except BaseException:
            sock.close()
            raise
        self.browser.base = self.url
        return self.url

    def sign_in(self, name: str) -> None:
        """Sign in as ``name`` through the sign-in form, as a person would."""
        b = self.browser
        b.reset()
        b.open("/sign-in")
        b.fill("name", name)
        b.fill("password", PASSWORDS[name])
        b.press("Sign in", within="main")
        b.wait(lambda: not b.path.startswith("/sign-in"), f"{name} signed in")

    def screenshot(self, name: str, *, start: str | None = None, tallest: int = 1600) -> None:
        """docs/img/console-NAME.png of the page shown (from the element ``start``, when given), under
        ``STATEBOOK_SCREENSHOTS=1`` and on SQLite only (one picture per name)."""
        if SCREENSHOTS and self.backend == "sqlite":
            self.browser.screenshot(IMAGES / f"console-{name}.png", start=start, tallest=tallest)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.browser.reset()  # closes the live stream before the server stops
        self.loop.close()


@pytest.fixture
def console(backend: str, db_url: str, tmp_path: Path, browser: Browser, password_hashes: dict[str, str]) -> Iterator[ServedConsole]:
    served = ServedConsole(backend, db_url, tmp_path, browser, password_hashes)
    try:
        yield served
    finally:
        served.close()
