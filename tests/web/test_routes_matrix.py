"""The route/role matrix: every route of ``create_app(...)`` walked as anonymous, viewer and operator, with GET
and POST; CSRF on every POST; hostile text inert on every page; no open redirect; the CSP on every response.

A route that is not in :data:`MATRIX` fails :func:`test_every_route_is_in_the_matrix`: whoever adds a route says
here who may use it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import sqlalchemy as sa
from starlette.routing import Match, Mount, Route

from statebook.adapters.db import open_book, reset_schema
from statebook.adapters.registry import builtin_registry
from statebook.adapters.web.app import CSP
from statebook.adapters.web.sessions import COOKIE
from statebook.lifecycle import Actor, Lifecycle, Reason, create, edges, managed_table
from statebook.lifecycle.facts import facts_table
from statebook.outbox import CallableTransport, deliver_due_dispatches, enqueue_dispatch, get_dispatch
from statebook.outbox.notifications import send_notification

from .conftest import PASSWORDS, ROLES, csrf_of, web_settings

ANYONE, LINK, PROVIDER, VIEWER, OPERATOR = "anyone", "link", "provider", "viewer", "operator"
MATRIX: dict[str, dict[str, str]] = {
    "/healthz": {"GET": ANYONE},
    "/static": {"GET": ANYONE},
    "/sign-in": {"GET": ANYONE, "POST": ANYONE},
    "/sign-out": {"POST": ANYONE},
    "/": {"GET": VIEWER},
    "/live": {"GET": VIEWER},
    "/lifecycles": {"GET": VIEWER},
    "/lifecycles/{entity_type}": {"GET": VIEWER},
    "/lifecycles/{entity_type}/graph": {"GET": VIEWER},
    "/lifecycles/{entity_type}/bulk/{action}": {"GET": OPERATOR, "POST": OPERATOR},
    "/e/{entity_type}/{entity_id}": {"GET": VIEWER},
    "/e/{entity_type}/{entity_id}/verify": {"GET": VIEWER},
    "/e/{entity_type}/{entity_id}/act/{action}": {"POST": OPERATOR},
    "/audit": {"GET": VIEWER},
    "/audit/verify": {"POST": VIEWER},
    "/r/{token}": {"GET": LINK, "POST": LINK},
    "/hooks/slack": {"POST": PROVIDER},
    "/hooks/pagerduty": {"POST": PROVIDER},
}
"""Each route (its path as Starlette formats it) and, per method, who may use it: anyone; the holder of a
signed link; a provider signing its request; a signed-in viewer (operators too); an operator only."""

WHO = ("anonymous", "viewer", "operator")
SCRIPT = "<script>alert(1)</script>"
HTML = '<b onmouseover="alert(2)">bold</b><img src=x onerror=alert(3)>'
JS_URL = "javascript:alert(4)"
HOSTILE = f"{SCRIPT}{HTML}{JS_URL}"
XSS = managed_table("web_xss_note", sa.Column("id", sa.String(255), primary_key=True),
                    sa.Column("title", sa.Text, nullable=False),
                    meta=sa.MetaData())  # not statebook's metadata: other tests compare that with the schema
NOTE = Lifecycle(entity_type="web_xss_note", table=XSS, statuses=("open", "closed"), initial={"open"},
                 terminal={"closed"}, edges=edges("open", "closed"), reason_prefixes={"web_xss_note"},
                 reasons={"web_xss_note.open.filed"})


@pytest.fixture
def settings(monkeypatch) -> Any:
    """Sign-in, responders' links and both providers' hooks configured: every route in its working form."""
    for name in ("LINK", "SLACK", "PAGERDUTY"):
        monkeypatch.setenv(f"STATEBOOK_TEST_{name}_SECRET", f"{name.lower()}-secret-for-the-matrix")
    return web_settings(public_url="http://console.test", link_key={"env": "STATEBOOK_TEST_LINK_SECRET"},
                        slack_signing_secret={"env": "STATEBOOK_TEST_SLACK_SECRET"},
                        pagerduty_signing_secret={"env": "STATEBOOK_TEST_PAGERDUTY_SECRET"})


@pytest.fixture
async def book(db_url, backend, clock):
    """A book whose registry also holds an application's lifecycle (its ids are any text)."""
    registry = builtin_registry(seal=False)
    registry.register(NOTE)
    registry.seal()
    opened = await open_book(db_url, clock=clock, registry=registry)
    try:
        if backend == "postgres":
            await reset_schema(opened.engine)
            async with opened.engine.begin() as conn:
                await conn.execute(sa.delete(XSS))
        yield opened
    finally:
        await opened.engine.dispose()


