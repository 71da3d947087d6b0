"""The console's frame: sign-in, sessions, roles, CSRF, safe redirects, local mode, proxy sign-in and the
headers every response carries (specs/console.md W1-W8)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.responses import PlainTextResponse

from statebook.adapters.web.app import CSP
from statebook.adapters.web.auth import requires, safe_next
from statebook.adapters.web import sessions

from .conftest import csrf_of, web_settings


def add_probe_routes(app: Any) -> None:
    """Two endpoints behind each role, to test the guard alone."""

    @requires("viewer")
    async def read(request: Any) -> PlainTextResponse:
        return PlainTextResponse(f"read by {request.state.identity.name}")

    @requires("operator")
    async def act(request: Any) -> PlainTextResponse:
        return PlainTextResponse(f"acted by {request.state.identity.name}")

    app.router.add_route("/probe/read", read, methods=["GET"])
    app.router.add_route("/probe/act", act, methods=["GET", "POST"])


async def test_every_response_carries_the_security_headers(client: httpx.AsyncClient) -> None:
    for path in ("/sign-in", "/healthz", "/static/console.css", "/no-such-page"):
        answer = await client.get(path)
        assert answer.headers["content-security-policy"] == CSP, path
        assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
    assert (await client.get("/no-such-page")).status_code == 404


async def test_htmx_ships_in_the_wheel_and_pages_load_nothing_from_elsewhere(client: httpx.AsyncClient) -> None:
    js = await client.get("/static/htmx.min.js")
    assert js.status_code == 200 and "htmx" in js.text[:200]
    page = (await client.get("/sign-in")).text
    assert "http://" not in page and "https://" not in page
    assert "<script>" not in page and " on" + "click=" not in page


async def test_sign_in_sets_a_signed_http_only_cookie_and_redirects(client: httpx.AsyncClient, app: Any) -> None:
    add_probe_routes(app)
    token = await csrf_of(client)
    answer = await client.post("/sign-in", data={"name": "olga", "password": "operator-pass",
                                                 "next": "/probe/read", "csrf_token": token})
    assert answer.status_code == 303 and answer.headers["location"] == "/probe/read"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    assert (await client.get("/probe/read")).text == "read by olga"


@pytest.mark.parametrize("name,password", [("olga", "wrong"), ("nobody", "operator-pass"), ("", "")])
async def test_a_wrong_password_or_unknown_name_is_refused_alike(client: httpx.AsyncClient, name: str,
                                                                 password: str) -> None:
    token = await csrf_of(client)
    answer = await client.post("/sign-in", data={"name": name, "password": password, "csrf_token": token})
    assert answer.status_code == 401 and "unknown name or wrong password" in answer.text
    assert "statebook_session" not in answer.headers.get("set-cookie", "") or "olga" not in answer.text


async def test_sign_in_without_or_with_a_wrong_csrf_token_is_refused(client: httpx.AsyncClient) -> None:
    await csrf_of(client)
    for data in ({"name": "olga", "password": "operator-pass"},
                 {"name": "olga", "password": "operator-pass", "csrf_token": "0" * 64}):
        answer = await client.post("/sign-in", data=data)
        assert answer.status_code == 403 and "CSRF" in answer.text


async def test_roles_anonymous_viewer_operator(client: httpx.AsyncClient, app: Any, sign_in: Any) -> None:
    add_probe_routes(app)
    answer = await client.get("/probe/read?x=1")
    assert answer.status_code == 303 and answer.headers["location"] == "/sign-in?next=%2Fprobe%2Fread%3Fx%3D1"
    assert (await client.post("/probe/act")).status_code == 401
    await sign_in("viewer")
    assert (await client.get("/probe/read")).text == "read by vic"
    refused = await client.get("/probe/act")
    assert refused.status_code == 403 and "operator role" in refused.text
    await sign_in("operator")
    assert (await client.get("/probe/act")).text == "acted by olga"


async def test_sign_out_ends_the_session(client: httpx.AsyncClient, app: Any, sign_in: Any) -> None:
    add_probe_routes(app)
    token = await sign_in("viewer")
    assert (await client.post("/sign-out", data={})).status_code == 403  # no CSRF token
    assert (await client.post("/sign-out", data={"csrf_token": token})).status_code == 303
    assert (await client.get("/probe/read")).status_code == 303


async def test_a_forged_or_expired_session_is_anonymous(client: httpx.AsyncClient, app: Any, sign_in: Any,
                                                       clock: Any, book: Any) -> None:
    add_probe_routes(app)
    await sign_in("viewer")
    cookie = client.cookies["statebook_session"]
    body, mac = cookie.split(".")
    forged = sessions.encode(sessions.Session("vic", "operator", 1e12, "x"), b"not the key")
    for bad in (forged, body + "." + mac[::-1], "garbage", ""):
        client.cookies.set("statebook_session", bad)
        assert (await client.get("/probe/read")).status_code == 303, bad
    client.cookies.set("statebook_session", cookie)
    assert (await client.get("/probe/read")).status_code == 200
    clock.advance(app.state.console.web.session_seconds + 1)
    assert (await client.get("/probe/read")).status_code == 303


@pytest.mark.parametrize("target,expected", [
    ("/e/dispatch/1?x=2", "/e/dispatch/1?x=2"), ("//evil.example/", "/"), ("https://evil.example", "/"),
    ("/\\evil.example", "/"), ("javascript:alert(1)", "/"), ("/ok\r\nSet-Cookie: x", "/"), ("", "/"), (None, "/"),
    ("/\t/evil.example", "/"),
])
def test_redirects_after_sign_in_stay_on_this_site(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected


async def test_sign_in_refuses_an_open_redirect(client: httpx.AsyncClient) -> None:
    token = await csrf_of(client)
    answer = await client.post("/sign-in", data={"name": "olga", "password": "operator-pass",
                                                 "next": "//evil.example/x", "csrf_token": token})
    assert answer.status_code == 303 and answer.headers["location"] == "/"


async def test_local_mode_serves_loopback_as_operator_and_refuses_others(book: Any) -> None:
    from statebook.adapters.settings import Settings
    from statebook.adapters.web import create_app

    app = create_app(book, Settings())
    add_probe_routes(app)
    local = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 1)), base_url="http://t")
    remote = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.1.2.3", 1)), base_url="http://t")
    async with local, remote:
        assert (await local.get("/probe/act")).text.startswith("acted by ")
        assert "Local mode" in (await local.get("/sign-in")).text
        refused = await remote.get("/probe/read")
        assert refused.status_code == 403 and "only this machine" in refused.text


async def test_a_proxy_header_counts_only_from_a_trusted_address(book: Any) -> None:
    from statebook.adapters.web import create_app

    settings = web_settings(proxy={"user_header": "X-User", "role_header": "X-Role", "trusted": ["10.0.0.5"]})
    app = create_app(book, settings)
    add_probe_routes(app)
    headers = {"X-User": "pat", "X-Role": "operator"}
    trusted = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.5", 1)), base_url="http://t")
    other = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.6", 1)), base_url="http://t")
    async with trusted, other:
        assert (await trusted.get("/probe/act", headers=headers)).text == "acted by pat"
        assert (await trusted.get("/probe/act", headers={"X-User": "pat", "X-Role": "root"})).status_code == 403
        assert (await other.get("/probe/act", headers=headers)).status_code == 303


async def test_the_cookie_is_secure_behind_an_https_public_url(book: Any, monkeypatch: Any) -> None:
    from statebook.adapters.web import create_app

    monkeypatch.setenv("TEST_LINK_KEY", "k" * 32)
    app = create_app(book, web_settings(public_url="https://console.example", link_key={"env": "TEST_LINK_KEY"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://console.example") as c:
        assert "Secure" in (await c.get("/sign-in")).headers["set-cookie"]


def test_public_url_without_a_link_key_is_refused() -> None:
    with pytest.raises(Exception, match="link_key"):
        web_settings(public_url="https://console.example")


def test_a_plain_password_is_refused_as_a_hash() -> None:
    with pytest.raises(Exception, match="argon2"):
        web_settings(users={"x": {"password_hash": "hunter2"}})


async def test_a_flash_message_shows_only_when_the_console_signed_it(client: httpx.AsyncClient, app: Any,
                                                                    sign_in: Any) -> None:
    """A crafted link cannot put its own words in the console's status box (``?flash=`` unsigned)."""
    from starlette.requests import Request

    from statebook.adapters.web.pages import flash_query

    await sign_in("viewer")
    crafted = await client.get("/sign-in?flash=Your+session+expired%2C+sign+in+at+evil.example")
    assert "evil.example" not in crafted.text
    scope = {"type": "http", "app": app, "headers": [], "query_string": b"", "method": "GET", "path": "/"}
    signed = flash_query(Request(scope), "retried dispatch d1")
    shown = await client.get(f"/sign-in?{signed}")
    assert 'role="status">retried dispatch d1<' in shown.text
    tampered = signed.replace("d1", "d2")
    assert "retried dispatch" not in (await client.get(f"/sign-in?{tampered}")).text
