"""The lifecycle browser and the entity page over HTTP (adapters/web/browse.py, entity.py), on SQLite and
PostgreSQL: pages followed by their links, filters, an application's lifecycle, masking, the timeline with
hashes, the row as of a time, and the verify finding of a row edited with raw SQL."""

from __future__ import annotations

import html
import re

import pytest
import sqlalchemy as sa

from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import Reason, transition
from statebook.outbox import enqueue_dispatch
from statebook.lifecycle import Actor
from statebook.outbox.notifications import deliver_due_notifications, resolve_notification, send_notification
from statebook.outbox.notifications.scripted import ScriptedChannel
from statebook.scheduler import create_schedule

from .test_queries import TICKETS, WHO, app_registry, ticket

LINK = re.compile(r'<a rel="(next|prev)" href="([^"]+)"')
ROW_ID = re.compile(r'<a href="/e/web_ticket/([0-9a-f]{32})">')


@pytest.fixture
async def book(db_url, backend, clock):
    """The application's registry (the built-in lifecycles and ``web_ticket``): the console shows them all."""
    opened = await open_book(db_url, clock=clock, registry=app_registry())
    try:
        if backend == "postgres":
            await reset_schema(opened.engine)
            async with opened.engine.begin() as conn:
                await conn.execute(sa.delete(TICKETS))
        yield opened
    finally:
        await opened.engine.dispose()


def link(page: str, rel: str) -> str | None:
    found = dict(LINK.findall(page))
    return html.unescape(found[rel]) if rel in found else None


async def test_anonymous_is_sent_to_sign_in(client):
    answer = await client.get("/lifecycles/dispatch?status=pending")
    assert answer.status_code == 303 and answer.headers["location"].startswith("/sign-in?next=")


async def test_every_lifecycle_is_listed_with_counts_the_applications_included(client, sign_in, book):
    await sign_in("viewer")
    await ticket(book, "disk full")
    page = (await client.get("/lifecycles")).text
    for entity_type in ("web_ticket", "dispatch", "notification", "schedule", "schedule_run", "channel_attempt"):
        assert f'href="/lifecycles/{entity_type}"' in page
    assert 'href="/lifecycles/web_ticket?status=open">open 1</a>' in page


async def test_next_and_prev_links_walk_every_row_once(client, sign_in, book, clock):
    await sign_in("viewer")
    made = []
    for i in range(12):
        made.append(await ticket(book, f"t{i}"))
        clock.advance(1 if i % 2 else 0)
    seen, pages, url = [], [], "/lifecycles/web_ticket?limit=5"
    while url:
        page = (await client.get(url)).text
        pages.append(page)
        seen += ROW_ID.findall(page)
        url = link(page, "next")
    assert sorted(seen) == sorted(made) and len(seen) == 12 and len(pages) == 3
    back, url = [], link(pages[-1], "prev")
    while url:
        page = (await client.get(url)).text
        back = ROW_ID.findall(page) + back
        url = link(page, "prev")
    assert back == seen[:10]
    assert "limit=5" in link(pages[0], "next")


async def test_filters_are_get_parameters(client, sign_in, book):
    await sign_in("viewer")
    wanted = await ticket(book, "50%_off")
    other = await ticket(book, "5000ff")
    await transition(book, "web_ticket", other, "closed", expected="open", reason=Reason("ticket.closed.fixed"),
                     actor=WHO)
    assert ROW_ID.findall((await client.get("/lifecycles/web_ticket", params={"text": "%_"})).text) == [wanted]
    assert ROW_ID.findall((await client.get("/lifecycles/web_ticket?status=closed")).text) == [other]
    page = (await client.get("/lifecycles/web_ticket", params={"since": "2999-01-01T00:00:00"})).text
    assert ROW_ID.findall(page) == [] and "No web_ticket matches these filters" in page
    assert '<option value="closed">closed</option>' in page
    for bad in ("?status=gone", "?since=yesterday", "?after=nonsense", "?limit=0"):
        assert (await client.get(f"/lifecycles/web_ticket{bad}")).status_code == 400, bad
    assert (await client.get("/lifecycles/nope")).status_code == 404


async def test_pages_mask_secrets_and_render_markup_inert(client, sign_in, book):
    await sign_in("viewer")
    tid = await ticket(book, "<script>alert(1)</script> https://bob:hunter2@example.com/", api_token="s3cret")
    did = await enqueue_dispatch(book, kind="hook", deliver_to="https://u:pw@hooks.example/x?token=abc",
                                 body={"html": "<b>bold</b>", "href": "javascript:alert(1)"}, ack_required=True)
    for url in ("/lifecycles/web_ticket", f"/e/web_ticket/{tid}", "/lifecycles/dispatch", f"/e/dispatch/{did}"):
        page = (await client.get(url)).text
        for secret in ("hunter2", "s3cret", "pw@", "token=abc"):
            assert secret not in page, (url, secret)
        assert "<script>alert" not in page and "<b>bold" not in page and 'href="javascript' not in page


