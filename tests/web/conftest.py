"""Fixtures of the console's tests: an app over the ``book`` fixture (SQLite and PostgreSQL), an httpx
client speaking ASGI to it, and people to sign in as.

>>> async def test_x(client, sign_in):                                      # doctest: +SKIP
...     await sign_in("operator")
...     assert (await client.get("/")).status_code == 200
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

PASSWORDS = {"olga": "operator-pass", "vic": "viewer-pass"}
ROLES = {"operator": "olga", "viewer": "vic"}
CSRF = re.compile(r'name="csrf-token" content="([^"]+)"')


@functools.cache
def password_hashes() -> dict[str, str]:
    from statebook.adapters.web.auth import hash_password

    return {name: hash_password(password) for name, password in PASSWORDS.items()}


def web_settings(**web: Any) -> Any:
    """Settings with the two test users (olga: operator, vic: viewer) and ``web`` overrides."""
    from statebook.adapters.settings import Settings

    users = {"olga": {"password_hash": password_hashes()["olga"], "role": "operator"},
             "vic": {"password_hash": password_hashes()["vic"], "role": "viewer"}}
    return Settings(web={"users": users, **web})


@pytest.fixture
def settings() -> Any:
    return web_settings()


@pytest.fixture
async def app(book: Any, settings: Any) -> AsyncIterator[Any]:
    from statebook.adapters.web import create_app

    application = create_app(book, settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as c:
        yield c


async def csrf_of(client: httpx.AsyncClient, path: str = "/sign-in") -> str:
    """The CSRF token the page at ``path`` carries for this client's session."""
    page = await client.get(path)
    found = CSRF.search(page.text)
    assert found, f"{path} has no csrf-token meta ({page.status_code})"
    return found.group(1)


@pytest.fixture
def sign_in(client: httpx.AsyncClient) -> Callable[[str], Awaitable[str]]:
    """``await sign_in("operator" | "viewer")`` signs the client in; returns the session's CSRF token."""

    async def go(role: str) -> str:
        name = ROLES[role]
        token = await csrf_of(client)
        answer = await client.post("/sign-in", data={"name": name, "password": PASSWORDS[name], "next": "/",
                                                     "csrf_token": token})
        assert answer.status_code == 303, answer.text
        return await csrf_of(client, "/sign-in")

    return go
