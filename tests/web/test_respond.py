"""The responder's page (adapters/web/respond.py): a link from a delivered notification shows it and answers
it, by the response lifecycle's rules said in words; a bad link is a 403 that writes nothing (docs/console.md,
"Responders")."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import sqlalchemy as sa

from statebook.lifecycle import Actor, history
from statebook.lifecycle.facts import facts_table
from statebook.outbox.notifications import (
    ack_notification, deliver_due_notifications, get_response, send_notification,
)
from statebook.outbox.notifications.responses import expire_responses
from statebook.outbox.notifications.scripted import ScriptedChannel

from .conftest import web_settings

KEY_VAR = "RESPOND_TEST_LINK_KEY"
KEY = "respond-test-LINK-key-0123456789abcdef"
PUBLIC = "http://book.example.org"  # http: the test client signs in over http (a Secure cookie would not come back)
EVIL = {"title": "<script>alert(1)</script>", "body": "<b>bold</b> <a href=\"javascript:alert(2)\">x</a>",
        "runbook": "javascript:alert(3)", "html": "<img src=x onerror=alert(4)>"}


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(KEY_VAR, KEY)
    return web_settings(public_url=PUBLIC, link_key={"env": KEY_VAR})


async def delivered(book: Any, app: Any, *, recipient: str = "alice", timeout: float | None = 600,
                    content: dict | None = None) -> tuple[str, dict[str, str]]:
    """A notification delivered by a scripted email channel with the console's link hook: its id and the
    path of each link its message carried."""
    accepted = await send_notification(book, recipient=recipient, content=content or {"title": "disk full",
                                       "body": "/var is at 97%"}, mode="guaranteed", channels=["email"],
                                       response_timeout=timeout)
    email = ScriptedChannel("email", ["success"])
    await deliver_due_notifications(book, {"email": email}, deadline=2.0, links=app.state.console.links.links)
    [sent] = email.effects
    assert set(sent.links) == {"acked", "dismissed"} and all(u.startswith(PUBLIC + "/r/") for u in sent.links.values())
    return accepted.id, {action: urlsplit(url).path for action, url in sent.links.items()}


async def facts(book: Any) -> int:
    async with book.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(facts_table))).scalar()


def words(page: httpx.Response) -> str:
    return " ".join(page.text.split())


async def test_opening_a_link_shows_the_notification_and_writes_nothing(book, app, client: httpx.AsyncClient):
    nid, links = await delivered(book, app)
    before = await facts(book)
    for _ in range(2):  # a mail scanner, then the person
        page = await client.get(links["acked"])
        assert page.status_code == 200
    text = words(page)
    assert "disk full" in text and "/var is at 97%" in text and "alice" in text
    assert "Waiting for an answer until" in text and ">Acknowledge</button>" in text
    assert 'method="post"' in page.text and "csrf_token" not in page.text.split("<main>")[1]
    assert await facts(book) == before and (await get_response(book, nid)).status == "pending"
    assert ">Dismiss</button>" in words(await client.get(links["dismissed"]))


async def test_the_button_acknowledges_as_the_links_recipient_and_a_repeat_sees_the_original(book, app, client, clock):
    nid, links = await delivered(book, app)
    clock.advance(30)
    answered = await client.post(links["acked"])
    assert answered.status_code == 200
    assert "Thank you: you acknowledged this notification at" in words(answered)
    response = await get_response(book, nid)
    assert (response.status, response.responder) == ("acked", "recipient:alice")
    [fact] = [f for f in await history(book, "notification_response", nid) if f.status == "acked"]
    assert (fact.actor_type, fact.actor_id) == ("recipient", "alice")
    written = await facts(book)
    clock.advance(30)
    again = await client.post(links["acked"])
    assert again.status_code == 200 and "You had already acknowledged this notification" in words(again)
    assert await facts(book) == written
    assert "You acknowledged this notification at" in words(await client.get(links["acked"]))


async def test_the_other_answer_sees_the_conflict_and_who_answered_first(book, app, client):
    nid, links = await delivered(book, app)
    assert (await client.post(links["dismissed"])).status_code == 200
    written = await facts(book)
    page = await client.get(links["acked"])
    assert "already dismissed by alice (recipient)" in words(page) and "<button" not in page.text.split("<main>")[1]
    conflict = await client.post(links["acked"])
    assert conflict.status_code == 409
    assert "Your answer was not recorded: this notification was already dismissed by alice (recipient)" in words(conflict)
    assert await facts(book) == written and (await get_response(book, nid)).status == "dismissed"


async def test_an_answer_by_another_actor_first_is_a_conflict_that_names_them(book, app, client):
    """Someone else answered first (an operator through the API or the CLI): the link's holder sees who and
    when, and their answer is not recorded (N33)."""
    nid, links = await delivered(book, app)
    await ack_notification(book, nid, actor=Actor("operator", "olga"))
    written = await facts(book)
    assert "already acknowledged by olga (operator)" in words(await client.get(links["acked"]))
    page = await client.post(links["acked"])
    assert page.status_code == 409 and "already acknowledged by olga (operator)" in words(page)
    assert await facts(book) == written and (await get_response(book, nid)).responder == "operator:olga"


async def test_after_the_deadline_the_page_says_it_timed_out(book, app, client, clock):
    nid, _ = await delivered(book, app)
    signer = app.state.console.links
    late = urlsplit(signer.url(signer.token(nid, "alice", "acked", expires=clock.now() + 10_000))).path
    clock.advance(601)
    before = await facts(book)
    posted = await client.post(late)
    assert posted.status_code == 409 and "the time to answer ran out at" in words(posted)
    assert await facts(book) == before
    await expire_responses(book)
    assert "the notification timed out without an answer" in words(await client.get(late))


async def test_an_expired_link_is_a_403_that_says_so_and_how_it_ended(book, app, client, clock):
    nid, links = await delivered(book, app)
    clock.advance(601)  # the link's expiry is the response deadline
    await expire_responses(book)
    before = await facts(book)
    for method in ("GET", "POST"):
        page = await client.request(method, links["acked"])
        assert page.status_code == 403
        assert "This link has expired." in words(page) and "Nothing was recorded." in words(page)
        assert "timed out at" in words(page) and "disk full" not in page.text
    assert await facts(book) == before


def retoken(path: str, **changes: Any) -> str:
    token = path.rsplit("/", 1)[1]
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    fields, mac = json.loads(raw[:-32]), raw[-32:]
    for index, value in changes.items():
        fields[int(index[1:])] = value
    payload = json.dumps(fields, separators=(",", ":")).encode()
    return "/r/" + base64.urlsafe_b64encode(payload + mac).rstrip(b"=").decode()


@pytest.mark.parametrize("change", [{"f1": "0" * 26}, {"f2": "mallory"}, {"f3": "dismissed"}, {"f4": 4_000_000_000}],
                         ids=["id", "recipient", "action", "expiry"])
async def test_a_tampered_link_is_a_403_and_writes_nothing(book, app, client, change):
    nid, links = await delivered(book, app)
    before = await facts(book)
    forged = retoken(links["acked"], **change)
    for method in ("GET", "POST"):
        page = await client.request(method, forged)
        assert page.status_code == 403 and "This link is not valid" in words(page) and "disk full" not in page.text
    for garbage in ("/r/x", "/r/" + "A" * 200, "/r/%00%01"):
        assert (await client.post(garbage)).status_code == 403
    assert await facts(book) == before and (await get_response(book, nid)).status == "pending"


async def test_a_foreign_link_is_a_403_and_writes_nothing(book, app, client, clock):
    nid, _ = await delivered(book, app)
    signer = app.state.console.links
    before = await facts(book)
    for link in (signer.links(nid, "mallory")["acked"], signer.links("n" * 26, "alice")["acked"]):
        for method in ("GET", "POST"):
            page = await client.request(method, urlsplit(link).path)
            assert page.status_code == 403 and "does not belong to a notification" in words(page)
    assert await facts(book) == before and (await get_response(book, nid)).status == "pending"


async def test_only_the_path_authorises_a_post(book, app, client, sign_in):
    """A signed-in operator's session, a form field or a header never stands in for the link."""
    nid, links = await delivered(book, app)
    await sign_in("operator")
    token = links["acked"].rsplit("/", 1)[1]
    before = await facts(book)
    for answer in (await client.post("/r/x", data={"token": token}), await client.post("/r/x", headers={"X-Link": token})):
        assert answer.status_code == 403
    assert await facts(book) == before
    assert (await client.post(links["acked"])).status_code == 200
    assert (await get_response(book, nid)).responder == "recipient:alice"