# -- requests straight to the app: a streaming page (server-sent events) answers with its first message ------
async def call(app: Any, method: str, path: str, *, query: str = "", cookie: str = "",
               form: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """(status, headers, body) of one request; a response still streaming after a moment is cut off there."""
    body = urlencode(form).encode() if form is not None else b""
    raw = [(b"host", b"console.test"), *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]
    if cookie:
        raw.append((b"cookie", cookie.encode()))
    if form is not None:
        raw += [(b"content-type", b"application/x-www-form-urlencoded"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": quote(path).encode(), "query_string": query.encode(), "root_path": "",
             "headers": raw, "client": ("127.0.0.1", 40000), "server": ("console.test", 80)}
    started: dict[str, Any] = {}
    chunks: list[bytes] = []
    ended, asked = asyncio.Event(), False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": body, "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                ended.set()

    task = asyncio.create_task(app(scope, receive, send))
    loop = asyncio.get_running_loop()
    deadline, streaming_since = loop.time() + 30, None
    while not ended.is_set() and not task.done() and loop.time() < deadline:
        await asyncio.wait([task], timeout=0.02)
        if started and streaming_since is None:
            streaming_since = loop.time()
        if streaming_since is not None and loop.time() - streaming_since > 0.5:
            break  # a stream (server-sent events): its first part is the answer
    ended.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    head = {k.decode().lower(): v.decode() for k, v in started.get("headers", [])}
    return started["status"], head, b"".join(chunks).decode(errors="replace")


class People:
    """A signed-in session (cookie and CSRF token) for each of viewer and operator; none for anonymous."""

    def __init__(self) -> None:
        self.cookies: dict[str, str] = {"anonymous": ""}
        self.tokens: dict[str, str] = {}

    async def sign_in(self, client: Any) -> None:
        self.tokens["anonymous"] = await csrf_of(client)
        self.cookies["anonymous"] = f"{COOKIE}={client.cookies.get(COOKIE)}"
        for role in ("viewer", "operator"):
            client.cookies.clear()
            name = ROLES[role]
            answer = await client.post("/sign-in", data={"name": name, "password": PASSWORDS[name],
                                                         "csrf_token": await csrf_of(client)})
            assert answer.status_code == 303
            self.tokens[role] = await csrf_of(client)
            self.cookies[role] = f"{COOKIE}={client.cookies.get(COOKIE)}"


def route_paths(app: Any) -> Iterator[tuple[str, Any]]:
    for route in app.routes:
        if isinstance(route, Mount):
            yield route.path, route
        elif isinstance(route, Route):
            yield re.sub(r"{(\w+):\w+}", r"{\1}", route.path), route


def methods_by_path(app: Any) -> dict[str, set[str]]:
    """Each path and the methods its routes take (one path may have a route per method)."""
    found: dict[str, set[str]] = {}
    for path, route in route_paths(app):
        taken = {"GET"} if isinstance(route, Mount) else set(route.methods or ()) - {"HEAD"}
        found.setdefault(path, set()).update(taken)
    return found


async def fact_count(book: Any) -> int:
    async with book.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(facts_table))).scalar_one()


async def _fail(deliver_to: str, payload: str) -> bool:
    return False


async def dead_dispatch(book: Any, key: str | None = None) -> str:
    """A dispatch whose only attempt failed (a dead letter: what retry and purge apply to)."""
    did = await enqueue_dispatch(book, kind="k", deliver_to="seat", max_attempts=1, dedup_key=key,
                                 body={"x": SCRIPT, "html": HTML, "url": JS_URL})
    await deliver_due_dispatches(book, transport=CallableTransport(_fail))
    assert (await get_dispatch(book, did)).status == "dead_letter"
    return did


async def seed(book: Any) -> dict[str, str]:
    """Entities holding hostile text: a dead dispatch (body, key), a notification (content, recipient), an
    application's entity whose id is the text itself."""
    did = await dead_dispatch(book, HOSTILE[:200])
    nid = (await send_notification(book, recipient=HOSTILE, content={"text": HOSTILE, "link": JS_URL},
                                   mode="guaranteed", channels=["email"])).id
    await create(book, "web_xss_note", values={"title": HOSTILE}, status="open", entity_id=HOSTILE,
                 reason=Reason("web_xss_note.open.filed", HOSTILE), actor=Actor("user", HOSTILE))
    return {"dispatch": did, "notification": nid, "web_xss_note": HOSTILE}


URL_ATTRIBUTES = {"href", "src", "action", "formaction", "hx-get", "hx-post", "data", "srcdoc", "xlink:href"}