async def test_the_entity_page_shows_history_with_hashes_and_the_row_as_of(client, sign_in, book, clock):
    await sign_in("viewer")
    tid = await ticket(book, "disk full")
    made = clock.now()
    clock.advance(60)
    await transition(book, "web_ticket", tid, "closed", expected="open", reason=Reason("ticket.closed.fixed", "freed"),
                     actor=WHO)
    page = (await client.get(f"/e/web_ticket/{tid}")).text
    hashes = re.findall(r"hash ([0-9a-f]{64})<br>prev ([0-9a-f]{64}|\(genesis\))", page)
    assert len(hashes) == 2 and hashes[0][1] == "(genesis)" and hashes[1][1] == hashes[0][0]
    assert "ticket.closed.fixed</code>: freed" in page and "<b>user</b> ana" in page
    assert "verified</span> 2 facts" in page
    then = (await client.get(f"/e/web_ticket/{tid}", params={"as_of": str(made + 1)})).text
    assert "as of" in then and "changed since" in then
    before = (await client.get(f"/e/web_ticket/{tid}", params={"as_of": "1970-01-02T00:00:00"})).text
    assert "the entity did not exist" in before
    assert (await client.get(f"/e/web_ticket/{tid}?as_of=soon")).status_code == 400
    assert (await client.get("/e/web_ticket/missing")).status_code == 404
    assert (await client.get("/e/nope/x")).status_code == 404


async def test_a_raw_sql_edit_shows_its_verify_finding(client, sign_in, book):
    await sign_in("viewer")
    tid = await ticket(book, "disk full")
    async with book.engine.begin() as conn:
        await conn.execute(sa.update(TICKETS).where(TICKETS.c.id == tid).values(name="nothing happened"))
    page = (await client.get(f"/e/web_ticket/{tid}")).text
    assert "verify found 1 problem" in page and "row_mismatch" in page
    full = await client.get(f"/e/web_ticket/{tid}/verify")
    assert full.status_code == 200 and "<h2>History</h2>" in full.text and "row_mismatch" in full.text
    fragment = await client.get(f"/e/web_ticket/{tid}/verify", headers={"HX-Request": "true"})
    assert fragment.text.lstrip().startswith('<section id="verify"') and "row_mismatch" in fragment.text
    assert "<html" not in fragment.text
    assert (await client.get("/e/web_ticket/missing/verify", headers={"HX-Request": "true"})).status_code == 404


async def test_list_rows_and_entity_pages_leave_room_for_actions(client, sign_in, book):
    await sign_in("operator")
    await ticket(book, "disk full")
    page = (await client.get("/lifecycles/web_ticket")).text
    assert '<div class="actions" id="actions-1"></div>' in page


async def test_a_notification_and_a_schedule_show_their_parts(client, sign_in, book, clock):
    await sign_in("viewer")
    accepted = await send_notification(book, recipient="ops", content={"text": "disk"}, mode="guaranteed",
                                       channels=["email"])
    page = (await client.get(f"/e/notification/{accepted.id}")).text
    assert "<h2>Delivery</h2>" in page and "obligation owner</th><td>itself" in page and "No channel attempt yet" in page
    for _ in range(4):
        await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["reject"])}, deadline=0.5)
        clock.advance(3600)
    page = (await client.get(f"/e/notification/{accepted.id}")).text
    assert "<h3>Cycle 1</h3>" in page and page.count(">rejected</a>") == 3 and "a replay would be accepted now" in page
    await resolve_notification(book, accepted.id, reason="recipient left", actor=Actor("operator", "olga"))
    assert "blocked: <code>resolved</code>" in (await client.get(f"/e/notification/{accepted.id}")).text
    schedule = await create_schedule(book, {"name": "nightly", "trigger_type": "interval", "interval_sec": 3600,
                                            "action_kind": "command", "action_command": "/bin/true"})
    page = (await client.get(f"/e/schedule/{schedule.id}")).text
    assert "<h2>Runs</h2>" in page and "No run yet" in page


async def test_an_id_holding_a_slash_has_its_page(client, sign_in, book):
    await sign_in("viewer")
    await ticket(book, "shared", id="team/a b")
    listing = (await client.get("/lifecycles/web_ticket")).text
    assert 'href="/e/web_ticket/team%2Fa%20b"' in listing
    page = await client.get("/e/web_ticket/team%2Fa%20b")
    assert page.status_code == 200 and "verified</span> 1 fact" in page.text
    fragment = await client.get("/e/web_ticket/team%2Fa%20b/verify", headers={"HX-Request": "true"})
    assert "verified" in fragment.text