async def test_a_notification_that_waits_for_no_answer_says_so(book, app, client):
    nid, links = await delivered(book, app, timeout=None)
    assert "does not wait for an answer" in words(await client.get(links["acked"]))
    before = await facts(book)
    page = await client.post(links["acked"])
    assert page.status_code == 409 and "does not wait for an answer" in words(page)
    assert await facts(book) == before


async def test_the_content_renders_inert(book, app, client):
    _, links = await delivered(book, app, content=EVIL)
    page = (await client.get(links["acked"])).text
    body = page.split("<main>")[1]
    for raw in ("<script>alert", "<b>bold</b>", "<img src=x", 'href="javascript:'):
        assert raw not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "javascript:alert(3)" in body
    assert page.count("<script") == page.count('<script src="')


async def test_without_a_public_url_links_are_disabled(book, monkeypatch):
    from statebook.adapters.web import create_app

    application = create_app(book, web_settings())
    assert application.state.console.links is None
    transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as c:
        page = await c.get("/r/anything")
    assert page.status_code == 403 and "not enabled" in words(page)


async def test_the_daemons_notification_worker_makes_the_links_this_console_accepts(book, app, client):
    from statebook.adapters.channels.configure import Built
    from statebook.adapters.daemon import NotificationDelivery

    worker = NotificationDelivery(book, app.state.console.settings, Built()).worker
    accepted = await send_notification(book, recipient="alice", content={"text": "disk full"}, mode="guaranteed",
                                       channels=["email"], response_timeout=600)
    email = ScriptedChannel("email", ["success"])
    await deliver_due_notifications(book, {"email": email}, deadline=2.0, links=worker.links)
    answered = await client.post(urlsplit(email.effects[0].links["dismissed"]).path)
    assert answered.status_code == 200 and (await get_response(book, accepted.id)).status == "dismissed"