def live_markup(page: str) -> list[str]:
    """What in ``page`` a browser would run: an inline script, an event handler attribute, a javascript: URL."""
    found: list[str] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            names = {name for name, _ in attrs}
            if tag == "script" and "src" not in names:
                found.append("an inline <script>")
            for name, value in attrs:
                if name.startswith("on"):
                    found.append(f"<{tag} {name}=...>")
                if name in URL_ATTRIBUTES and re.sub(r"\s", "", value or "").lower().startswith("javascript:"):
                    found.append(f"<{tag} {name}={value!r}>")

    Parser().feed(page)
    return found


def filled(path: str, values: dict[str, str]) -> str:
    return re.sub(r"{(\w+)}", lambda m: values[m.group(1)], path)


def probe(path: str, ids: dict[str, str], token: str) -> tuple[str, str, dict[str, str]]:
    """(the path filled with real values, a query, a form) for a request that the route would carry out."""
    values = {"entity_type": "dispatch", "entity_id": ids["dispatch"], "action": "retry", "token": "not-a-link"}
    query = "status=dead_letter" if "/bulk/" in path else ""
    target = "/static/console.css" if path == "/static" else filled(path, values)
    form = {"csrf_token": token, "reason": "matrix walk", "status": "dead_letter"}
    if path == "/sign-in":
        form.update(name="vic", password=PASSWORDS["vic"], next="/")
    return target, query, form


# -- the matrix ------------------------------------------------------------------------------------------------
async def test_every_route_is_in_the_matrix(app):
    """A route nobody put in the matrix fails here, and so does a matrix entry no route serves any more; a
    guarded endpoint's role is the matrix's."""
    gone = set(MATRIX) - set(methods_by_path(app))
    assert not gone, f"{sorted(gone)}: in MATRIX but served by no route (remove them, or the route came back?)"
    for path, methods in methods_by_path(app).items():
        assert path in MATRIX, f"{path}: add it to MATRIX in tests/web/test_routes_matrix.py (who may use it?)"
        assert methods == set(MATRIX[path]), f"{path}: methods {sorted(methods)} vs the matrix's {sorted(MATRIX[path])}"
    for path, route in route_paths(app):
        for method in ({"GET"} if isinstance(route, Mount) else set(route.methods or ()) - {"HEAD"}):
            need = MATRIX[path][method]
            role = getattr(getattr(route, "endpoint", None), "required_role", None)
            assert role == (need if need in (VIEWER, OPERATOR) else None), f"{method} {path}: guarded as {role}"


def expected(need: str, who: str, method: str, status: int, head: dict[str, str]) -> str | None:
    """Why ``status`` is wrong for ``who`` on a route ``need``-ing that, or None."""
    to_sign_in = status == 303 and head.get("location", "").startswith("/sign-in?next=")
    if need in (VIEWER, OPERATOR):
        if who == "anonymous":
            want = to_sign_in if method == "GET" else status == 401
        elif need == OPERATOR and who == "viewer":
            want = status == 403
        else:
            want = status in (200, 303) and not to_sign_in
    elif need == LINK:  # a link that is not one is refused alike whoever holds it
        want = status == 403
    elif need == PROVIDER:  # an unsigned request is refused alike whoever sends it
        want = status == 401
    else:
        want = status in (200, 303) and not to_sign_in
    return None if want else f"{status} {head.get('location', '')}"


async def test_each_route_answers_each_role_as_the_matrix_says(app, book, client):
    """Anonymous may use only sign-in, static files, healthz, responders' links and providers' hooks; a viewer
    reads; an operator reads and acts. A method a route does not take is 405. Every answer carries the CSP."""
    people = People()
    await people.sign_in(client)
    wrong = []
    ids = await seed(book)
    taken = methods_by_path(app)
    for path in taken:
        for method in ("GET", "POST"):
            for who in WHO:
                if method == "POST":  # a fresh dead letter: an operator's POST changes the one it was given
                    ids = {**ids, "dispatch": await dead_dispatch(book)}
                target, query, form = probe(path, ids, people.tokens[who])
                status, head, _ = await call(app, method, target, query=query, cookie=people.cookies[who],
                                             form=form if method == "POST" else None)
                assert head.get("content-security-policy") == CSP, f"{method} {path} as {who}: no CSP"
                assert "unsafe-inline" not in head["content-security-policy"]
                need = MATRIX.get(path, {}).get(method)
                if method not in taken[path]:
                    others = [p for p, r in route_paths(app) if p != path
                              and r.matches({"type": "http", "path": target, "root_path": "",
                                             "method": method})[0] != Match.NONE]
                    if not others and status != 405:
                        wrong.append(f"{method} {path} as {who}: {status}, not 405")
                    continue
                why = expected(need, who, method, status, head)
                if why:
                    wrong.append(f"{method} {path} as {who} (needs {need}): {why}")
    assert not wrong, "\n".join(wrong)


async def test_a_post_without_or_with_a_wrong_csrf_token_writes_nothing(app, book, client):
    """Every POST a signed-in person makes is refused (403) without the session's CSRF token or with another
    one, and writes nothing (facts counted before and after)."""
    people = People()
    await people.sign_in(client)
    for path, methods in methods_by_path(app).items():
        if "POST" not in methods or MATRIX.get(path, {}).get("POST") not in (ANYONE, VIEWER, OPERATOR):
            continue  # links and providers are authorised by their signature, not by a session
        for who in WHO:
            for token in (None, "forged", people.tokens["viewer" if who == "operator" else "operator"]):
                ids = {"dispatch": await dead_dispatch(book)}
                target, query, form = probe(path, ids, people.tokens[who])
                if token is None:
                    form.pop("csrf_token")
                else:
                    form["csrf_token"] = token
                before = await fact_count(book)
                status, head, _ = await call(app, "POST", target, query=query, cookie=people.cookies[who], form=form)
                assert status in (401, 403), f"POST {path} as {who} with CSRF token {token!r}: {status}"
                assert await fact_count(book) == before, f"POST {path} as {who} wrote without a CSRF token"
                assert (await get_dispatch(book, ids["dispatch"])).status == "dead_letter"


async def test_hostile_text_is_inert_on_every_page(app, book, client):
    """A payload holding <script>, HTML and a javascript: URL — in a dispatch's body and key, a notification's
    content and recipient, a reason, an entity's id, a filter, a flash message — is text on every page."""
    people = People()
    await people.sign_in(client)
    ids = await seed(book)
    operator = people.cookies["operator"]
    for did in (await dead_dispatch(book), ids["dispatch"]):  # an action, then a refusal, the payload as reason
        status, _, _ = await call(app, "POST", f"/e/dispatch/{did}/act/retry", cookie=operator,
                                  form={"csrf_token": people.tokens["operator"], "reason": HOSTILE})
        assert status in (303, 409)
    pages: list[tuple[str, str]] = []
    for path, methods in methods_by_path(app).items():
        if "GET" not in methods or path == "/static":
            continue
        for entity_type, entity_id in ids.items():
            values = {"entity_type": entity_type, "entity_id": entity_id, "action": "retry", "token": HOSTILE}
            for query in ("", urlencode({"text": HOSTILE, "flash": HOSTILE, "next": HOSTILE})):
                pages.append((filled(path, values), query))
    pages += [("/e/dispatch/" + HOSTILE, ""), ("/lifecycles/" + HOSTILE, ""), ("/sign-in", "next=" + quote(JS_URL))]
    shown = 0
    for target, query in pages:
        status, head, body = await call(app, "GET", target, query=query, cookie=operator)
        where = f"GET {target}?{query} ({status})"
        assert SCRIPT not in body, where
        assert not live_markup(body), f"{where}: {live_markup(body)}"
        shown += "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert shown, "no page showed the payload (as text): the walk proved nothing"
    if "/e/{entity_type}/{entity_id}" in methods_by_path(app):  # each entity's page shows it, as text
        for entity_type, entity_id in ids.items():
            status, _, body = await call(app, "GET", f"/e/{entity_type}/{entity_id}", cookie=operator)
            assert status == 200 and "&lt;script&gt;alert(1)&lt;/script&gt;" in body, entity_type
    status, _, body = await call(app, "POST", "/e/dispatch/" + HOSTILE + "/act/retry", cookie=operator,
                                 form={"csrf_token": people.tokens["operator"], "reason": HOSTILE})
    assert status == 409 and SCRIPT not in body and "&lt;script&gt;" in body


@pytest.mark.parametrize("target", ["//evil.example", "https://evil.example", "/\\evil", "/\\/evil.example",
                                    "javascript:alert(1)", "http:/evil.example", " //evil.example"])
async def test_sign_in_never_redirects_off_the_site(app, client, target):
    answer = await client.post("/sign-in", data={"name": "olga", "password": PASSWORDS["olga"], "next": target,
                                                 "csrf_token": await csrf_of(client)})
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    page = await client.get("/sign-in", params={"next": target})
    assert "evil.example" not in page.text and "javascript:" not in page.text


def matrix_table() -> str:
    """The matrix as a Markdown table (for the docs and the issue's closing note)."""
    lines = ["| route | GET | POST |", "| --- | --- | --- |"]
    for path, methods in MATRIX.items():
        lines.append(f"| `{path}` | {methods.get('GET', '–')} | {methods.get('POST', '–')} |")
    return "\n".join(lines)
